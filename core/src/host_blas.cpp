#include "shardtensor/core/host_blas.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace shardtensor {

namespace {

/// OpenBLAS's function `name` where OpenBLAS is the loaded BLAS, else null.
template <class Function>
Function openblas_function(const char* name) {
  return reinterpret_cast<Function>(dlsym(RTLD_DEFAULT, name));
}

bool set_in_environment(const char* name) {
  const char* value = std::getenv(name);
  return value && *value;
}

}  // namespace

std::string host_blas_description() {
  using text_function = char* (*)();
  const auto config = openblas_function<text_function>("openblas_get_config");
  if (!config) return "BLAS (reference or unknown implementation)";
  std::string text = config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  if (text.rfind("OpenBLAS", 0) != 0) text = "OpenBLAS " + text;
  if (const auto core = openblas_function<text_function>("openblas_get_corename"))
    text += std::string(", kernels ") + core();
  return text;
}

int host_blas_threads() {
  const auto threads = openblas_function<int (*)()>("openblas_get_num_threads");
  return threads ? threads() : 0;
}

bool one_blas_thread_per_rank() {
  if (set_in_environment("OPENBLAS_NUM_THREADS") || set_in_environment("GOTO_NUM_THREADS"))
    return false;
  const auto set_threads = openblas_function<void (*)(int)>("openblas_set_num_threads");
  if (!set_threads) return false;
  set_threads(1);
  return true;
}

}  // namespace shardtensor
