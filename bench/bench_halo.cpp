// bench_halo: throughput of HaloExchange<float>::exchange() on a 3-D (N, C, x, y, z) field,
// against plain MPI moving the same bytes between the same rank pairs, in the same run.
//
//   mpirun -n 2 --bind-to core ./build/bench/bench_halo [options]
//
// The options are listed in `usage` below (--help prints them); a bad option prints them
// and exits with status 2.
//
// Timed per halo width, every variant once per repetition, in a rotating order:
//   halo    the library's exchange;
//   mpi     the baseline, plain MPI of the same bytes: Irecv/Isend/Waitall of exactly
//           the plan's messages, from and into contiguous buffers, no packing, on a duplicate
//           of MPI_COMM_WORLD with its own tags. Its send buffer never changes, so the
//           receiver's cache keeps a valid copy and a single-copy (CMA) transfer is a
//           cache-hot local copy: an optimistic bound. ratio_to_mpi = mpi time / halo time;
//   fresh   the same with the send buffer rewritten before each send, as a producer of new
//           data would, the rewrite's time ("fill", timed alone) subtracted: the fair
//           baseline. ratio_to_fresh_mpi = fresh time / halo time;
//   pack, unpack  the library's pack_box / unpack_box over the plan's boxes, alone (in host
//           memory the exchange unpacks only messages to the rank itself);
//   bf16    the library's exchange on the bfloat16 wire (HaloWire::bfloat16: half the bytes,
//           packed and unpacked with conversion), the exchange of a bf16 layer's operand;
//           "x f32" = halo time / bf16 time.
// The copy ceiling is a large Kokkos::deep_copy on one core, bytes read + written: the rate
// of an exchange that copies each byte once. Time = the slowest rank's, per call, median over
// repetitions; bytes = bytes_sent() + bytes_received(), mean over ranks; GB/s = bytes / time
// / 1e9. Afterwards every cell is checked against an analytic function of its global index;
// a wrong cell fails the run (exit 1). The last line (rank 0) is one JSON object; its
// top-level rates are for the first width.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/comm.hpp"
#include "shardtensor/core.hpp"
#include "shardtensor/core/execution.hpp"

using namespace shardtensor;

namespace {

struct Options {
  Index size = 64, channels = 32, batch = 1;
  std::vector<int> widths{1, 2};
  std::string grid = "x";
  bool periodic = false;
  Index iters = 0;  // 0: calibrate
  Index warmup = 10, reps = 9, copy_mib = 256;
};

const char* usage =
    "usage: bench_halo [--size N] [--channels C] [--batch B] [--widths 1,2] [--periodic]\n"
    "                  [--grid x|AxBxC|auto] [--iters K] [--warmup K] [--reps R] [--copy-mib M]\n"
    "Defaults in parentheses.\n"
    "  --size: owned cells per rank along each axis (64); --channels (32); --batch (1);\n"
    "  --widths: halo widths, one plan each (1,2); --periodic: every axis (open boundaries);\n"
    "  --grid x: (N*P) x N x N on P x 1 x 1 ranks; AxBxC: (N*A) x (N*B) x (N*C) on that grid;\n"
    "         auto: a cube of about N^3*P cells, Decomposition::automatic picks the grid;\n"
    "  --iters: calls per repetition (calibrated to ~25 ms); --warmup: untimed calls (10);\n"
    "  --reps: timed repetitions, median reported (9); --copy-mib: copy-ceiling buffer (256)\n";

struct UsageError {
  std::string message;  // empty: --help
};

Index parse_integer(const std::string& name, const std::string& text, Index minimum) {
  char* end = nullptr;
  errno = 0;
  const Index value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < minimum || value > INT_MAX)
    throw UsageError{name + " expects an integer from " + std::to_string(minimum) + " to " +
                     std::to_string(INT_MAX) + ", got '" + text + "'"};
  return value;
}

std::vector<int> parse_int_list(const std::string& name, const std::string& text, char separator) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, separator)) values.push_back(int(parse_integer(name, item, 1)));
  if (values.empty()) throw UsageError{name + " expects a list, got '" + text + "'"};
  return values;
}

