// Example 03: in-situ training and inference inside an MPI heat solver.
//
// The solver below is an ordinary MPI code: a periodic 3-D heat equation u_t = kappa lap(u) on
// n^3 cells, its own arrays (std::vector<double>, one ghost layer, C order u[x][y][z]), its
// own Cartesian process grid (MPI_Cart_create) and ghost exchange (MPI_Sendrecv of faces),
// explicit 7-point finite differences. It knows nothing of ShardTensor types. A
// shardtensor::Session couples a U-Net to it through pointers to those arrays:
//
//   --mode online (default)
//     phase 1, online training: for each episode a new smooth initial condition (a sum of a
//     few Fourier modes from a fixed seed); every K steps the solver copies u(t), steps K
//     times and hands the pair (u(t), u(t + K dt)) to session.train_step. No data files.
//     Then the session writes a checkpoint.
//     phase 2, inference: from a fresh initial condition, every K steps session.infer(u(t))
//     predicts u(t + K dt); the solver steps K times and compares the prediction with its
//     own solution, and with the no-change baseline |u(t) - u(t + K dt)| / |u(t + K dt)|.
//   --mode infer --checkpoint file.h5
//     phase 2 only, from a checkpoint (any rank count can load one written on any other).
//
//   mpirun -n 2 ./example_03_insitu_heat [--config insitu_heat.yaml] [--size 24]
//          [--interval 8] [--episodes 40] [--windows 6] [--test-windows 6]
//          [--checkpoint insitu_heat.h5] [--mode online|infer]
//
// Exit status 0 only if the prediction error is below a third of the no-change baseline.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/embed.hpp"

namespace {

// ---------------------------------------------------------------------------------------
// The solver: no ShardTensor types from here to the end of HeatSolver.

constexpr double pi = 3.14159265358979323846;

/// A periodic 3-D heat equation on [0, 2 pi)^3, n^3 cells, split over a Cartesian grid of
/// ranks. Arrays are C order with one ghost layer: u[(i * sy + j) * sz + k], i, j, k in
/// [0, extent + 2), owned cells at 1..extent.
class HeatSolver {
 public:
  /// r = kappa dt / dx^2 (stable below 1/6 for the 7-point stencil).
  HeatSolver(MPI_Comm world, int n, double diffusion_number) : n_(n), r_(diffusion_number) {
    int size = 1;
    MPI_Comm_size(world, &size);
    int dims[3] = {0, 0, 0}, periods[3] = {1, 1, 1};
    MPI_Dims_create(size, 3, dims);
    MPI_Cart_create(world, 3, dims, periods, /*reorder=*/1, &cart_);
    int coords[3];
    MPI_Comm_rank(cart_, &rank_);
    MPI_Cart_coords(cart_, rank_, 3, coords);
    for (int d = 0; d < 3; ++d) {
      // Balanced split: the first n % dims ranks along an axis own one cell more.
      const int base = n / dims[d], extra = n % dims[d];
      extent_[d] = base + (coords[d] < extra ? 1 : 0);
      offset_[d] = coords[d] * base + std::min(coords[d], extra);
      allocated_[d] = extent_[d] + 2;
      MPI_Cart_shift(cart_, d, 1, &lower_[d], &upper_[d]);
    }
    u_.assign(values(), 0.0);
    next_.assign(values(), 0.0);
    // One subarray type per face: the first / last owned slab and the low / high ghost slab
    // of axis d, spanning the whole allocated extent of the other axes (so exchanging the
    // axes one after another also fills edges and corners).
    for (int d = 0; d < 3; ++d) {
      const int slab[4] = {1, extent_[d], 0, extent_[d] + 1};  // send low, send high, recv ...
      for (int f = 0; f < 4; ++f) {
        int sizes[3] = {allocated_[0], allocated_[1], allocated_[2]};
        int subsizes[3] = {allocated_[0], allocated_[1], allocated_[2]};
        int starts[3] = {0, 0, 0};
        subsizes[d] = 1;
        starts[d] = slab[f];
        MPI_Type_create_subarray(3, sizes, subsizes, starts, MPI_ORDER_C, MPI_DOUBLE,
                                 &face_[d][f]);
        MPI_Type_commit(&face_[d][f]);
      }
    }
  }
  ~HeatSolver() {
    for (auto& faces : face_)
      for (MPI_Datatype& t : faces) MPI_Type_free(&t);
    MPI_Comm_free(&cart_);
  }
  HeatSolver(const HeatSolver&) = delete;
  HeatSolver& operator=(const HeatSolver&) = delete;

  MPI_Comm cartesian_comm() const { return cart_; }
  int rank() const { return rank_; }
  std::size_t values() const {
    return std::size_t(allocated_[0]) * allocated_[1] * allocated_[2];
  }
  std::vector<double>& field() { return u_; }
  const std::vector<double>& field() const { return u_; }

