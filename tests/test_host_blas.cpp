// One host BLAS thread per rank (core/host_blas.hpp): the test main calls
// one_blas_thread_per_rank() as the CLI does. ctest runs this program twice: with the tests'
// OPENBLAS_NUM_THREADS=1 (the user's choice stands), and as test_host_blas_unset_np<R> with it
// empty and OMP_NUM_THREADS=2 (what an OpenMP build's user sets; OpenBLAS would take it for its
// own threads), where the setting must bring OpenBLAS to one thread. The test multiplies
// matrices through Kokkos Kernels first, as the library's GEMMs do, so that the BLAS behind it
// is loaded; where that is not OpenBLAS there is nothing to set, and the test says so.

#include <dlfcn.h>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "shardtensor/core/host_blas.hpp"

using namespace shardtensor;

namespace {

bool blas_threads_chosen_by_user() {
  for (const char* name : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"})
    if (const char* value = std::getenv(name); value && *value) return true;
  return false;
}

}  // namespace

TEST_CASE("one BLAS thread per rank unless the user chose", "[blas]") {
  // A GEMM through Kokkos Kernels, as attention's: 2 x 3 times 3 x 2, each sum 3 * 0.5 * 0.25.
  Kokkos::View<float**, Kokkos::LayoutRight> a("a", 2, 3), b("b", 3, 2), c("c", 2, 2);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);
  const auto product = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  CHECK(product(1, 0) == 0.375f);

  const std::string blas = host_blas_description();
  INFO("BLAS: " << blas);
  if (host_blas_threads() == 0) {
    WARN("not OpenBLAS (" << blas << "): its threads cannot be set, nothing to check");
    CHECK_FALSE(one_blas_thread_per_rank());
    return;
  }
  CHECK(blas.rfind("OpenBLAS ", 0) == 0);
  if (blas_threads_chosen_by_user()) {
    const char* value = std::getenv("OPENBLAS_NUM_THREADS");
    const int chosen =
        value && *value ? std::atoi(value) : std::atoi(std::getenv("GOTO_NUM_THREADS"));
    CHECK(host_blas_threads() == chosen);
    CHECK_FALSE(one_blas_thread_per_rank());
    CHECK(host_blas_threads() == chosen);
    return;
  }
  // The test main set one thread; more threads again (as a BLAS that read OMP_NUM_THREADS
  // has), then the setting once more.
  CHECK(host_blas_threads() == 1);
  const auto set_threads =
      reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  REQUIRE(set_threads);
  set_threads(2);
  if (host_blas_threads() < 2) WARN("OpenBLAS runs one thread on this machine at most");
  CHECK(one_blas_thread_per_rank());
  CHECK(host_blas_threads() == 1);
}
