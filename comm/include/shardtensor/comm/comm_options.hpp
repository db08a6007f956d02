#pragma once
// CommOptions: how a Communicator moves data that lives in device memory (a GPU build).
//
// Host memory (every View of a CPU build; scalars, statistics and I/O on any build) always
// goes through MPI, which reads it in place. Device memory goes, by backend:
//   mpi   staged through host buffers (any MPI), or, with device_aware_mpi, MPI is handed the
//         device pointers (a CUDA-aware MPI, e.g. Open MPI built with UCX and CUDA);
//   nccl  NCCL: allreduce / allgather / reduce-scatter natively, everything point-to-point
//         (halo exchanges, rings, all-to-all) as grouped ncclSend / ncclRecv, on the
//         communicator's own CUDA stream. Needs one GPU per rank.
// Config: `parallel.backend: mpi | nccl`, `parallel.device_aware_mpi: false | true`.

#include <string>

namespace shardtensor {

enum class CommBackend { mpi, nccl };

struct CommOptions {
  CommBackend backend = CommBackend::mpi;
  /// MPI backend: hand MPI device pointers instead of staging through host buffers. No effect
  /// on host memory, nor with NCCL (which only sees device memory anyway).
  bool device_aware_mpi = false;
};

/// "mpi" or "nccl".
const char* to_string(CommBackend backend);

/// Whether this build has the NCCL backend: a CUDA build configured with NCCL.
bool nccl_available();

/// Whether device_aware_mpi may be set: always where the memory is host memory (it changes
/// nothing there); in a GPU build, what the MPI says of itself (Open MPI's
/// MPIX_Query_cuda_support; an MPI that cannot be asked is taken at the user's word).
bool mpi_reads_device_memory();

}  // namespace shardtensor
