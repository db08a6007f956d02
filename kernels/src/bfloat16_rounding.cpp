#include "shardtensor/kernels/bfloat16_rounding.hpp"

#include <numeric>
#include <vector>

#include "host/host_threads.hpp"  // kernels/backends: the backends are private to kernels
#include "host/vector_kernels.hpp"
#include "shardtensor/kernels/vector_isa.hpp"

namespace shardtensor::kernels {

template <class T>
void round_to_bfloat16(const ExecutionSpace& space, const T* from, T* to, std::size_t n) {
  SHARDTENSOR_REQUIRE((std::is_same<T, float>::value), "round_to_bfloat16",
                      "bf16 rounding takes float values, got " << sizeof(T) << "-byte ones");
  if constexpr (std::is_same<T, float>::value) {
    if constexpr (kernels_run_on_host) {
      if (vector_kernels_on()) {  // elementwise: any split gives the same bits
        space.fence();
        host::split_over_threads(host::host_threads(), Index(n), [&](int, Index first, Index last) {
          host::bf16_round(from + first, to + first, std::size_t(last - first));
        });
        return;
      }
    }
    Kokkos::parallel_for(
        "round_to_bfloat16", kernel_range(space, Index(n)),
        KOKKOS_LAMBDA(const Index i) { to[i] = shardtensor::round_to_bfloat16(from[i]); });
  }
}

template <class T>
std::size_t pack_bfloat16(const ExecutionSpace& space, const T* from, std::uint16_t* bits,
                          std::size_t n) {
  SHARDTENSOR_REQUIRE((std::is_same<T, float>::value), "pack_bfloat16",
                      "bf16 packing takes float values, got " << sizeof(T) << "-byte ones");
  std::size_t inexact = 0;
  if constexpr (std::is_same<T, float>::value) {
    if constexpr (kernels_run_on_host) {
      if (vector_kernels_on()) {  // elementwise: any split gives the same bits
        space.fence();
        std::vector<std::size_t> counts(host::host_threads(), 0);
        host::split_over_threads(int(counts.size()), Index(n), [&](int t, Index first, Index last) {
          counts[t] = host::bf16_pack(from + first, bits + first, std::size_t(last - first));
        });
        return std::accumulate(counts.begin(), counts.end(), std::size_t(0));
      }
    }
    Kokkos::parallel_reduce(
        "pack_bfloat16", kernel_range(space, Index(n)),
        KOKKOS_LAMBDA(const Index i, std::size_t& count) {
          bits[i] = bfloat16_bits(from[i]);
          count += bfloat16_value(bits[i]) == from[i] ? 0 : 1;  // NaN counts: it never equals
        },
        inexact);
  }
  return inexact;
}

void store_bfloat16_bits(const ExecutionSpace& space, const float* from, std::uint16_t* bits,
                         std::size_t n) {
  Kokkos::parallel_for(
      "store_bfloat16_bits", kernel_range(space, Index(n)),
      KOKKOS_LAMBDA(const Index i) { bits[i] = bfloat16_bits(from[i]); });
}

template void round_to_bfloat16(const ExecutionSpace&, const float*, float*, std::size_t);
template void round_to_bfloat16(const ExecutionSpace&, const double*, double*, std::size_t);
template std::size_t pack_bfloat16(const ExecutionSpace&, const float*, std::uint16_t*,
                                   std::size_t);
template std::size_t pack_bfloat16(const ExecutionSpace&, const double*, std::uint16_t*,
                                   std::size_t);

}  // namespace shardtensor::kernels