Options parse_options(int argc, char** argv) {
  Options o;
  const std::map<std::string, std::pair<Index*, Index>> integers = {
      // value, minimum
      {"--size", {&o.size, 1}},        {"--channels", {&o.channels, 1}}, {"--batch", {&o.batch, 1}},
      {"--iters", {&o.iters, 1}},      {"--warmup", {&o.warmup, 0}},     {"--reps", {&o.reps, 1}},
      {"--copy-mib", {&o.copy_mib, 1}}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto integer = integers.find(arg);
    if (arg == "--help" || arg == "-h") throw UsageError{""};
    if (arg == "--periodic") {
      o.periodic = true;
      continue;
    }
    if (integer == integers.end() && arg != "--widths" && arg != "--grid")
      throw UsageError{"unknown option '" + arg + "'"};
    if (i + 1 == argc) throw UsageError{arg + " expects a value"};
    const std::string value = argv[++i];
    if (arg == "--widths")
      o.widths = parse_int_list(arg, value, ',');
    else if (arg == "--grid")
      o.grid = value;
    else
      *integer->second.first = parse_integer(arg, value, integer->second.second);
  }
  return o;
}

Decomposition make_decomposition(const Options& o, int nranks) {
  const std::vector<bool> periodic(3, o.periodic);
  if (o.grid == "x")
    return Decomposition({o.size * nranks, o.size, o.size}, {nranks, 1, 1}, periodic);
  if (o.grid == "auto") {
    const Index side = std::llround(double(o.size) * std::cbrt(double(nranks)));
    return Decomposition::automatic({side, side, side}, nranks, periodic);
  }
  const std::vector<int> grid = parse_int_list("--grid", o.grid, 'x');
  if (grid.size() != 3) throw UsageError{"--grid expects x, auto or AxBxC, got '" + o.grid + "'"};
  if (grid[0] * grid[1] * grid[2] != nranks)
    throw UsageError{"--grid " + o.grid + " has " + std::to_string(grid[0] * grid[1] * grid[2]) +
                     " ranks, the job has " + std::to_string(nranks)};
  return Decomposition({o.size * grid[0], o.size * grid[1], o.size * grid[2]}, grid, periodic);
}

double allreduce(double value, MPI_Op op) {
  double out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
  return out;
}

/// Seconds per call of `op`, the slowest rank's, for `iters` calls after a barrier.
double time_per_call(const std::function<void()>& op, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i) op();
  return allreduce((MPI_Wtime() - start) / iters, MPI_MAX);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Variant {
  std::function<void()> op;
  std::vector<double> seconds;  // one per repetition
  int iters = 0;
};

/// Warms every variant up and gives it `iters` calls per repetition (0: as many as take
/// about `target_seconds`); then runs `reps` rounds, each timing every variant once. Round r
/// starts at variant r, so that no variant always runs right after the same one.
void run_interleaved(std::vector<Variant>& variants, int warmup, int iters, int reps,
                     double target_seconds) {
  for (Variant& v : variants) {
    for (int i = 0; i < warmup; ++i) v.op();
    v.iters = iters;
    if (iters == 0) {
      double trial = 1e30;
      for (int k = 0; k < 3; ++k) trial = std::min(trial, time_per_call(v.op, 3));
      v.iters = int(std::clamp(target_seconds / std::max(trial, 1e-9), 3.0, 100000.0));
    }
  }
  for (int r = 0; r < reps; ++r)
    for (std::size_t k = 0; k < variants.size(); ++k) {
      Variant& v = variants[(k + std::size_t(r)) % variants.size()];
      v.seconds.push_back(time_per_call(v.op, v.iters));
    }
}

/// Value at a global cell: exact in float (below 2^24), different for neighbouring cells
/// and channels, so a shifted or misplaced ghost is caught.
float analytic(Index n, Index c, Index x, Index y, Index z) {
  std::uint32_t h = std::uint32_t(x) * 73856093u ^ std::uint32_t(y) * 19349663u ^
                    std::uint32_t(z) * 83492791u ^ std::uint32_t(c) * 2654435761u ^
                    std::uint32_t(n) * 97u;
  h ^= h >> 13;
  return float(h & 0xFFFFFFu);
}

constexpr float ghost_sentinel = -1.0f;  // analytic() is never negative

/// The value a cell must hold after a correct exchange (or, for `filled`, before it: owned
/// cells analytic, every ghost the sentinel). Ghosts inside the field or across a periodic
/// boundary hold the owner's value; ghosts past an open boundary keep the sentinel.
float expected(const ShardTensor<float>& field, Index n, Index c, const SpatialIndex& local,
               bool filled) {
  if (filled && !field.interior_box().contains(local)) return ghost_sentinel;
  const Decomposition& d = field.decomposition();
  SpatialIndex g = field.to_global(local);
  for (int k = 0; k < d.ndims(); ++k) {
    const Index extent = d.global_extent(k);
    if (g[k] >= 0 && g[k] < extent) continue;
    if (!d.periodic(k)) return ghost_sentinel;
    g[k] = (g[k] % extent + extent) % extent;
  }
  return analytic(n, c, g[0], g[1], g[2]);
}

