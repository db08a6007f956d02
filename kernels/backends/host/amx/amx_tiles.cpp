#include "amx_tiles.hpp"

#include <atomic>
#include <cstring>
#include <tuple>
#include <vector>

#include "../environment_switch.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/kernels/vector_isa.hpp"

// GCC 11 has the AMX intrinsics. The tiles' functions are compiled for AMX and AVX-512 by a
// pragma, not by flags for the whole file: the rest of it runs on every CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && \
    !defined(__CUDACC__)
#define SHARDTENSOR_AMX_TILES 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace shardtensor::kernels::host {

namespace {

/// Whether AMX tiles may run: SHARDTENSOR_AMX=off forbids them on first use.
std::atomic<bool>& amx_allowed() {
  static std::atomic<bool> allowed{environment_switch("SHARDTENSOR_AMX")};
  return allowed;
}

}  // namespace

bool amx_tiles_allowed() {
  return amx_allowed().load();
}
void allow_amx_tiles(bool allow) {
  amx_allowed().store(allow);
}

#ifdef SHARDTENSOR_AMX_TILES

namespace {

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")

inline int smaller(int a, int b) {
  return a < b ? a : b;
}

/// The tile configuration (palette 1): per tile register its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

/// Tile register numbers (GCC's AMX intrinsics take literals only). A tile product of MB
/// blocks of rows by NV blocks of columns (MB <= 2, NV <= 2; or MB = 1, NV <= 3) keeps its sums
/// of block (m, v) in sum_tile[m][v], the A operand of row block m in a_tile[m], the B operand
/// of column block v in b_tile[v].
constexpr int sum_tile[2][3] = {{0, 1, 2}, {2, 3, -1}};
constexpr int a_tile[2] = {4, 5}, b_tile[3] = {6, 7, 3};

/// GCC's tile loads and stores are asm without a memory clobber: this tells the compiler that
/// memory may have been read or written by them.
inline void memory_barrier() {
  asm volatile("" ::: "memory");
}

inline void zero_tile(int tile) {
  switch (tile) {
    case 0:
      _tile_zero(0);
      return;
    case 1:
      _tile_zero(1);
      return;
    case 2:
      _tile_zero(2);
      return;
    default:
      _tile_zero(3);
      return;
  }
}

/// Sum tile `tile` into `to`, 16 floats a row.
inline void store_tile(int tile, float* to) {
  switch (tile) {
    case 0:
      _tile_stored(0, to, 64);
      break;
    case 1:
      _tile_stored(1, to, 64);
      break;
    case 2:
      _tile_stored(2, to, 64);
      break;
    default:
      _tile_stored(3, to, 64);
      break;
  }
  memory_barrier();
}

/// This thread's tile configuration, loaded where it differs from the one in place: a load
/// and release per call cost 15-20 % of a bf16 convolution's forward (its tile calls run a
/// few dozen products each). The tiles stay configured between calls; release_tiles() returns
/// them to their initial state.
thread_local TileConfig loaded_configuration;
thread_local bool configured = false;

inline void load_configuration(const TileConfig& config) {
  if (configured && std::memcmp(&config, &loaded_configuration, sizeof config) == 0) return;
  _tile_loadconfig(&config);
  loaded_configuration = config;
  configured = true;
}

/// Returns the tiles to their initial state (the next product configures them again).
inline void release_tiles() {
  _tile_release();
  configured = false;
}

/// Configures the tiles of an MB x NV product whose row blocks have rows(m) rows, column blocks
/// columns(v) float columns, and whose operands hold `pairs` pairs per A row and B column; the
/// sums start at zero.
template <int MB, int NV, class Rows, class Columns>
void start_product(const Rows& rows, const Columns& columns, int pairs) {
  static_assert((MB == 2 && NV <= 2) || (MB == 1 && NV <= 3), "eight tile registers");
  TileConfig config;
  for (int m = 0; m < MB; ++m) {
    for (int v = 0; v < NV; ++v) {
      config.rows[sum_tile[m][v]] = uint8_t(rows(m));
      config.bytes_per_row[sum_tile[m][v]] = uint16_t(4 * columns(v));
    }
    config.rows[a_tile[m]] = uint8_t(rows(m));
    config.bytes_per_row[a_tile[m]] = uint16_t(4 * pairs);
  }
  for (int v = 0; v < NV; ++v) {
    config.rows[b_tile[v]] = uint8_t(pairs);
    config.bytes_per_row[b_tile[v]] = uint16_t(4 * columns(v));
  }
  load_configuration(config);
  memory_barrier();  // the operands written before are read by the tile loads
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) zero_tile(sum_tile[m][v]);
}