  /// u(x) = sum over a few modes of a cos(k . x + phase): integer wave vectors with
  /// |k_i| <= 3, Gaussian amplitudes; the same on every rank (same seed).
  void initialize(unsigned seed) {
    std::mt19937_64 random(seed);
    std::uniform_int_distribution<int> wave(-3, 3), count(3, 6);
    std::normal_distribution<double> amplitude(0.0, 1.0);
    std::uniform_real_distribution<double> phase(0.0, 2 * pi);
    struct Mode {
      int k[3];
      double a, phase;
    };
    std::vector<Mode> modes(count(random));
    for (Mode& m : modes) {
      do {
        for (int& k : m.k) k = wave(random);
      } while (m.k[0] == 0 && m.k[1] == 0 && m.k[2] == 0);
      m.a = amplitude(random);
      m.phase = phase(random);
    }
    const double h = 2 * pi / n_;
    for_owned([&](int i, int j, int k, std::size_t at) {
      const double x = (offset_[0] + i) * h, y = (offset_[1] + j) * h, z = (offset_[2] + k) * h;
      double value = 0;
      for (const Mode& m : modes) value += m.a * std::cos(m.k[0] * x + m.k[1] * y + m.k[2] * z + m.phase);
      u_[at] = value;
    });
  }

  /// Fills the ghost layer from the neighbours (periodic): two MPI_Sendrecv per axis.
  void exchange_ghosts() {
    for (int d = 0; d < 3; ++d) {
      // Last owned slab up, low ghost slab from below; then first owned slab down.
      MPI_Sendrecv(u_.data(), 1, face_[d][1], upper_[d], 10 + d, u_.data(), 1, face_[d][2],
                   lower_[d], 10 + d, cart_, MPI_STATUS_IGNORE);
      MPI_Sendrecv(u_.data(), 1, face_[d][0], lower_[d], 20 + d, u_.data(), 1, face_[d][3],
                   upper_[d], 20 + d, cart_, MPI_STATUS_IGNORE);
    }
  }

  /// One explicit Euler step with the 7-point Laplacian.
  void step() {
    exchange_ghosts();
    const std::size_t sx = std::size_t(allocated_[1]) * allocated_[2], sy = allocated_[2];
    for_owned([&](int, int, int, std::size_t at) {
      const double laplacian = u_[at - sx] + u_[at + sx] + u_[at - sy] + u_[at + sy] +
                               u_[at - 1] + u_[at + 1] - 6.0 * u_[at];
      next_[at] = u_[at] + r_ * laplacian;
    });
    u_.swap(next_);
  }

  /// Sum over the whole field (all ranks) of f(a, b) over owned cells.
  template <class F>
  double global_sum(const std::vector<double>& a, const std::vector<double>& b, F f) const {
    double local = 0;
    for_owned([&](int, int, int, std::size_t at) { local += f(a[at], b[at]); });
    MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_SUM, cart_);
    return local;
  }
  /// |a - b| / |b| over the global field.
  double relative_l2(const std::vector<double>& a, const std::vector<double>& b) const {
    const double diff =
        global_sum(a, b, [](double p, double q) { return (p - q) * (p - q); });
    const double norm = global_sum(a, b, [](double, double q) { return q * q; });
    return std::sqrt(diff / norm);
  }

 private:
  template <class F>
  void for_owned(F f) const {
    for (int i = 1; i <= extent_[0]; ++i)
      for (int j = 1; j <= extent_[1]; ++j)
        for (int k = 1; k <= extent_[2]; ++k)
          f(i - 1, j - 1, k - 1,
            (std::size_t(i) * allocated_[1] + std::size_t(j)) * allocated_[2] + std::size_t(k));
  }

  int n_;
  double r_;
  MPI_Comm cart_ = MPI_COMM_NULL;
  int rank_ = 0;
  int extent_[3], offset_[3], allocated_[3], lower_[3], upper_[3];
  MPI_Datatype face_[3][4];
  std::vector<double> u_, next_;
};

// ---------------------------------------------------------------------------------------
// The driver.