/// Calls f(host mirror value, expected value, whether a ghost cell) for every cell.
template <class HostView, class F>
void for_each_cell(const ShardTensor<float>& field, bool filled, const HostView& host, F f) {
  for (Index n = 0; n < field.batch(); ++n)
    for (Index c = 0; c < field.channels(); ++c)
      for (Index x = 0; x < field.allocated_extent(0); ++x)
        for (Index y = 0; y < field.allocated_extent(1); ++y)
          for (Index z = 0; z < field.allocated_extent(2); ++z)
            f(host(n, c, x, y, z), expected(field, n, c, {x, y, z}, filled),
              !field.interior_box().contains({x, y, z}));
}

/// Fills the field, exchanges once, and returns the number of wrong cells over all ranks
/// (the bfloat16 wire's ghosts hold the owners' values rounded).
long long check_exchange(HaloExchange<float>& halo, const ShardTensor<float>& field,
                         HaloWire wire) {
  auto host = Kokkos::create_mirror_view(field.view());
  for_each_cell(field, true, host, [](float& cell, float want, bool) { cell = want; });
  Kokkos::deep_copy(field.view(), host);
  halo.exchange(field, wire);
  Kokkos::deep_copy(host, field.view());
  long long wrong = 0;
  for_each_cell(field, false, host, [&](float& cell, float want, bool ghost) {
    wrong += cell != (ghost && wire == HaloWire::bfloat16 ? round_to_bfloat16(want) : want);
  });
  return (long long)allreduce(double(wrong), MPI_SUM);
}

using Message = HaloExchange<float>::Message;

/// 0..26 from a direction: the baseline's own tags, on its own communicator.
int direction_tag(const Direction& d) {
  return (d[0] + 1) * 9 + (d[1] + 1) * 3 + (d[2] + 1);
}

/// The plan's messages with plain MPI, from and into contiguous buffers, no packing.
/// exchange(false) sends a never-rewritten buffer (the baseline, cache-hot);
/// exchange(true) first rewrites it (fill()), so that new data has to move.
class MpiBaseline {
 public:
  explicit MpiBaseline(const HaloExchange<float>& plan)
      : messages_(plan.messages()),
        send_("baseline_send", plan.bytes_sent() / sizeof(float)),
        recv_("baseline_recv", plan.bytes_received() / sizeof(float)) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    Kokkos::deep_copy(send_, 1.0f);  // touch every page before timing
    requests_.reserve(2 * messages_.size());
  }
  ~MpiBaseline() { MPI_Comm_free(&comm_); }
  MpiBaseline(const MpiBaseline&) = delete;
  MpiBaseline& operator=(const MpiBaseline&) = delete;

  void exchange(bool fresh) {
    requests_.clear();
    for (const Message& m : messages_) {  // the tag says where the message goes
      const Direction from{-m.direction[0], -m.direction[1], -m.direction[2]};
      requests_.emplace_back();
      MPI_Irecv(recv_.data() + m.recv_offset, int(m.recv_count), MPI_FLOAT, m.neighbor,
                direction_tag(from), comm_, &requests_.back());
    }
    if (fresh) fill();
    for (const Message& m : messages_) {
      requests_.emplace_back();
      MPI_Isend(send_.data() + m.send_offset, int(m.send_count), MPI_FLOAT, m.neighbor,
                direction_tag(m.direction), comm_, &requests_.back());
    }
    MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }

  void fill() {
    value_ = value_ == 1.0f ? 2.0f : 1.0f;
    Kokkos::deep_copy(send_, value_);
    Kokkos::fence();
  }

 private:
  std::vector<Message> messages_;
  Kokkos::View<float*, Kokkos::HostSpace> send_, recv_;  // MPI reads and writes them
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> requests_;
  float value_ = 1.0f;
};

/// What each width measures; the order of the variants timed for it.
enum Timed { halo_t, mpi_t, fresh_t, fill_t, pack_t, unpack_t, bf16_t, timed_count };

