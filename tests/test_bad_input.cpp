// Bad input raises shardtensor::Error naming the values, on every rank, and no rank hangs
// (a hang would show as a ctest timeout).

#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

TEST_CASE("more ranks than cells along a dim", "[errors]") {
  const Communicator comm;
  const int p = comm.size();
  const std::string message = test::error_message_of([&] {
    Decomposition::automatic({Index(p) - 1 + (p == 1), 1}, p + (p == 1));
  });
  CHECK(test::ranks_with_error(message) == p);
  CHECK_THAT(message, Contains("cannot split"));
  const std::string explicit_grid = test::error_message_of([&] {
    Decomposition({3, 3}, {4 * p, 1});
  });
  CHECK(test::ranks_with_error(explicit_grid) == p);
  CHECK_THAT(explicit_grid, Contains("more ranks than cells: " + std::to_string(4 * p) +
                                     " ranks along dim 0 of extent 3"));
}

TEST_CASE("a process grid that does not multiply to the rank count", "[errors]") {
  const Communicator comm;
  const Decomposition d({16, 16}, {comm.size() + 1, 1});
  const std::string message = test::error_message_of([&] {
    ShardTensor<float> t(d, std::min(comm.rank(), d.nranks() - 1), 1, 1);
    HaloExchange<float> halo(comm, t);
  });
  CHECK(test::ranks_with_error(message) == comm.size());
  CHECK_THAT(message, Contains("communicator has " + std::to_string(comm.size()) + " ranks") &&
                          Contains("has " + std::to_string(comm.size() + 1)));
}

TEST_CASE("a halo wider than a neighbour's extent", "[errors]") {
  const Communicator comm;
  // Every rank owns 2 cells along x; a width-3 halo would reach two shards deep.
  const Decomposition d({2 * Index(comm.size()), 8}, {comm.size(), 1}, {true, false});
  const std::string message = test::error_message_of([&] {
    ShardTensor<double> t(d, comm.rank(), 1, 1, GhostWidths::uniform(3, 2));
    HaloExchange<double> halo(comm, t);
  });
  CHECK(test::ranks_with_error(message) == comm.size());
  CHECK_THAT(message,
             Contains("HaloExchange: halo width 3 exceeds local extent 2 on rank 0 (dim 0)"));
}

TEST_CASE("mismatched shapes between ranks", "[errors]") {
  const Communicator comm;
  if (comm.size() < 2) return;
  const Decomposition d = Decomposition::automatic({12, 12}, comm.size());
  const Index channels = comm.rank() == 1 ? 5 : 4;  // one rank disagrees
  const std::string halo_message = test::error_message_of([&] {
    ShardTensor<float> t(d, comm.rank(), 1, channels, GhostWidths::uniform(1, 2));
    HaloExchange<float> halo(comm, t);
  });
  CHECK(test::ranks_with_error(halo_message) == comm.size());
  CHECK_THAT(halo_message, Contains("HaloExchange: field layout") &&
                               Contains("differs between ranks") && Contains("rank 1 has (1,5,"));
  const std::string gather_message = test::error_message_of([&] {
    ShardTensor<float> t(d, comm.rank(), 1, channels);
    gather_to_root(comm, t);
  });
  CHECK(test::ranks_with_error(gather_message) == comm.size());
  CHECK_THAT(gather_message, Contains("gather_to_root: field layout"));
}

TEST_CASE("a field that does not match the plan or the decomposition", "[errors]") {
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({12, 10}, comm.size());
  ShardTensor<double> t(d, comm.rank(), 1, 2, GhostWidths::uniform(1, 2));
  HaloExchange<double> halo(comm, t);
  ShardTensor<double> other(d, comm.rank(), 1, 3, GhostWidths::uniform(1, 2));
  CHECK_THROWS_WITH(halo.exchange(other),
                    Contains("HaloExchange::start: field (batch 1, channels 3") &&
                        Contains("does not match the plan (batch 1, channels 2"));
  CHECK_THROWS_WITH(halo.finish(t), Contains("HaloExchange::finish: no exchange in progress"));
  halo.start(t);
  CHECK_THROWS_WITH(halo.start(t), Contains("an exchange is already in progress"));
  ShardTensor<double> same_layout(d, comm.rank(), 1, 2, GhostWidths::uniform(1, 2));
  CHECK_THROWS_WITH(halo.finish(same_layout), Contains("another field than the one its start()"));
  halo.finish(t);

  // Scatter of a whole field whose shape disagrees with the decomposition: root's error,
  // raised on every rank.
  const std::string message = test::error_message_of([&] {
    FieldView<double> wrong;
    if (comm.rank() == 0) wrong = FieldView<double>("wrong", 1, 2, 12, 9, 1);
    scatter_from_root(comm, wrong, d);
  });
  CHECK(test::ranks_with_error(message) == comm.size());
  CHECK_THAT(message, Contains("scatter_from_root: field of shape (1, 2, 12, 9, 1)"));

  // Redistribute onto a decomposition of another field.
  const std::string redistribute_message = test::error_message_of([&] {
    redistribute(comm, t, Decomposition::automatic({12, 11}, comm.size()));
  });
  CHECK(test::ranks_with_error(redistribute_message) == comm.size());
  CHECK_THAT(redistribute_message, Contains("covers another field"));
}
