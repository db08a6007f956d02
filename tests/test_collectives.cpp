// Collectives on Views against serial results computed from every rank's known inputs.

#include <catch2/catch.hpp>
#include <numeric>

#include "shardtensor/comm/point_to_point.hpp"
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

TEST_CASE("collectives of device-memory Views agree on every communication backend",
          "[collectives]") {
  // The Views of the kernels (DefaultMemorySpace): on a GPU each backend moves them its own
  // way (staged, device pointers, NCCL); the values must be the serial answers on all.
  using Buffer = Kokkos::View<double*, DefaultMemorySpace>;
  auto filled = [](const std::string& label, std::size_t n, auto value) {
    Buffer b(label, n);
    auto h = Kokkos::create_mirror_view(b);
    for (std::size_t i = 0; i < n; ++i) h(i) = value(i);
    Kokkos::deep_copy(b, h);
    return b;
  };
  auto on_host = [](const Buffer& b) {
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  };
  for (const CommOptions& options : test::comm_backends()) {
    INFO(test::describe(options));
    const Communicator comm = Communicator().with_options(options);
    const int p = comm.size(), me = comm.rank();
    const std::size_t n = 29;

    const Buffer sum = filled("sum", n, [&](std::size_t i) { return contribution(me, i); });
    allreduce(comm, sum);
    const Buffer top = filled("max", n, [&](std::size_t i) { return contribution(me, i); });
    allreduce(comm, top, ReduceOp::max);
    const auto hs = on_host(sum), ht = on_host(top);
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0, m = contribution(0, i);
      for (int r = 0; r < p; ++r) s += contribution(r, i), m = std::max(m, contribution(r, i));
      CHECK(hs(i) == Approx(s).epsilon(1e-14));
      CHECK(ht(i) == m);
    }

    // allgatherv and alltoallv with blocks of every rank's own size (r + 1 values).
    std::vector<std::size_t> counts;
    for (int r = 0; r < p; ++r) counts.push_back(std::size_t(r + 1));
    const Buffer mine = filled("mine", me + 1, [&](std::size_t i) { return contribution(me, i); });
    const Buffer all("all", p * (p + 1) / 2);
    allgatherv(comm, mine, all, counts);
    const auto ha = on_host(all);
    for (int r = 0, k = 0; r < p; ++r)
      for (int i = 0; i <= r; ++i) CHECK(ha(k++) == contribution(r, i));

    std::vector<std::size_t> send_counts, recv_counts;  // me sends r + me + 1 values to r
    for (int r = 0; r < p; ++r) send_counts.push_back(std::size_t(r + me + 1));
    for (int r = 0; r < p; ++r) recv_counts.push_back(std::size_t(me + r + 1));
    std::vector<double> outgoing;
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < send_counts[r]; ++i) outgoing.push_back(1000.0 * me + 10 * r + i);
    const Buffer out = filled("out", outgoing.size(), [&](std::size_t i) { return outgoing[i]; });
    const Buffer in("in", std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t(0)));
    alltoallv(comm, out, send_counts, in, recv_counts);
    const auto hi = on_host(in);
    for (int s = 0, k = 0; s < p; ++s)
      for (std::size_t i = 0; i < recv_counts[s]; ++i) CHECK(hi(k++) == 1000.0 * s + 10 * me + i);

    // reduce_scatter with equal blocks (NCCL's own) and with unequal ones.
    for (const bool equal : {true, false}) {
      std::vector<std::size_t> blocks;
      for (int r = 0; r < p; ++r) blocks.push_back(equal ? 3 : std::size_t(r + 2));
      const std::size_t total = std::accumulate(blocks.begin(), blocks.end(), std::size_t(0));
      const Buffer values =
          filled("values", total, [&](std::size_t i) { return contribution(me, 100 + i); });
      const Buffer block("block", blocks[me]);
      reduce_scatter(comm, values, block, blocks);
      const auto hb = on_host(block);
      const std::size_t first =
          std::accumulate(blocks.begin(), blocks.begin() + me, std::size_t(0));
      for (std::size_t i = 0; i < blocks[me]; ++i) {
        double s = 0;
        for (int r = 0; r < p; ++r) s += contribution(r, 100 + first + i);
        CHECK(hb(i) == Approx(s).epsilon(1e-14));
      }
    }

    const Buffer from = filled("from", 5, [&](std::size_t i) { return 100.0 * me + i; });
    const Buffer to("to", 5);
    ring_shift(comm, from, to);
    const auto hr = on_host(to);
    for (std::size_t i = 0; i < 5; ++i) CHECK(hr(i) == 100.0 * ((me + p - 1) % p) + i);
  }
}

