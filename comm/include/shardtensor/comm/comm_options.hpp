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
// Config: `parallel.backend: mpi | nccl`, `parallel.device_aware_mpi: false | true`,
// `parallel.bf16_wire: auto | on | off`.

#include <string>

namespace shardtensor {

enum class CommBackend { mpi, nccl };

/// How the operands of bf16 layers (float values that are bfloat16 values) travel between
/// ranks. Halo exchanges (HaloWire::bfloat16): `automatic` as bfloat16 where the transport
/// unpacks every message anyway (device memory: half the bytes for no extra pass), as float
/// where MPI receives straight into the ghost cells (host memory: on one node the unpack that
/// bfloat16 needs costs more than the halved copy saves). Slab exchanges: float (likewise),
/// bfloat16 with `always`. Ring attention's K/V blocks: as bfloat16 unless `never`. `always`
/// (host memory across a slow network) or `never` for every transfer. The values that arrive
/// are the same either way.
enum class Bf16Wire { automatic, always, never };

/// Whether a transfer of bf16 operands goes as bfloat16: always with `always`, never with
/// `never`, and with `automatic` where the transfer's kind says it pays (`pays`: no extra pass
/// against float, or one that is small beside the work it feeds).
inline bool bfloat16_on_the_wire(Bf16Wire wire, bool pays) {
  return wire == Bf16Wire::always || (wire == Bf16Wire::automatic && pays);
}

struct CommOptions {
  CommBackend backend = CommBackend::mpi;
  /// MPI backend: hand MPI device pointers instead of staging through host buffers. No effect
  /// on host memory, nor with NCCL (which only sees device memory anyway).
  bool device_aware_mpi = false;
  Bf16Wire bf16_wire = Bf16Wire::automatic;
};

/// "mpi" or "nccl".
const char* to_string(CommBackend backend);
/// "auto", "on" or "off", as the config says it.
const char* to_string(Bf16Wire halos);

/// Whether this build has the NCCL backend: a CUDA build configured with NCCL.
bool nccl_available();

/// Whether device_aware_mpi may be set: always where the memory is host memory (it changes
/// nothing there); in a GPU build, what the MPI says of itself (Open MPI's
/// MPIX_Query_cuda_support; an MPI that cannot be asked is taken at the user's word).
bool mpi_reads_device_memory();

}  // namespace shardtensor