struct WidthResult {
  int width = 0, iters = 0;
  std::size_t messages = 0;
  double bytes_per_rank = 0;   // sent + received per exchange, mean over ranks
  double s[timed_count] = {};  // median seconds per call of each variant
  long long wrong = 0;
  double rate(double seconds) const { return seconds > 0 ? bytes_per_rank / seconds / 1e9 : 0; }
  /// The fresh baseline without its buffer rewrite (never faster than the clean baseline).
  double fresh_s() const { return std::max(s[fresh_t] - s[fill_t], s[mpi_t]); }
};

WidthResult run_width(const Options& o, const Decomposition& d, const Communicator& comm,
                      int width) {
  WidthResult r;
  r.width = width;
  ShardTensor<float> field(d, comm.rank(), o.batch, o.channels, GhostWidths::uniform(width, 3),
                           "bench_field");
  HaloExchange<float> halo(comm, field);
  const std::vector<Message>& messages = halo.messages();
  r.messages = std::size_t(allreduce(double(messages.size()), MPI_MAX));
  r.bytes_per_rank =
      allreduce(double(halo.bytes_sent() + halo.bytes_received()), MPI_SUM) / comm.size();

  if (r.bytes_per_rank > 0) {  // e.g. one rank with open boundaries: nothing to time
    MpiBaseline baseline(halo);
    // The library's pack / unpack kernels alone, into private buffers laid out like the plan's.
    Kokkos::View<float*, DefaultMemorySpace> packed("packed", halo.bytes_sent() / sizeof(float)),
        unpacked("unpacked", halo.bytes_received() / sizeof(float));
    std::vector<Variant> variants(timed_count);
    variants[halo_t].op = [&] { halo.exchange(field); };
    variants[bf16_t].op = [&] { halo.exchange(field, HaloWire::bfloat16); };
    variants[mpi_t].op = [&] { baseline.exchange(false); };
    variants[fresh_t].op = [&] { baseline.exchange(true); };
    variants[fill_t].op = [&] { baseline.fill(); };
    variants[pack_t].op = [&] {
      for (const Message& m : messages)
        pack_box(ExecutionSpace(), field.view(), m.send_box, packed, m.send_offset);
      Kokkos::fence();
    };
    variants[unpack_t].op = [&] {
      for (const Message& m : messages)
        unpack_box(ExecutionSpace(), unpacked, field.view(), m.recv_box, UnpackMode::assign,
                   m.recv_offset);
      Kokkos::fence();
    };
    run_interleaved(variants, int(o.warmup), int(o.iters), int(o.reps), 0.025);
    r.iters = variants[halo_t].iters;
    for (int k = 0; k < timed_count; ++k) r.s[k] = median(variants[k].seconds);
  }
  r.wrong = check_exchange(halo, field, HaloWire::native) +
            check_exchange(halo, field, HaloWire::bfloat16);
  return r;
}

