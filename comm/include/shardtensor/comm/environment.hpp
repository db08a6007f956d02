#pragma once
// The MPI library itself, for the few places outside comm/ that face it: the command-line
// tool (init, finalize, abort), the C API (is MPI running?) and the data loader (may a second
// thread call MPI?). Every MPI call stays in comm/.

#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

namespace shardtensor {

/// MPI for a program's lifetime: MPI_Init_thread (asking for MPI_THREAD_MULTIPLE, which the
/// data loader's background reads use when granted) in the constructor, MPI_Finalize in the
/// destructor.
class MpiEnvironment {
 public:
  MpiEnvironment(int& argc, char**& argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }

 private:
  int rank_ = 0, size_ = 1;
};

/// MPI_Finalize, if MPI is running (for a program that ends early, before ~MpiEnvironment).
void mpi_finalize();

/// Ends every rank of MPI_COMM_WORLD with `code` (MPI_Abort).
[[noreturn]] void mpi_abort(int code);

/// Whether MPI is initialized and not yet finalized; else says which in `state`.
bool mpi_running(std::string* state = nullptr);

/// Whether MPI was initialized with MPI_THREAD_MULTIPLE (any thread may call it).
bool mpi_thread_multiple();

/// The MPI library's name and version, up to its first comma or line break.
std::string mpi_library_version();

/// The C communicator of a Fortran handle.
MPI_Comm mpi_comm_from_fortran(MPI_Fint comm);

/// The layout of a Cartesian communicator (MPI_Cart_create): per axis, ranks, periodic flag
/// and this rank's coordinate; none if `comm` has no Cartesian topology.
struct CartesianLayout {
  std::vector<int> dims, periods, coords;
};
std::optional<CartesianLayout> cartesian_layout(MPI_Comm comm);

}  // namespace shardtensor