/// sums(m, v) += A(m) B(v): the A operands from a[m] (rows a_stride bytes apart), the B
/// operands from b[v] (rows b_stride bytes apart).
template <int MB, int NV>
inline void multiply_add(const void* const* a, std::size_t a_stride, const void* const* b,
                         std::size_t b_stride) {
  _tile_loadd(4, a[0], a_stride);
  if constexpr (MB == 2) _tile_loadd(5, a[1], a_stride);
  _tile_loadd(6, b[0], b_stride);
  if constexpr (NV > 1) _tile_loadd(7, b[1], b_stride);
  if constexpr (NV > 2) _tile_loadd(3, b[2], b_stride);
  _tile_dpbf16ps(0, 4, 6);
  if constexpr (NV > 1) _tile_dpbf16ps(1, 4, 7);
  if constexpr (NV > 2) _tile_dpbf16ps(2, 4, 3);
  if constexpr (MB == 2) _tile_dpbf16ps(2, 5, 6);
  if constexpr (MB == 2 && NV > 1) _tile_dpbf16ps(3, 5, 7);
}

/// MB blocks of 16 output channels x NV vectors of 16 cells.
template <int MB, int NV>
void correlate(const uint32_t* const* planes, int x_taps, const std::ptrdiff_t* yz_offsets,
               int yz_taps, std::ptrdiff_t pair_stride, int chunk_pairs, int chunks,
               const uint32_t* weights, std::ptrdiff_t block_stride, const OutputVector* vectors,
               float* out, std::ptrdiff_t out_channel_stride, int rows, const float* bias) {
  const auto block_rows = [&](int m) { return smaller(16, rows - 16 * m); };
  start_product<MB, NV>(
      block_rows, [](int) { return 16; }, chunk_pairs);
  const std::size_t weight_stride = 4 * std::size_t(chunk_pairs), cell_stride = 4 * pair_stride;
  const std::ptrdiff_t chunk_step = std::ptrdiff_t(chunk_pairs) * pair_stride;
  const std::ptrdiff_t tap_weights = 16 * std::ptrdiff_t(chunk_pairs);
  for (int a = 0; a < x_taps; ++a) {
    if (!planes[a]) continue;
    for (int k = 0; k < chunks; ++k) {
      const uint32_t* chunk_planes = planes[a] + k * chunk_step;
      const uint32_t* w = weights + (std::ptrdiff_t(a) * chunks + k) * yz_taps * tap_weights;
      for (int t = 0; t < yz_taps; ++t, w += tap_weights) {
        const void* a_rows[2] = {w, w + block_stride};
        const void* b_rows[3];
        for (int v = 0; v < NV; ++v) b_rows[v] = chunk_planes + yz_offsets[t] + vectors[v].source;
        multiply_add<MB, NV>(a_rows, weight_stride, b_rows, cell_stride);
      }
    }
  }
  // Each sum tile through L1, with the bias, into the vector's cells of the output.
  alignas(64) float sums[16][16];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) {
      store_tile(sum_tile[m][v], &sums[0][0]);
      const OutputVector& vector = vectors[v];
      for (int i = 0; i < block_rows(m); ++i) {
        const int o = 16 * m + i;
        __m512 values = _mm512_load_ps(sums[i]);
        if (bias) values = _mm512_add_ps(values, _mm512_set1_ps(bias[o]));
        float* channel = out + o * out_channel_stride;
        _mm512_mask_storeu_ps(channel + vector.output, __mmask16(vector.mask), values);
        if (vector.next_mask)
          _mm512_mask_storeu_ps(channel + vector.next_output, __mmask16(vector.next_mask), values);
      }
    }
  memory_barrier();  // the tiles stay configured for the band's next call
}