std::string json_number(double v) {
  if (v == 0) return "0";
  if (!std::isfinite(v)) return "null";
  char text[64];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

std::string json_ratio(double numerator, double denominator) {
  return numerator > 0 && denominator > 0 ? json_number(numerator / denominator) : "null";
}

/// The rates of one width, as JSON fields (the top level repeats them for the first width).
std::string json_rates(const WidthResult& r) {
  return "\"gbytes_per_s\":" + json_number(r.rate(r.s[halo_t])) +
         ",\"mpi_gbytes_per_s\":" + json_number(r.rate(r.s[mpi_t])) +
         ",\"ratio_to_mpi\":" + json_ratio(r.s[mpi_t], r.s[halo_t]) +
         ",\"fresh_mpi_gbytes_per_s\":" + json_number(r.rate(r.fresh_s())) +
         ",\"ratio_to_fresh_mpi\":" + json_ratio(r.fresh_s(), r.s[halo_t]);
}

void print_report(const Options& o, const Decomposition& d, int nranks,
                  const std::vector<WidthResult>& results, double copy_rate) {
  std::printf(
      "bench_halo: HaloExchange<float> on %s, %d rank(s), batch %lld, %lld channels\n"
      "  rank 0 owns %lldx%lldx%lld cells; median of %d interleaved repetitions\n"
      "  time = slowest rank; GB/s = (sent + received bytes per rank, mean over ranks) / time\n"
      "  mpi = plain MPI, same messages, contiguous never-rewritten buffers (cache-hot);\n"
      "  fresh = the same, send buffer rewritten before each send, rewrite time subtracted\n"
      "  bf16 = the exchange on the bfloat16 wire (half the bytes); x f32 = halo us / bf16 us\n"
      "  copy ceiling (deep_copy of %lld MiB on one core, read + write bytes): %.2f GB/s\n\n",
      d.describe().c_str(), nranks, (long long)o.batch, (long long)o.channels,
      (long long)d.extent(0, 0), (long long)d.extent(0, 1), (long long)d.extent(0, 2), o.reps,
      (long long)o.copy_mib, copy_rate);
  std::printf("%5s %4s %8s %8s %9s %9s %6s %10s %6s %8s %8s %8s %6s\n", "width", "msgs", "KiB/rank",
              "halo us", "halo GB/s", "mpi GB/s", "ratio", "fresh GB/s", "ratio", "pack us",
              "unpk us", "bf16 us", "x f32");
  for (const WidthResult& r : results) {
    if (r.bytes_per_rank == 0)
      std::printf("%5d %4zu %8s  (nothing to exchange)\n", r.width, r.messages, "0");
    else
      std::printf("%5d %4zu %8.0f %8.1f %9.2f %9.2f %6.3f %10.2f %6.3f %8.1f %8.1f %8.1f %6.3f\n",
                  r.width, r.messages, r.bytes_per_rank / 1024, r.s[halo_t] * 1e6,
                  r.rate(r.s[halo_t]), r.rate(r.s[mpi_t]), r.s[mpi_t] / r.s[halo_t],
                  r.rate(r.fresh_s()), r.fresh_s() / r.s[halo_t], r.s[pack_t] * 1e6,
                  r.s[unpack_t] * 1e6, r.s[bf16_t] * 1e6, r.s[halo_t] / r.s[bf16_t]);
  }

  std::ostringstream js;
  js << "{\"bench\":\"halo\",\"ranks\":" << nranks << ",\"grid\":\"" << d.process_grid(0) << "x"
     << d.process_grid(1) << "x" << d.process_grid(2) << "\",\"global\":[" << d.global_extent(0)
     << "," << d.global_extent(1) << "," << d.global_extent(2)
     << "],\"periodic\":" << (o.periodic ? "true" : "false") << ",\"batch\":" << o.batch
     << ",\"channels\":" << o.channels << ",\"local_size\":" << o.size
     << ",\"stat\":\"median\",\"primary_width\":" << results.front().width << ","
     << json_rates(results.front()) << ",\"copy_gbytes_per_s\":" << json_number(copy_rate)
     << ",\"per_width\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const WidthResult& r = results[i];
    js << (i ? "," : "") << "{\"width\":" << r.width << ",\"messages\":" << r.messages
       << ",\"bytes_per_rank\":" << json_number(r.bytes_per_rank) << ",\"iters\":" << r.iters
       << ",\"halo_s\":" << json_number(r.s[halo_t]) << "," << json_rates(r)
       << ",\"fill_s\":" << json_number(r.s[fill_t]) << ",\"pack_s\":" << json_number(r.s[pack_t])
       << ",\"unpack_s\":" << json_number(r.s[unpack_t])
       << ",\"bf16_s\":" << json_number(r.s[bf16_t])
       << ",\"bf16_speedup\":" << json_ratio(r.s[halo_t], r.s[bf16_t])
       << ",\"correct\":" << (r.wrong == 0 ? "true" : "false") << "}";
  }
  std::printf("\n%s]}\n", js.str().c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Options o;
  std::unique_ptr<Decomposition> d;
  try {
    o = parse_options(argc, argv);
    d = std::make_unique<Decomposition>(make_decomposition(o, nranks));
  } catch (const UsageError& e) {  // every rank parses the same argv: all return together
    if (rank == 0)
      std::fprintf(stderr, "%s%s%s", e.message.c_str(), e.message.empty() ? "" : "\n", usage);
    return e.message.empty() ? 0 : 2;
  }
  const Communicator comm(MPI_COMM_WORLD);
  const double copy_rate = bench::copy_gbytes_per_s(std::size_t(o.copy_mib) << 20, rank);

  std::vector<WidthResult> results;
  for (int width : o.widths) results.push_back(run_width(o, *d, comm, width));
  if (rank == 0) print_report(o, *d, nranks, results, copy_rate);

  int status = 0;
  for (const WidthResult& r : results)
    if (r.wrong != 0) {
      if (rank == 0)
        std::fprintf(stderr,
                     "bench_halo: FAILED: %lld wrong cells after the exchange of width %d\n",
                     r.wrong, r.width);
      status = 1;
    }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      status = run(argc, argv);
    } catch (const std::exception& e) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "bench_halo: rank %d: %s\n", rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return status;
}
