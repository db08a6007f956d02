#pragma once
// Which vector instruction set the host backend's vector kernels run on (the float
// convolution tiles, GELU and the softmax rows of attention: kernels/backends/host/). They are
// compiled for every instruction set the build targets (x86-64: AVX2 with FMA, AVX-512;
// aarch64: NEON) and run on the best one the CPU has, chosen at run time; every path gives the
// same bits. SHARDTENSOR_SIMD=off|best|avx2|avx512|neon in the environment (read on first use)
// or select_vector_isa() picks another, for tests and measurements; "off" runs the portable
// Kokkos kernels, as CPUs without FMA vectors, CUDA builds and Kokkos on a device do.

#include <cstddef>
#include <string>
#include <vector>

namespace shardtensor::kernels {

/// The instruction set the vector kernels run on now ("avx512", "avx2", "neon"), or "off".
std::string vector_isa();
/// Whether a path is on (vector_isa() != "off"); one atomic load.
bool vector_kernels_on();
/// Floats per vector on that path (at most 16), 0 when off.
int vector_lanes();
/// The paths this build has and this CPU runs, best first (without "off").
std::vector<std::string> vector_isas();
/// Runs the vector kernels on `isa` from now on: one of vector_isas(), "best" or "off".
/// Throws shardtensor::Error naming the value and the choices for anything else. Not while
/// kernels run on other threads.
void select_vector_isa(const std::string& isa);

/// Whether bf16 convolutions run on the CPU's bf16 dot-product instructions now, where AMX
/// tiles do not: on the avx512 path of a CPU with AVX512_BF16 or the neon path of an Arm CPU
/// with BF16 (BFDOT: Neoverse V1 and later, Graviton 3, Grace), where they outrun the float
/// tiles' multiply-adds (AMD Zen 4 and later; Arm taken as such) or are switched on. Elsewhere
/// bf16 operands run on the float tiles, rounded as the kernels read them (Intel's
/// vdpbf16ps, Cooper Lake and Sapphire Rapids, gives half the products of its two FMA ports).
/// Their forward and input gradient add products channel pair by pair (outputs within a bf16
/// step of the float tiles'); on x86 their weight gradient gives the float tiles' bits (except
/// where a product is subnormal: the instruction flushes it to zero), on Arm it sums each pair
/// of cells first and rounds to odd (within float rounding).
bool bf16_dot_products();
/// "auto" (the default: where they outrun the float tiles), "on" (wherever the CPU has them:
/// for tests and measurements on Intel) or "off" (never; no AMX tiles either). Also
/// SHARDTENSOR_BF16_DOT=auto|on|off in the environment, read on first use. Throws
/// shardtensor::Error naming the value for anything else. Not while kernels run.
void set_bf16_dot_products(const std::string& mode);

/// Whether bf16 convolutions' forward and input gradient run on AMX matrix tiles now (Intel
/// Sapphire Rapids and later Xeons; Linux 5.16 or later grants the tiles): where the CPU has
/// AMX-BF16 and bf16 dot products (not switched off), unless forbidden. Each tile sums 16 to 32
/// channels' products in an order of the hardware's: outputs within a bf16 step of the float
/// tiles', the same for every cell, so sharded runs still give one rank's bits.
bool bf16_matrix_tiles();
/// Allows (the default; SHARDTENSOR_AMX=off in the environment forbids, read on first use) or
/// forbids the AMX tiles, for tests and measurements.
void allow_bf16_matrix_tiles(bool allow);
/// Runs `rounds` rounds of independent full AMX tile products (where the CPU has them, whether
/// or not allowed) and returns the flops run, 0 elsewhere: benchmarks time it for the bf16
/// tiles' ceiling.
double run_bf16_tile_products(std::size_t rounds);

/// Runs `rounds` rounds of independent multiply-add chains on the selected path's vectors (on
/// the best path where it is off) and returns the flops run, 0 in a build without vector
/// kernels: benchmarks time it for the machine's multiply-add ceiling (bench_support.hpp).
double run_multiply_add_chains(std::size_t rounds);

/// Runs `rounds` calls of the selected path's float correlation tile (the convolution's
/// forward and input gradient) on one cached workload, a 3x3 window over 32 channels (its
/// source and weights, 22 KiB, stay in L1), and returns the flops run, 0 where the vector
/// kernels are off: benchmarks time it for the tile's own ceiling, what a convolution would
/// reach with nothing but its tiles in the way (bench_support.hpp).
double run_correlate_tiles(std::size_t rounds);

}  // namespace shardtensor::kernels
