// Communicator: duplication, error agreement, and the (data x domain) rank mesh.

#include <catch2/catch.hpp>

#include "shardtensor/comm/transport.hpp"
#include "test_support.hpp"

using namespace shardtensor;

TEST_CASE("a Communicator is a duplicate of the caller's communicator", "[communicator]") {
  const Communicator comm(MPI_COMM_WORLD);
  CHECK(comm.rank() == test::world_rank());
  CHECK(comm.size() == test::world_size());
  int relation = MPI_UNEQUAL;
  MPI_Comm_compare(comm.get(), MPI_COMM_WORLD, &relation);
  CHECK(relation == MPI_CONGRUENT);  // same group, different context: messages never mix
  // Copies share the duplicate.
  const Communicator copy = comm;
  CHECK(copy.get() == comm.get());
}

TEST_CASE("agree throws the same error on every rank when one rank fails", "[communicator]") {
  const Communicator comm;
  const int failing = comm.size() - 1;
  const std::string message = test::error_message_of([&] {
    comm.agree(comm.rank() == failing ? "bad value 17 on rank " + std::to_string(failing) : "");
  });
  CHECK(test::ranks_with_error(message) == comm.size());
  CHECK_THAT(message, Catch::Matchers::Contains("bad value 17 on rank " + std::to_string(failing)));
  CHECK_NOTHROW(comm.agree(""));
}

TEST_CASE("require_same names the ranks that disagree", "[communicator]") {
  const Communicator comm;
  CHECK_NOTHROW(comm.require_same({3, 4, 5}, "test", "shape"));
  if (comm.size() > 1) {
    const std::vector<long long> mine =
        comm.rank() == 1 ? std::vector<long long>{3, 9} : std::vector<long long>{3, 4, 5};
    const std::string message =
        test::error_message_of([&] { comm.require_same(mine, "test", "shape"); });
    CHECK(test::ranks_with_error(message) == comm.size());
    CHECK_THAT(message, Catch::Matchers::Contains("test: shape differs between ranks: rank 0 has "
                                                  "(3,4,5), rank 1 has (3,9)"));
  }
}

TEST_CASE("a rank mesh splits ranks into data groups of domain-parallel ranks", "[communicator]") {
  const Communicator comm;
  for (int groups = 1; groups <= comm.size(); ++groups) {
    if (comm.size() % groups != 0) continue;
    const RankMesh mesh = comm.mesh(groups);
    const int per_group = comm.size() / groups;
    CHECK(mesh.world.size() == comm.size());
    CHECK(mesh.domain.size() == per_group);
    CHECK(mesh.data.size() == groups);
    CHECK(mesh.data_group == comm.rank() / per_group);
    CHECK(mesh.domain.rank() == comm.rank() % per_group);
    // The domain group sums over consecutive world ranks; the data group across groups.
    int domain_sum = comm.rank();
    MPI_Allreduce(MPI_IN_PLACE, &domain_sum, 1, MPI_INT, MPI_SUM, mesh.domain.get());
    const int first = mesh.data_group * per_group;
    CHECK(domain_sum == per_group * first + per_group * (per_group - 1) / 2);
    int data_sum = comm.rank();
    MPI_Allreduce(MPI_IN_PLACE, &data_sum, 1, MPI_INT, MPI_SUM, mesh.data.get());
    const int position = comm.rank() % per_group;
    CHECK(data_sum == groups * position + per_group * groups * (groups - 1) / 2);
  }
  if (comm.size() > 1) {
    const std::string message = test::error_message_of([&] { comm.mesh(comm.size() + 1); });
    CHECK(test::ranks_with_error(message) == comm.size());
    CHECK_THAT(message, Catch::Matchers::Contains("groups do not divide"));
  }
}

TEST_CASE("communication options: transports chosen once, inherited by derived communicators",
          "[communicator]") {
  const CommOptions nccl{CommBackend::nccl, false};
  if (!nccl_available()) {  // refused on every rank, before anything collective
    const std::string message =
        test::error_message_of([&] { const Communicator c(MPI_COMM_WORLD, nccl); });
    CHECK_THAT(message, Catch::Matchers::Contains(
                            "Communicator: backend 'nccl' needs a CUDA build with NCCL"));
    CHECK(test::ranks_with_error(message) == test::world_size());
  }

  const Communicator plain;
  CHECK(plain.options().backend == CommBackend::mpi);
  CHECK_FALSE(plain.options().device_aware_mpi);
  CHECK(std::string(plain.host_transport().name()) == "mpi");
  CHECK(std::string(plain.device_transport().name()) ==
        (host_reads_default_memory ? "mpi" : "mpi (staged)"));
  if (!mpi_reads_device_memory()) {  // a GPU build over an MPI that cannot read GPU memory
    const std::string message = test::error_message_of([&] {
      plain.with_options({CommBackend::mpi, true});
    });
    CHECK_THAT(message, Catch::Matchers::Contains("this MPI cannot read GPU memory"));
    CHECK(test::ranks_with_error(message) == test::world_size());
    return;
  }
  const Communicator aware = plain.with_options({CommBackend::mpi, true});
  CHECK(aware.options().device_aware_mpi);
  CHECK(aware.get() != plain.get());  // a duplicate of its own
  CHECK(aware.reordered(-aware.rank()).options().device_aware_mpi);
  const RankMesh mesh = aware.mesh(1);
  for (const Communicator* c : {&mesh.world, &mesh.domain, &mesh.data})
    CHECK(c->options().device_aware_mpi);
  CHECK_FALSE(plain.mesh(1).domain.options().device_aware_mpi);
}
