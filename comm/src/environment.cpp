#include "shardtensor/comm/environment.hpp"

#include <cstdlib>

namespace shardtensor {

MpiEnvironment::MpiEnvironment(int& argc, char**& argv) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiEnvironment::~MpiEnvironment() {
  mpi_finalize();
}

void mpi_finalize() {
  if (mpi_running()) MPI_Finalize();
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);  // MPI_Abort does not return; the compiler cannot know
}

bool mpi_running(std::string* state) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (state) *state = finalized ? "already finalized" : initialized ? "running" : "not initialized";
  return initialized && !finalized;
}

bool mpi_thread_multiple() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

std::string mpi_library_version() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, length);
  if (auto end = text.find_first_of(",\n"); end != std::string::npos) text.resize(end);
  return text;
}

MPI_Comm mpi_comm_from_fortran(MPI_Fint comm) {
  return MPI_Comm_f2c(comm);
}

std::optional<CartesianLayout> cartesian_layout(MPI_Comm comm) {
  int topology = MPI_UNDEFINED;
  MPI_Topo_test(comm, &topology);
  if (topology != MPI_CART) return std::nullopt;
  int ndims = 0;
  MPI_Cartdim_get(comm, &ndims);
  CartesianLayout layout{std::vector<int>(ndims), std::vector<int>(ndims), std::vector<int>(ndims)};
  MPI_Cart_get(comm, ndims, layout.dims.data(), layout.periods.data(), layout.coords.data());
  return layout;
}

}  // namespace shardtensor
