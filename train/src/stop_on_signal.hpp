#pragma once
// StopOnSignal: SIGINT and SIGTERM during training stop it at the next step boundary, with a
// checkpoint to resume from, on every rank together.

#include <Kokkos_Core.hpp>
#include <csignal>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::impl {

/// SIGINT and SIGTERM while it lives ask training to stop at the next step boundary (the
/// handler only sets a flag; the previous handlers come back at the end).
class StopOnSignal {
 public:
  StopOnSignal() {
    received_ = 0;
    struct sigaction action {};
    action.sa_handler = [](int signal) { received_ = signal; };
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // system calls (MPI, HDF5) go on where they were
    sigaction(SIGINT, &action, &previous_int_);
    sigaction(SIGTERM, &action, &previous_term_);
  }
  ~StopOnSignal() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  /// The signal one rank received (the largest number), 0 if none. Collective over the
  /// mesh, so every rank learns it at the same step: over the domain ranks, then the data
  /// groups (not the world communicator, which the background reader's collectives use).
  int received(const RankMesh& mesh) const {
    double signal = double(received_);  // no allocation: this runs every step
    const Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> v(
        &signal, 1);
    allreduce(mesh.domain, v, ReduceOp::max);
    allreduce(mesh.data, v, ReduceOp::max);
    return int(signal);
  }

 private:
  static volatile std::sig_atomic_t received_;
  struct sigaction previous_int_ {
  }, previous_term_{};
};

}  // namespace shardtensor::impl