/// MB blocks of 16 source channels x NV blocks of 16 output channels.
template <int MB, int NV>
void weight_gradient(const uint16_t* source, std::ptrdiff_t channel_stride,
                     std::ptrdiff_t row_stride, int channels, const uint32_t* dy_pairs,
                     std::ptrdiff_t dy_row_stride, int dy_channels, int outs, int rows,
                     int chunk_pairs, int chunks, float* gradient,
                     std::ptrdiff_t gradient_channel_stride) {
  const auto block_rows = [&](int m) { return smaller(16, channels - 16 * m); };
  const auto block_columns = [&](int v) { return smaller(16, outs - 16 * v); };
  start_product<MB, NV>(block_rows, block_columns, chunk_pairs);
  const std::size_t source_stride = 2 * channel_stride, dy_stride = 4 * std::size_t(dy_channels);
  for (int y = 0; y < rows; ++y)
    for (int k = 0; k < chunks; ++k) {
      const uint16_t* cells = source + y * row_stride + 2 * k * chunk_pairs;
      const uint32_t* dy = dy_pairs + y * dy_row_stride + k * chunk_pairs * dy_channels;
      const void* a_rows[2] = {cells, cells + 16 * channel_stride};
      const void* b_rows[3] = {dy, dy + 16, dy + 32};
      multiply_add<MB, NV>(a_rows, source_stride, b_rows, dy_stride);
    }
  alignas(64) float sums[16][16];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < NV; ++v) {
      store_tile(sum_tile[m][v], &sums[0][0]);
      for (int i = 0; i < block_rows(m); ++i) {
        float* to = gradient + (16 * m + i) * gradient_channel_stride + 16 * v;
        const __mmask16 columns = __mmask16((1u << block_columns(v)) - 1);
        _mm512_mask_storeu_ps(
            to, columns,
            _mm512_add_ps(_mm512_maskz_loadu_ps(columns, to), _mm512_load_ps(sums[i])));
      }
    }
  memory_barrier();  // the tiles stay configured for the next call
}

// ---- bf16 GEMM -------------------------------------------------------------------------
// Operands packed into whole tiles (zeros past their edges), rounded to bf16 as they are packed
// (vcvtne2ps2bf16: nearest even; a subnormal value becomes zero, as the tiles take it anyway).
// A: per block of 16 rows and chunk of 32 k, 16 rows of 32 bf16 values; B: per block of 16
// columns and chunk, 16 rows of k pairs, each 16 columns' pairs (VNNI). Blocks come in pairs
// (2 x 2 sum tiles per product), the last one of an odd count all zeros.