TEST_CASE("post_exchange runs two rings at once, blocks of every rank's own size",
          "[collectives]") {
  // As ring attention does: blocks travel one way, accumulators another, both in flight while
  // the ranks compute; rank r's block has r + 2 values, so every message has its own length.
  for (const CommOptions& options : test::comm_backends()) {
    INFO(test::describe(options));
    const Communicator comm = Communicator().with_options(options);
    const int p = comm.size(), me = comm.rank();
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    auto size_of = [](int r) { return Index(r + 2); };
    using Buffer = Kokkos::View<double*, DefaultMemorySpace>;
    Buffer blocks[2] = {Buffer("a", p + 2), Buffer("b", p + 2)};
    Buffer sums[2] = {Buffer("c", p + 2), Buffer("d", p + 2)};
    auto host = Kokkos::create_mirror_view(blocks[0]);
    for (Index i = 0; i < size_of(me); ++i) host(i) = contribution(me, i);
    Kokkos::deep_copy(blocks[0], host);
    Kokkos::deep_copy(sums[0], host);
    const int tag = comm.operation_tags("test.post_exchange", 2);
    for (int step = 0; step + 1 < p; ++step) {
      const int source = (me - step + p) % p, incoming = (source + p - 1) % p;
      PendingExchange block =
          post_exchange(comm, static_cast<const double*>(blocks[step % 2].data()), size_of(source),
                        next, blocks[(step + 1) % 2].data(), size_of(incoming), prev, tag);
      PendingExchange sum =
          post_exchange(comm, static_cast<const double*>(sums[step % 2].data()), size_of(source),
                        next, sums[(step + 1) % 2].data(), size_of(incoming), prev, tag + 1);
      block.test();
      block.wait();
      sum.wait();
      // Each rank adds its own contribution into the travelling sum it just received.
      auto s = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums[(step + 1) % 2]);
      for (Index i = 0; i < size_of(incoming); ++i) s(i) += contribution(me, i);
      Kokkos::deep_copy(sums[(step + 1) % 2], s);
    }
    // After p - 1 steps each rank holds the block of rank me + 1 and its sum over all ranks.
    const int last = (me + 1) % p;
    const int at = (p - 1) % 2;
    const auto block = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), blocks[at]);
    const auto sum = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums[at]);
    for (Index i = 0; i < size_of(last); ++i) {
      CHECK(block(i) == contribution(last, i));
      double expected = contribution(last, i);
      for (int step = 0; step + 1 < p; ++step) expected += contribution((last + step + 1) % p, i);
      CHECK(sum(i) == Approx(expected).epsilon(1e-14));
    }
  }
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

TEST_CASE(
    "every transport gives every operation the same values, staged through host copies "
    "or not",
    "[collectives][transport]") {
  // The staged MPI transport copies each buffer to a host copy and back: where the default
  // memory is host memory the copies are host to host, so the staging code runs (and is held
  // to the plain transport's results) on every build.
  const Communicator comm;
  const int p = comm.size(), me = comm.rank();
  auto plain = impl::make_mpi_transport(comm.get(), impl::MpiMemory::host);
  auto staged = impl::make_mpi_transport(comm.get(), impl::MpiMemory::staged);
  std::vector<std::size_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(3 + 2 * r);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const auto mine = [&](std::size_t n, int salt) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = hashed_uniform(salt * 100 + me, i);
    return v;
  };
  const auto type = impl::wire_type<double>();
  for (impl::Transport* t : {plain.get(), staged.get()}) {
    INFO(t->name());
    std::vector<double> sum = mine(11, 1);
    t->allreduce(sum.data(), sum.size(), type, ReduceOp::sum);
    std::vector<double> want(11, 0.0);
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < 11; ++i) want[i] += hashed_uniform(100 + r, i);
    for (std::size_t i = 0; i < 11; ++i) CHECK(sum[i] == Approx(want[i]).epsilon(1e-14));

    const std::vector<double> block = mine(counts[me], 2);
    std::vector<double> gathered(total, -1.0);
    t->allgatherv(block.data(), gathered.data(), counts, type);
    std::vector<double> root_gathered(me == 0 ? total : 0, -1.0);
    t->gatherv(block.data(), root_gathered.data(), counts, 0, type);
    std::size_t at = 0;
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < counts[r]; ++i, ++at) {
        CHECK(gathered[at] == hashed_uniform(200 + r, i));
        if (me == 0) CHECK(root_gathered[at] == hashed_uniform(200 + r, i));
      }
    std::vector<double> scattered(counts[me], -1.0);
    t->scatterv(gathered.data(), counts, scattered.data(), 0, type);
    CHECK(scattered == block);

    // An exchange around the ring, received through next_received().
    const std::vector<double> out = mine(5, 3);
    std::vector<double> in(5, -1.0);
    impl::Transfers transfers = t->exchange({{(me + 1) % p, out.data(), 5, 7}},
                                            {{(me + p - 1) % p, in.data(), 5, 7}}, type);
    CHECK(transfers.next_received() == 0);
    CHECK(transfers.next_received() == -1);
    transfers.wait();
    for (std::size_t i = 0; i < 5; ++i) CHECK(in[i] == hashed_uniform(300 + (me + p - 1) % p, i));
  }
  // Transfers dropped before their receive is matched (a plan unwinding from an exception):
  // the receive is cancelled, nothing waits for it.
  std::vector<double> never(4, 0.0);
  { impl::Transfers orphan = staged->exchange({}, {{me, never.data(), 4, 9}}, type); }
  CHECK(never == std::vector<double>(4, 0.0));
  comm.barrier();
}
