// Collectives on Views against serial results computed from every rank's known inputs.

#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace shardtensor;

namespace {
/// The value rank r contributes at position i (known to every rank, so each can compute
/// the serial answer).
double contribution(int r, std::size_t i) {
  return hashed_uniform(r + 1, i);
}
}  // namespace

TEMPLATE_TEST_CASE("allreduce sum, max and min", "[collectives]", float, double) {
  const Communicator comm;
  const std::size_t n = 37;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    Kokkos::View<TestType*, Kokkos::HostSpace> v("v", n);
    for (std::size_t i = 0; i < n; ++i) v(i) = TestType(contribution(comm.rank(), i));
    allreduce(comm, v, op);
    for (std::size_t i = 0; i < n; ++i) {
      // Sum in rank order in double, then compare with the MPI result within rounding.
      double want = double(TestType(contribution(0, i))), sum = 0;
      for (int r = 0; r < comm.size(); ++r) {
        const double c = double(TestType(contribution(r, i)));
        sum += c;
        if (op == ReduceOp::max) want = std::max(want, c);
        if (op == ReduceOp::min) want = std::min(want, c);
      }
      if (op == ReduceOp::sum) {
        CHECK(double(v(i)) == Approx(sum).epsilon(1e-5).margin(1e-6));
      } else {
        CHECK(double(v(i)) == want);
      }
    }
  }
}

TEST_CASE("allgather and allgatherv concatenate in rank order", "[collectives]") {
  const Communicator comm;
  const int p = comm.size();
  Kokkos::View<double*, Kokkos::HostSpace> mine("mine", 5), all("all", 5 * p);
  for (std::size_t i = 0; i < 5; ++i) mine(i) = contribution(comm.rank(), i);
  allgather(comm, mine, all);
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < 5; ++i) CHECK(all(r * 5 + i) == contribution(r, i));

  std::vector<std::size_t> counts;  // rank r contributes r + 1 values (uneven)
  for (int r = 0; r < p; ++r) counts.push_back(static_cast<std::size_t>(r + 1));
  Kokkos::View<double*, Kokkos::HostSpace> uneven("uneven", comm.rank() + 1);
  for (std::size_t i = 0; i < uneven.extent(0); ++i) uneven(i) = contribution(comm.rank(), i);
  Kokkos::View<double*, Kokkos::HostSpace> gathered("gathered", p * (p + 1) / 2);
  allgatherv(comm, uneven, gathered, counts);
  std::size_t k = 0;
  for (int r = 0; r < p; ++r)
    for (int i = 0; i <= r; ++i) CHECK(gathered(k++) == contribution(r, i));
}

TEST_CASE("reduce_scatter leaves block r of the sum on rank r", "[collectives]") {
  const Communicator comm;
  const int p = comm.size();
  std::vector<std::size_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(static_cast<std::size_t>(2 + r % 3));
  const std::size_t total = impl::sum(counts);
  Kokkos::View<double*, Kokkos::HostSpace> send("send", total), recv("recv", counts[comm.rank()]);
  for (std::size_t i = 0; i < total; ++i) send(i) = contribution(comm.rank(), i);
  reduce_scatter(comm, send, recv, counts);
  std::size_t first = 0;
  for (int r = 0; r < comm.rank(); ++r) first += counts[r];
  for (std::size_t i = 0; i < counts[comm.rank()]; ++i) {
    double want = 0;
    for (int r = 0; r < p; ++r) want += contribution(r, first + i);
    CHECK(recv(i) == Approx(want).epsilon(1e-12));
  }
}

TEST_CASE("alltoall and alltoallv route block r to rank r", "[collectives]") {
  const Communicator comm;
  const int p = comm.size();
  const int me = comm.rank();
  // Equal blocks of 3: block r carries values tagged (me, r).
  Kokkos::View<double*, Kokkos::HostSpace> send("send", 3 * p), recv("recv", 3 * p);
  for (int r = 0; r < p; ++r)
    for (int i = 0; i < 3; ++i) send(r * 3 + i) = 1000.0 * me + 10.0 * r + i;
  alltoall(comm, send, recv);
  for (int s = 0; s < p; ++s)
    for (int i = 0; i < 3; ++i) CHECK(recv(s * 3 + i) == 1000.0 * s + 10.0 * me + i);

  // Uneven: rank s sends (s + r) % 3 values to rank r.
  std::vector<std::size_t> send_counts, recv_counts;
  for (int r = 0; r < p; ++r) {
    send_counts.push_back(static_cast<std::size_t>((me + r) % 3));
    recv_counts.push_back(static_cast<std::size_t>((r + me) % 3));
  }
  Kokkos::View<double*, Kokkos::HostSpace> vsend("vsend", impl::sum(send_counts)),
      vrecv("vrecv", impl::sum(recv_counts));
  std::size_t k = 0;
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < send_counts[r]; ++i) vsend(k++) = 1000.0 * me + 10.0 * r + i;
  alltoallv(comm, vsend, send_counts, vrecv, recv_counts);
  k = 0;
  for (int s = 0; s < p; ++s)
    for (std::size_t i = 0; i < recv_counts[s]; ++i)
      CHECK(vrecv(k++) == 1000.0 * s + 10.0 * me + i);
}

TEST_CASE("ring_shift passes blocks around the ring", "[collectives]") {
  const Communicator comm;
  const int p = comm.size();
  for (int shift : {1, -1, 2}) {
    Kokkos::View<float*, Kokkos::HostSpace> send("send", 4), recv("recv", 4);
    for (int i = 0; i < 4; ++i) send(i) = float(100 * comm.rank() + i);
    ring_shift(comm, send, recv, shift);
    const int from = ((comm.rank() - shift) % p + p) % p;
    for (int i = 0; i < 4; ++i) CHECK(recv(i) == float(100 * from + i));
  }
  // p shifts bring a block home.
  Kokkos::View<double*, Kokkos::HostSpace> a("a", 3), b("b", 3);
  for (int i = 0; i < 3; ++i) a(i) = contribution(comm.rank(), i);
  for (int step = 0; step < p; ++step) {
    ring_shift(comm, a, b);
    std::swap(a, b);
  }
  for (int i = 0; i < 3; ++i) CHECK(a(i) == contribution(comm.rank(), i));
}

TEST_CASE("collectives reject Views that do not match their counts", "[collectives][errors]") {
  using Catch::Matchers::Contains;
  const Communicator comm;
  Kokkos::View<double*, Kokkos::HostSpace> small("small", 1), big("big", 2 * comm.size() + 1);
  CHECK_THROWS_WITH(allgather(comm, small, big), Contains("allgather: receive View holds"));
  CHECK_THROWS_WITH(alltoall(comm, big, small), Contains("alltoall:"));
  std::vector<std::size_t> wrong_size(comm.size() + 1, 1);
  CHECK_THROWS_WITH(allgatherv(comm, small, big, wrong_size),
                    Contains("counts has " + std::to_string(comm.size() + 1) + " entries"));
  Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> matrix("matrix", 4, 4);
  auto column = Kokkos::subview(matrix, Kokkos::ALL, 1);
  CHECK_THROWS_WITH(allreduce(comm, column), Contains("is not contiguous"));
}