inline __mmask16 first_lanes(int count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

/// count (<= 32; 0 or fewer: none) floats from p and zeros after them as 32 bf16 values.
inline __m512i bf16_row(const float* p, int count) {
  const __m512 low = _mm512_maskz_loadu_ps(first_lanes(count), p);
  const __m512 high = _mm512_maskz_loadu_ps(first_lanes(count - 16), p + 16);
  return __m512i(_mm512_cvtne2ps_pbh(high, low));
}

/// Two rows of count (<= 16) floats (the second null: zeros) as 16 pairs, bf16 values: pair j
/// holds first[j] in its lower half, second[j] in its upper.
inline __m512i bf16_pairs_of_rows(const float* first, const float* second, int count) {
  alignas(64) static const uint16_t interleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                      21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                      11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512 low = _mm512_maskz_loadu_ps(first_lanes(count), first);
  const __m512 high =
      second ? _mm512_maskz_loadu_ps(first_lanes(count), second) : _mm512_setzero_ps();
  return _mm512_permutexvar_epi16(_mm512_load_si512(interleave),
                                  __m512i(_mm512_cvtne2ps_pbh(high, low)));
}

// GCC 12's unpack intrinsics pass a self-initialised "undefined" vector as their unused
// merge source, which -Wmaybe-uninitialized reports once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// v[r][c] becomes v[c][r]: 16 vectors of 16 32-bit values transposed in registers.
inline void transpose_16x16(__m512i (&v)[16]) {
  __m512i t[16];
  // Pairs of rows interleaved, then pairs of pairs: s[4g + c] holds, in its 128-bit lane L,
  // column 4L + c of rows 4g ... 4g + 3.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  __m512i s[16];
  for (int g = 0; g < 4; ++g) {
    s[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    s[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    s[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    s[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Column 4L + c: lane L of s[c], s[4 + c], s[8 + c], s[12 + c], gathered 128 bits at a time.
  for (int c = 0; c < 4; ++c) {
    const __m512i low_a = _mm512_shuffle_i32x4(s[c], s[4 + c], 0x44),
                  high_a = _mm512_shuffle_i32x4(s[c], s[4 + c], 0xEE),
                  low_b = _mm512_shuffle_i32x4(s[8 + c], s[12 + c], 0x44),
                  high_b = _mm512_shuffle_i32x4(s[8 + c], s[12 + c], 0xEE);
    v[c] = _mm512_shuffle_i32x4(low_a, low_b, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(low_a, low_b, 0xDD);
    v[8 + c] = _mm512_shuffle_i32x4(high_a, high_b, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(high_a, high_b, 0xDD);
  }
}
#pragma GCC diagnostic pop

/// One tile of 16 x 16 32-bit values from row-major floats `from` (leading dimension ld; rows
/// x cols of them, zeros past those), from row r0 and column c0 on: with pair_rows, tile row p
/// pairs stored rows r0 + 2p and r0 + 2p + 1 over columns c0 ... c0 + 15; else tile row r is
/// stored row r0 + r, columns c0 ... c0 + 31, as bf16 values. Transposed with `transpose`.
void pack_tile(const float* from, std::ptrdiff_t ld, int rows, int cols, int r0, int c0,
               bool pair_rows, bool transpose, uint32_t* tile) {
  __m512i v[16];
  for (int r = 0; r < 16; ++r) {
    const int row = pair_rows ? r0 + 2 * r : r0 + r;
    v[r] = _mm512_setzero_si512();
    if (row >= rows) continue;
    const float* at = from + row * ld + c0;
    v[r] = pair_rows ? bf16_pairs_of_rows(at, row + 1 < rows ? at + ld : nullptr, cols - c0)
                     : bf16_row(at, cols - c0);
  }
  if (transpose) transpose_16x16(v);
  for (int r = 0; r < 16; ++r) _mm512_storeu_si512(tile + 16 * r, v[r]);
}

/// Packs op(A) (m x k; A stored m x k, or k x m with `trans`) into A tiles, blocks x chunks:
/// per block of 16 rows and chunk of 32 k, 16 rows of 32 bf16 values.
void pack_a(bool trans, int m, int k, const float* a, std::ptrdiff_t lda, int blocks, int chunks,
            uint32_t* packed) {
  for (int mb = 0; mb < blocks; ++mb)
    for (int kc = 0; kc < chunks; ++kc) {
      uint32_t* tile = packed + (std::ptrdiff_t(mb) * chunks + kc) * 256;
      if (trans)  // a row's pair p: stored rows 32 kc + 2p and + 1
        pack_tile(a, lda, k, m, 32 * kc, 16 * mb, true, true, tile);
      else
        pack_tile(a, lda, m, k, 16 * mb, 32 * kc, false, false, tile);
    }
}

/// Packs op(B) (k x n; B stored k x n, or n x k with `trans`) into B tiles, blocks x chunks:
/// per block of 16 columns and chunk of 32 k, 16 rows of k pairs, each 16 columns' (VNNI).
void pack_b(bool trans, int k, int n, const float* b, std::ptrdiff_t ldb, int blocks, int chunks,
            uint32_t* packed) {
  for (int nb = 0; nb < blocks; ++nb)
    for (int kc = 0; kc < chunks; ++kc) {
      uint32_t* tile = packed + (std::ptrdiff_t(nb) * chunks + kc) * 256;
      if (trans)  // a column's 32 values: one stored row
        pack_tile(b, ldb, n, k, 16 * nb, 32 * kc, false, true, tile);
      else
        pack_tile(b, ldb, k, n, 32 * kc, 16 * nb, true, false, tile);
    }
}

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          std::ptrdiff_t lda, const float* b, std::ptrdiff_t ldb, float beta, float* c,
          std::ptrdiff_t ldc) {
  const int m_blocks = (m + 31) / 32 * 2, n_blocks = (n + 31) / 32 * 2, chunks = (k + 31) / 32;
  // The packed operands: per host thread, grown to the largest product it ran.
  thread_local std::vector<uint32_t> packed;
  const std::size_t a_values = std::size_t(m_blocks) * chunks * 256,
                    b_values = std::size_t(n_blocks) * chunks * 256;
  if (packed.size() < a_values + b_values) packed.resize(a_values + b_values);
  uint32_t* const a_tiles = packed.data();
  uint32_t* const b_tiles = a_tiles + a_values;
  pack_a(trans_a, m, k, a, lda, m_blocks, chunks, a_tiles);
  pack_b(trans_b, k, n, b, ldb, n_blocks, chunks, b_tiles);
  const auto full = [](int) { return 16; };
  alignas(64) float sums[16][16];
  start_product<2, 2>(full, full, 16);  // configured once: a configuration costs a block's work
  for (int mb = 0; mb < m_blocks; mb += 2)
    for (int nb = 0; nb < n_blocks; nb += 2) {
      if (mb + nb > 0)
        for (int t = 0; t < 4; ++t) zero_tile(t);
      for (int kc = 0; kc < chunks; ++kc) {
        const void* a_rows[2] = {a_tiles + (std::ptrdiff_t(mb) * chunks + kc) * 256,
                                 a_tiles + (std::ptrdiff_t(mb + 1) * chunks + kc) * 256};
        const void* b_rows[2] = {b_tiles + (std::ptrdiff_t(nb) * chunks + kc) * 256,
                                 b_tiles + (std::ptrdiff_t(nb + 1) * chunks + kc) * 256};
        multiply_add<2, 2>(a_rows, 64, b_rows, 64);
      }
      // C = alpha sums + beta C (C not read where beta is 0), within m x n.
      for (int bm = 0; bm < 2; ++bm)
        for (int bn = 0; bn < 2; ++bn) {
          store_tile(sum_tile[bm][bn], &sums[0][0]);
          const int i0 = 16 * (mb + bm), j0 = 16 * (nb + bn);
          const __mmask16 columns = first_lanes(n - j0);
          for (int r = 0; r < 16 && i0 + r < m; ++r) {
            float* to = c + (i0 + r) * ldc + j0;
            __m512 v = _mm512_mul_ps(_mm512_set1_ps(alpha), _mm512_load_ps(sums[r]));
            if (beta != 0.0f)
              v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(columns, to), v);
            _mm512_mask_storeu_ps(to, columns, v);
          }
        }
    }
  memory_barrier();  // the tiles stay configured for the next call
}

/// `rounds` rounds of four independent full tile products (16 x 16 sums, 16 pairs): the
/// tiles' multiply-add ceiling. Returns the flops run.
double full_tile_products(std::size_t rounds) {
  alignas(64) static const uint32_t operands[16 * 16] = {};
  start_product<2, 2>([](int) { return 16; }, [](int) { return 16; }, 16);
  const void* a[2] = {operands, operands};
  _tile_loadd(4, a[0], 64);
  _tile_loadd(5, a[1], 64);
  _tile_loadd(6, operands, 64);
  _tile_loadd(7, operands, 64);
  for (std::size_t i = 0; i < rounds; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  release_tiles();
  return 4.0 * 2 * 16 * 16 * 32 * double(rounds);
}

#pragma GCC pop_options

}  // namespace

bool amx_tiles_usable() {
  static const bool usable = [] {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
    constexpr int request_permission = 0x1023, tile_data = 18;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    return syscall(SYS_arch_prctl, request_permission, tile_data) == 0;
  }();
  return usable;
}

void amx_correlate_tile(const uint32_t* const* planes, int x_taps, const std::ptrdiff_t* yz_offsets,
                        int yz_taps, std::ptrdiff_t pair_stride, int chunk_pairs, int chunks,
                        const uint32_t* weights, std::ptrdiff_t block_stride,
                        const OutputVector* vectors, int vector_count, float* out,
                        std::ptrdiff_t out_channel_stride, int rows, const float* bias) {
  SHARDTENSOR_REQUIRE(amx_tiles_usable(), "amx_correlate_tile", "AMX tiles do not run here");
  SHARDTENSOR_REQUIRE(rows >= 1 && rows <= 32 && chunk_pairs >= 1 && chunk_pairs <= 16 &&
                          vector_count >= 1 && vector_count <= (rows > 16 ? 2 : 3),
                      "amx_correlate_tile",
                      rows << " rows, " << vector_count << " vectors, " << chunk_pairs
                           << " pairs per chunk: outside the tiles");
  const auto args =
      std::make_tuple(planes, x_taps, yz_offsets, yz_taps, pair_stride, chunk_pairs, chunks,
                      weights, block_stride, vectors, out, out_channel_stride, rows, bias);
  if (rows > 16)
    return vector_count == 2 ? std::apply(correlate<2, 2>, args)
                             : std::apply(correlate<2, 1>, args);
  switch (vector_count) {
    case 3:
      return std::apply(correlate<1, 3>, args);
    case 2:
      return std::apply(correlate<1, 2>, args);
    default:
      return std::apply(correlate<1, 1>, args);
  }
}

void amx_weight_gradient_tile(const uint16_t* source, std::ptrdiff_t channel_stride,
                              std::ptrdiff_t row_stride, int channels, const uint32_t* dy_pairs,
                              std::ptrdiff_t dy_row_stride, int dy_channels, int outs, int rows,
                              int chunk_pairs, int chunks, float* gradient,
                              std::ptrdiff_t gradient_channel_stride) {
  SHARDTENSOR_REQUIRE(amx_tiles_usable(), "amx_weight_gradient_tile", "AMX tiles do not run here");
  SHARDTENSOR_REQUIRE(channels >= 1 && channels <= 32 && chunk_pairs >= 1 && chunk_pairs <= 16 &&
                          outs >= 1 && outs <= (channels > 16 ? 32 : 48),
                      "amx_weight_gradient_tile",
                      channels << " channels, " << outs << " outputs, " << chunk_pairs
                               << " pairs per chunk: outside the tiles");
  const auto args = std::make_tuple(source, channel_stride, row_stride, channels, dy_pairs,
                                    dy_row_stride, dy_channels, outs, rows, chunk_pairs, chunks,
                                    gradient, gradient_channel_stride);
  const int blocks = (outs + 15) / 16;
  if (channels > 16)
    return blocks == 2 ? std::apply(weight_gradient<2, 2>, args)
                       : std::apply(weight_gradient<2, 1>, args);
  switch (blocks) {
    case 3:
      return std::apply(weight_gradient<1, 3>, args);
    case 2:
      return std::apply(weight_gradient<1, 2>, args);
    default:
      return std::apply(weight_gradient<1, 1>, args);
  }
}

double amx_peak_products(std::size_t rounds) {
  return amx_tiles_usable() ? full_tile_products(rounds) : 0.0;
}

void amx_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
              std::ptrdiff_t lda, const float* b, std::ptrdiff_t ldb, float beta, float* c,
              std::ptrdiff_t ldc) {
  SHARDTENSOR_REQUIRE(amx_tiles_usable(), "amx_gemm", "AMX tiles do not run here");
  SHARDTENSOR_REQUIRE(m >= 0 && n >= 0 && k >= 0, "amx_gemm",
                      "a product of " << m << " x " << k << " by " << k << " x " << n);
  if (m == 0 || n == 0) return;
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#else  // not x86-64 with AMX in the compiler: never usable

bool amx_tiles_usable() {
  return false;
}
void amx_correlate_tile(const uint32_t* const*, int, const std::ptrdiff_t*, int, std::ptrdiff_t,
                        int, int, const uint32_t*, std::ptrdiff_t, const OutputVector*, int, float*,
                        std::ptrdiff_t, int, const float*) {
  SHARDTENSOR_FAIL("amx_correlate_tile", "this build has no AMX tiles");
}
double amx_peak_products(std::size_t) {
  return 0.0;
}
void amx_gemm(bool, bool, int, int, int, float, const float*, std::ptrdiff_t, const float*,
              std::ptrdiff_t, float, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("amx_gemm", "this build has no AMX tiles");
}
void amx_weight_gradient_tile(const uint16_t*, std::ptrdiff_t, std::ptrdiff_t, int, const uint32_t*,
                              std::ptrdiff_t, int, int, int, int, int, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("amx_weight_gradient_tile", "this build has no AMX tiles");
}

#endif

}  // namespace shardtensor::kernels::host

namespace shardtensor::kernels {

bool bf16_matrix_tiles() {
  return host::pair_tiles_use_dot() && host::amx_tiles_allowed() && host::amx_tiles_usable();
}
void allow_bf16_matrix_tiles(bool allow) {
  host::allow_amx_tiles(allow);
}
double run_bf16_tile_products(std::size_t rounds) {
  return host::amx_peak_products(rounds);
}

}  // namespace shardtensor::kernels