std::string option(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

struct Settings {
  std::string mode, config, checkpoint;
  int size, interval, episodes, windows, test_windows;
  double diffusion_number;
};

/// Phase 1: online training on pairs the solver produces as it runs.
void train_online(HeatSolver& solver, shardtensor::Session& session, const Settings& s) {
  std::vector<double> before(solver.values());
  const double t0 = MPI_Wtime();
  double episode_loss = 0;
  for (int episode = 0; episode < s.episodes; ++episode) {
    solver.initialize(1000u + unsigned(episode));
    episode_loss = 0;
    for (int w = 0; w < s.windows; ++w) {
      before = solver.field();  // u(t)
      for (int step = 0; step < s.interval; ++step) solver.step();
      episode_loss += session.train_step({before.data()}, {solver.field().data()});
    }
    episode_loss /= s.windows;
    if (solver.rank() == 0 &&
        (episode == 0 || (episode + 1) % 10 == 0 || episode + 1 == s.episodes))
      std::printf("  episode %3d: mean loss %.4e (%lld optimizer steps, %.1f s)\n", episode + 1,
                  episode_loss, static_cast<long long>(session.steps()), MPI_Wtime() - t0);
  }
  if (solver.rank() == 0)
    std::printf("phase 1: %d episodes x %d windows = %lld train steps in %.1f s; input %s%s\n",
                s.episodes, s.windows, static_cast<long long>(session.steps()),
                MPI_Wtime() - t0, session.last_call().input_copied ? "copied: " : "read in place",
                session.last_call().copy_reason.c_str());
  std::fflush(stdout);
}

/// Phase 2: predict u(t + K dt) every K steps from a fresh initial condition; returns the
/// mean (over windows) prediction error and no-change baseline.
std::array<double, 2> predict(HeatSolver& solver, shardtensor::Session& session,
                              const Settings& s) {
  solver.initialize(7u);  // never a training seed
  std::vector<double> before(solver.values()), prediction(solver.values(), 0.0);
  double error = 0, baseline = 0;
  for (int w = 0; w < s.test_windows; ++w) {
    before = solver.field();
    session.infer({solver.field().data()}, {prediction.data()});
    for (int step = 0; step < s.interval; ++step) solver.step();
    const double e = solver.relative_l2(prediction, solver.field());
    const double b = solver.relative_l2(before, solver.field());
    error += e / s.test_windows;
    baseline += b / s.test_windows;
    if (solver.rank() == 0)
      std::printf("  window %d (steps %d-%d): prediction error %.4f, no-change %.4f\n", w + 1,
                  w * s.interval, (w + 1) * s.interval, e, b);
  }
  if (solver.rank() == 0)
    std::printf("phase 2: input %s%s\n",
                session.last_call().input_copied ? "copied: " : "read in place",
                session.last_call().copy_reason.c_str());
  return {error, baseline};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  shardtensor::keep_freed_memory();  // reuse the model's activation buffers between calls
  // One OpenBLAS thread per rank (the ranks fill the cores); a solver that runs its own BLAS
  // calls on several threads per rank would leave this out and set OPENBLAS_NUM_THREADS.
  shardtensor::one_blas_thread_per_rank();
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);  // the session computes with Kokkos
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    try {
      Settings s;
      s.mode = option(argc, argv, "--mode", "online");
      s.config = option(argc, argv, "--config", INSITU_HEAT_CONFIG);
      s.checkpoint = option(argc, argv, "--checkpoint", "insitu_heat.h5");
      s.size = std::stoi(option(argc, argv, "--size", "24"));
      s.interval = std::stoi(option(argc, argv, "--interval", "8"));
      s.episodes = std::stoi(option(argc, argv, "--episodes", "40"));
      s.windows = std::stoi(option(argc, argv, "--windows", "6"));
      s.test_windows = std::stoi(option(argc, argv, "--test-windows", "6"));
      s.diffusion_number = std::stod(option(argc, argv, "--diffusion-number", "0.1"));
      if ((s.mode != "online" && s.mode != "infer") || s.size < 4 || s.interval < 1 ||
          s.episodes < 1 || s.windows < 1 || s.test_windows < 1 || s.diffusion_number <= 0 ||
          s.diffusion_number > 1.0 / 6) {
        if (world_rank == 0)
          std::fprintf(stderr, "insitu_heat: bad options (see the comment in main.cpp)\n");
        status = 2;
      } else {
        HeatSolver solver(MPI_COMM_WORLD, s.size, s.diffusion_number);

        // The coupling: the solver's Cartesian grid, its arrays' layout, the model.
        const shardtensor::SolverPatch patch =
            shardtensor::SolverPatch::cartesian(solver.cartesian_comm(), {s.size, s.size, s.size});
        shardtensor::SessionOptions options;
        options.arrays = shardtensor::SolverArrays{shardtensor::ArrayOrder::c, 1};
        if (s.mode == "online") {
          options.config = s.config;  // a fresh model
          // The learning-rate schedule spans exactly the training this run will do.
          options.overrides = {"schedule.total_steps=" + std::to_string(s.episodes * s.windows)};
        } else {
          options.checkpoint = s.checkpoint;  // model, parameters and config from the file
        }
        shardtensor::Session session(solver.cartesian_comm(), patch, options);
        if (world_rank == 0)
          std::printf("insitu_heat: %d^3 cells, %d rank(s), K = %d steps per window, r = %.3f\n"
                      "  session: %s\n",
                      s.size, world_size, s.interval, s.diffusion_number,
                      session.describe().c_str());

        if (s.mode == "online") {
          train_online(solver, session, s);
          session.save_checkpoint(s.checkpoint);
          if (world_rank == 0) std::printf("checkpoint: %s\n", s.checkpoint.c_str());
        }
        const std::array<double, 2> result = predict(solver, session, s);
        const bool good = result[0] < result[1] / 3;
        if (world_rank == 0)
          std::printf("insitu_heat: prediction relative L2 error %.4f (no-change baseline %.4f)%s\n",
                      result[0], result[1], good ? "" : " -- NOT below a third of the baseline");
        status = good ? 0 : 1;
      }
    } catch (const shardtensor::Error& e) {
      // Session errors are raised on every rank: each one reports and leaves.
      std::fprintf(stderr, "rank %d: %s\n", world_rank, e.what());
      status = 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: error: %s\n", world_rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Finalize();
  return status;
}
