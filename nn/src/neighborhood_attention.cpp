// Neighbourhood (window) attention (see neighborhood_attention.hpp and docs/attention.md).
//
// Compute runs on host copies in channel-last ("packed") order, [batch][cell][channel], so
// that each head's head_dim values of a cell are contiguous: the inner loops (dot products
// and weighted sums over head_dim) run over consecutive memory. K and V share one packed
// buffer over the padded grid (owned cells plus ghosts), K in channels [0, C) and V in
// [C, 2C) of every cell, so one halo exchange (of a 2C-channel field) fills both and one
// adjoint exchange returns both gradients.

#include "shardtensor/nn/neighborhood_attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/comm/halo_plan_cache.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {
namespace {

constexpr const char* where = "neighborhood_attention";

/// Everything about the window and the local grid that the kernels need; all of it follows
/// from the decomposition and the options, so every rank knows every rank's part.
struct Geometry {
  int ndims = 1;
  Index batch = 0, channels = 0, heads = 0, head_dim = 0;
  SpatialIndex local{1, 1, 1};   // owned cells per axis
  SpatialIndex padded{1, 1, 1};  // owned + ghost cells per axis
  SpatialIndex window{1, 1, 1}, dilation{1, 1, 1};
  GhostWidths ghosts;  // dilation * (keys below the query) / dilation * (keys above)
  /// Owned cells (0-based owned indices) whose windows read no exchanged ghost cell: they
  /// can be computed while the halo messages travel.
  Box early;
  /// Per axis and owned index x: the window positions o in [first, last) whose keys lie in
  /// the field (all of them along periodic axes). Key o of x sits at padded index
  /// x + dilation * o (the ghost width below is dilation * lower).
  std::array<std::vector<Index>, max_spatial_dims> first, last;

  Index cells() const { return local[0] * local[1] * local[2]; }
  Index padded_cells() const { return padded[0] * padded[1] * padded[2]; }
  Index window_cells() const { return window[0] * window[1] * window[2]; }
};

/// Cells below the query in a window of `window` keys (the rest, window - 1 - lower, above):
/// centred for odd windows, one more above than below for even ones.
Index keys_below(Index window) {
  return (window - 1) / 2;
}

/// The option's value along `axis`: one entry applies to every axis.
Index per_axis(const std::vector<Index>& values, int axis) {
  return values.size() == 1 ? values[0] : values[axis];
}

/// A packed (channel-last) array over a grid of cells: element (n, x, y, z, c) at
/// ((n * X + x) * Y + y) * Z + z) * channels + c.
struct PackedGrid {
  SpatialIndex extent{1, 1, 1};
  Index channels = 1;
  Index cell(Index x, Index y, Index z) const { return (x * extent[1] + y) * extent[2] + z; }
  Index cells() const { return extent[0] * extent[1] * extent[2]; }
  Index size(Index batch) const { return batch * cells() * channels; }
};

/// Copies channels [src_c0, src_c0 + count) of `box` (local indices of `src`, an (N, C, x, y, z)
/// host View) into packed channels [dst_c0, dst_c0 + count) of the grid cells box + shift.
template <class T, class View>
void box_to_packed(const View& src, const Box& box, Index src_c0, Index count, T* dst,
                   const PackedGrid& grid, const SpatialIndex& shift, Index dst_c0) {
  const Index batch = src.extent(0);
  for (Index n = 0; n < batch; ++n)
    for (Index c = 0; c < count; ++c)
      for (Index x = box.lower[0]; x < box.upper(0); ++x)
        for (Index y = box.lower[1]; y < box.upper(1); ++y) {
          T* out = dst +
                   (n * grid.cells() + grid.cell(x + shift[0], y + shift[1], 0)) * grid.channels +
                   dst_c0 + c;
          for (Index z = box.lower[2]; z < box.upper(2); ++z)
            out[(z + shift[2]) * grid.channels] = src(n, src_c0 + c, x, y, z);
        }
}

/// The reverse of box_to_packed: writes (or, with `add`, adds) packed channels
/// [src_c0, src_c0 + count) of the grid cells box + shift into channels [dst_c0, ...) of `box`
/// of `dst`.
template <class T, class View>
void packed_to_box(const T* src, const PackedGrid& grid, const SpatialIndex& shift, Index src_c0,
                   Index count, const View& dst, const Box& box, Index dst_c0, bool add) {
  const Index batch = dst.extent(0);
  for (Index n = 0; n < batch; ++n)
    for (Index c = 0; c < count; ++c)
      for (Index x = box.lower[0]; x < box.upper(0); ++x)
        for (Index y = box.lower[1]; y < box.upper(1); ++y) {
          const T* in =
              src + (n * grid.cells() + grid.cell(x + shift[0], y + shift[1], 0)) * grid.channels +
              src_c0 + c;
          for (Index z = box.lower[2]; z < box.upper(2); ++z) {
            T& cell = dst(n, dst_c0 + c, x, y, z);
            const T value = in[(z + shift[2]) * grid.channels];
            cell = add ? cell + value : value;
          }
        }
}

/// dst(n, dst_c0 + c, cells of dst_box) = (or, with `add`, +=) src(n, src_c0 + c, cells of
/// src_box) for `count` channels; both boxes have the same extents; both host Views keep z
/// contiguous (LayoutRight), so rows copy as plain loops.
template <class Src, class Dst>
void copy_rows(const Src& src, const Box& src_box, Index src_c0, const Dst& dst, const Box& dst_box,
               Index dst_c0, Index count, bool add) {
  const Index batch = src.extent(0), nz = src_box.extent[2];
  for (Index n = 0; n < batch; ++n)
    for (Index c = 0; c < count; ++c)
      for (Index x = 0; x < src_box.extent[0]; ++x)
        for (Index y = 0; y < src_box.extent[1]; ++y) {
          const auto* __restrict in =
              &src(n, src_c0 + c, src_box.lower[0] + x, src_box.lower[1] + y, src_box.lower[2]);
          auto* __restrict out =
              &dst(n, dst_c0 + c, dst_box.lower[0] + x, dst_box.lower[1] + y, dst_box.lower[2]);
          if (add)
            for (Index z = 0; z < nz; ++z) out[z] += in[z];
          else
            for (Index z = 0; z < nz; ++z) out[z] = in[z];
        }
}

/// Cells of `outer` not in `inner` (inner inside outer, or empty) as at most 6 disjoint boxes.
std::vector<Box> box_minus(const Box& outer, const Box& inner) {
  if (inner.empty()) return {outer};
  std::vector<Box> out;
  Box rest = outer;
  for (int a = 0; a < max_spatial_dims; ++a) {
    if (inner.lower[a] > rest.lower[a]) {
      Box below = rest;
      below.extent[a] = inner.lower[a] - rest.lower[a];
      out.push_back(below);
    }
    if (inner.upper(a) < rest.upper(a)) {
      Box above = rest;
      above.lower[a] = inner.upper(a);
      above.extent[a] = rest.upper(a) - inner.upper(a);
      out.push_back(above);
    }
    rest.lower[a] = inner.lower[a];
    rest.extent[a] = inner.extent[a];
  }
  return out;
}

Box whole(const SpatialIndex& extent) {
  Box b;
  b.extent = extent;
  return b;
}

/// Padded-grid cell indices (within one batch entry) of the keys query (x, y, z) sees, in
/// window order; returns how many.
inline Index gather_keys(const Geometry& g, Index x, Index y, Index z, Index* keys) {
  Index count = 0;
  for (Index ox = g.first[0][x]; ox < g.last[0][x]; ++ox) {
    const Index px = x + g.dilation[0] * ox;
    for (Index oy = g.first[1][y]; oy < g.last[1][y]; ++oy) {
      const Index row = (px * g.padded[1] + y + g.dilation[1] * oy) * g.padded[2] + z;
      for (Index oz = g.first[2][z]; oz < g.last[2][z]; ++oz)
        keys[count++] = row + g.dilation[2] * oz;
    }
  }
  return count;
}

/// Dot product with 8 independent partial sums, so the compiler can vectorise it without
/// reassociating (strict IEEE) arithmetic.
template <class T>
inline T dot(const T* __restrict a, const T* __restrict b, Index n) {
  T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  Index i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/// y += alpha * x over n values.
template <class T>
inline void axpy(T alpha, const T* __restrict x, T* __restrict y, Index n) {
  for (Index i = 0; i < n; ++i) y[i] += alpha * x[i];
}

/// A host array left uninitialised (for buffers written in full before they are read).
template <class T>
class RawBuffer {
 public:
  void resize(Index size) { data_.reset(new T[static_cast<std::size_t>(size)]); }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }

 private:
  std::unique_ptr<T[]> data_;
};

/// Host copies of the forward's inputs and results, kept for backward.
template <class T>
struct Saved {
  std::vector<T> q;    // packed owned cells, C channels
  RawBuffer<T> kv;     // packed padded cells, K then V (2C channels); every cell is written
  std::vector<T> out;  // packed owned cells, C channels
  std::vector<T> lse;  // per (batch, owned cell, head): log-sum-exp of the scaled scores
};

/// Forward for the queries in `box` (owned indices): out = softmax(scores) V per head, and
/// the log-sum-exp of every softmax row.
template <class T>
void forward_cells(const Geometry& g, const Box& box, Saved<T>& s, std::vector<Index>& keys,
                   std::vector<T>& scores) {
  const Index C = g.channels, D = g.head_dim, H = g.heads, KV = 2 * C;
  const T scale = T(1) / std::sqrt(T(D));
  for (Index n = 0; n < g.batch; ++n) {
    const T* kv = s.kv.data() + n * g.padded_cells() * KV;
    for (Index x = box.lower[0]; x < box.upper(0); ++x)
      for (Index y = box.lower[1]; y < box.upper(1); ++y)
        for (Index z = box.lower[2]; z < box.upper(2); ++z) {
          const Index count = gather_keys(g, x, y, z, keys.data());
          const Index row = n * g.cells() + (x * g.local[1] + y) * g.local[2] + z;
          const T* q = s.q.data() + row * C;
          T* out = s.out.data() + row * C;
          for (Index h = 0; h < H; ++h) {
            const T* qh = q + h * D;
            T max_score = -std::numeric_limits<T>::infinity();
            for (Index j = 0; j < count; ++j) {
              scores[j] = scale * dot(qh, kv + keys[j] * KV + h * D, D);
              max_score = std::max(max_score, scores[j]);
            }
            T* oh = out + h * D;
            std::fill(oh, oh + D, T(0));
            T sum = 0;
            for (Index j = 0; j < count; ++j) {
              const T p = std::exp(scores[j] - max_score);
              sum += p;
              axpy(p, kv + keys[j] * KV + C + h * D, oh, D);
            }
            const T inverse = T(1) / sum;
            for (Index d = 0; d < D; ++d) oh[d] *= inverse;
            s.lse[row * H + h] = max_score + std::log(sum);
          }
        }
  }
}

/// Backward for the queries in `box`: P is recomputed from the saved log-sum-exp;
/// dQ accumulates into `dq` (packed owned), dK/dV into `dkv` (packed padded, like s.kv).
template <class T>
void backward_cells(const Geometry& g, const Box& box, const Saved<T>& s,
                    const std::vector<T>& dout, std::vector<T>& dq, std::vector<T>& dkv,
                    std::vector<Index>& keys) {
  const Index C = g.channels, D = g.head_dim, H = g.heads, KV = 2 * C;
  const T scale = T(1) / std::sqrt(T(D));
  for (Index n = 0; n < g.batch; ++n) {
    const T* kv = s.kv.data() + n * g.padded_cells() * KV;
    T* dkv_n = dkv.data() + n * g.padded_cells() * KV;
    for (Index x = box.lower[0]; x < box.upper(0); ++x)
      for (Index y = box.lower[1]; y < box.upper(1); ++y)
        for (Index z = box.lower[2]; z < box.upper(2); ++z) {
          const Index count = gather_keys(g, x, y, z, keys.data());
          const Index row = n * g.cells() + (x * g.local[1] + y) * g.local[2] + z;
          for (Index h = 0; h < H; ++h) {
            const Index at = row * C + h * D;
            const T* qh = s.q.data() + at;
            const T* doh = dout.data() + at;
            T* dqh = dq.data() + at;
            const T delta = dot(doh, s.out.data() + at, D);  // dO . O = sum_j P_j dO . V_j
            const T lse = s.lse[row * H + h];
            for (Index j = 0; j < count; ++j) {
              const Index key = keys[j] * KV + h * D;
              const T* kj = kv + key;
              const T* vj = kv + key + C;
              const T p = std::exp(scale * dot(qh, kj, D) - lse);
              const T ds = scale * p * (dot(doh, vj, D) - delta);  // d(score) times scale
              axpy(p, doh, dkv_n + key + C, D);                    // dV_j += P dO
              axpy(ds, kj, dqh, D);                                // dQ += dS K_j
              axpy(ds, qh, dkv_n + key, D);                        // dK_j += dS Q
            }
          }
        }
  }
}

/// Checks the options and layouts; returns the first problem found ("" if none). Everything
/// checked is the same on every rank except the local layouts of q, k and v.
template <class T>
std::string validate(const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                     const Variable<T>& v, const NeighborhoodAttentionOptions& options) {
  std::ostringstream error;
  const ShardTensor<T>& qf = q.value();
  const Decomposition& dec = qf.decomposition();
  const int ndims = dec.ndims();
  if (dec.nranks() != comm.size() || qf.rank() != comm.rank()) {
    error << "the decomposition (" << dec.describe() << ") has " << dec.nranks()
          << " parts and this is the shard of rank " << qf.rank() << ", but the communicator has "
          << comm.size() << " ranks (this is rank " << comm.rank()
          << "): one part per rank is required";
    return error.str();
  }
  for (const Variable<T>* other : {&k, &v}) {
    const ShardTensor<T>& f = other->value();
    if (f.decomposition() != dec || f.batch() != qf.batch() || f.channels() != qf.channels() ||
        f.rank() != qf.rank()) {
      error << "q, k and v layouts differ: '" << q.name() << "' has batch " << qf.batch()
            << ", channels " << qf.channels() << ", " << dec.describe() << "; '" << other->name()
            << "' has batch " << f.batch() << ", channels " << f.channels() << ", "
            << f.decomposition().describe();
      return error.str();
    }
  }
  if (options.heads < 1) {
    error << "heads must be at least 1, got " << options.heads;
    return error.str();
  }
  if (qf.channels() % options.heads != 0) {
    error << "channels " << qf.channels() << " not divisible by heads " << options.heads;
    return error.str();
  }
  const std::pair<const char*, const std::vector<Index>*> lists[2] = {
      {"window", &options.window}, {"dilation", &options.dilation}};
  for (const auto& list : lists) {
    if (list.second->size() != 1 && list.second->size() != static_cast<std::size_t>(ndims)) {
      error << list.first << " has " << list.second->size()
            << " entries; give one (every axis) or one per axis of the " << ndims << "-D field";
      return error.str();
    }
    for (int a = 0; a < ndims; ++a)
      if (per_axis(*list.second, a) < 1) {
        error << list.first << " " << per_axis(*list.second, a) << " along axis " << a
              << " must be at least 1";
        return error.str();
      }
  }
  for (int a = 0; a < ndims; ++a) {
    const Index window = per_axis(options.window, a), dilation = per_axis(options.dilation, a);
    const Index span = (window - 1) * dilation + 1;
    if (span > dec.global_extent(a)) {
      error << "window " << window << " with dilation " << dilation << " spans " << span
            << " cells along axis " << a << ", more than the global extent " << dec.global_extent(a)
            << (dec.periodic(a) ? " (periodic)" : "");
      return error.str();
    }
  }
  // Ghost regions may reach only into the adjacent shard: every shard with a neighbour on a
  // side must own at least the halo width that neighbour reads from it.
  for (int a = 0; a < ndims; ++a) {
    const Index dilation = per_axis(options.dilation, a), window = per_axis(options.window, a);
    const Index below = dilation * keys_below(window);
    const Index above = dilation * (window - 1 - keys_below(window));
    Direction up{0, 0, 0}, down{0, 0, 0};
    up[a] = 1;
    down[a] = -1;
    for (int r = 0; r < dec.nranks(); ++r) {
      const Index extent = dec.extent(r, a);
      // The neighbour above reads `below` of r's cells; the one below reads `above` of them.
      const std::pair<Index, bool> needs[2] = {{below, dec.neighbor(r, up) != no_neighbor},
                                               {above, dec.neighbor(r, down) != no_neighbor}};
      for (const auto& need : needs)
        if (need.second && need.first > extent) {
          error << "halo width " << need.first << " (window " << window << ", dilation " << dilation
                << ") along axis " << a << " exceeds the local extent " << extent << " of rank "
                << r
                << ": every shard must own at least the halo width its neighbours read (use "
                   "fewer ranks along this axis or a smaller window or dilation)";
          return error.str();
        }
    }
  }
  return "";
}

}  // namespace

template <class T>
Variable<T> neighborhood_attention(const Communicator& comm, const Variable<T>& q,
                                   const Variable<T>& k, const Variable<T>& v,
                                   const NeighborhoodAttentionOptions& options) {
  SHARDTENSOR_REQUIRE(q.defined() && k.defined() && v.defined(), where,
                      "q, k and v must be defined Variables");
  SHARDTENSOR_REQUIRE(q.is_field() && k.is_field() && v.is_field(), where,
                      "q, k and v must be sharded fields, got '" << q.name() << "', '" << k.name()
                                                                 << "', '" << v.name() << "'");
  const ShardTensor<T>& qf = q.value();
  const Decomposition& dec = qf.decomposition();

  // One allreduce: any rank's problem, or batch/channels that differ between ranks, makes
  // every rank throw (so none is left waiting in the halo exchange).
  const std::string local_error = validate(comm, q, k, v, options);
  comm.agree(local_error.empty() ? local_error : std::string(where) + ": " + local_error);
  comm.require_same({qf.batch(), qf.channels()}, where, "(batch, channels)");

  auto g = std::make_shared<Geometry>();
  g->ndims = dec.ndims();
  g->batch = qf.batch();
  g->channels = qf.channels();
  g->heads = options.heads;
  g->head_dim = qf.channels() / options.heads;
  const int rank = comm.rank();
  const Box owned = dec.box(rank);
  for (int a = 0; a < max_spatial_dims; ++a) {
    g->local[a] = owned.extent[a];
    if (a < g->ndims) {
      g->window[a] = per_axis(options.window, a);
      g->dilation[a] = per_axis(options.dilation, a);
    }
    const Index below = keys_below(g->window[a]);
    g->ghosts.lower[a] = static_cast<int>(g->dilation[a] * below);
    g->ghosts.upper[a] = static_cast<int>(g->dilation[a] * (g->window[a] - 1 - below));
    g->padded[a] = g->local[a] + g->ghosts.lower[a] + g->ghosts.upper[a];

    // Keys inside the field per owned index (all of them along a periodic axis).
    const Index extent = dec.global_extent(a), dil = g->dilation[a];
    g->first[a].resize(g->local[a]);
    g->last[a].resize(g->local[a]);
    for (Index x = 0; x < g->local[a]; ++x) {
      const Index global = owned.lower[a] + x;
      if (dec.periodic(a)) {
        g->first[a][x] = 0;
        g->last[a][x] = g->window[a];
      } else {  // 0 <= global + dil * (o - below) <= extent - 1
        g->first[a][x] = std::max<Index>(0, below - global / dil);
        g->last[a][x] = std::min<Index>(g->window[a], below + (extent - 1 - global) / dil + 1);
      }
    }

    // Early queries: windows inside the owned cells where a neighbour fills the ghosts.
    Direction up{0, 0, 0}, down{0, 0, 0};
    up[a] = 1;
    down[a] = -1;
    const bool has_below = a < g->ndims && dec.neighbor(rank, down) != no_neighbor;
    const bool has_above = a < g->ndims && dec.neighbor(rank, up) != no_neighbor;
    const Index lo = has_below ? std::min<Index>(g->local[a], g->ghosts.lower[a]) : 0;
    const Index hi =
        has_above ? std::max<Index>(lo, g->local[a] - g->ghosts.upper[a]) : g->local[a];
    g->early.lower[a] = lo;
    g->early.extent[a] = hi - lo;
  }

  const Index C = g->channels, N = g->batch;
  const PackedGrid owned_grid{g->local, C};
  const PackedGrid padded_grid{g->padded, 2 * C};
  const SpatialIndex to_padded{g->ghosts.lower[0], g->ghosts.lower[1], g->ghosts.lower[2]};
  const Box owned_box = whole(g->local);
  const Box padded_interior = owned_box.shifted(to_padded);

  // K and V into one padded 2C-channel field; start its halo exchange.
  const ShardTensor<T>& kf = k.value();
  const ShardTensor<T>& vf = v.value();
  ShardTensor<T> padded(dec, rank, N, 2 * C, g->ghosts, "neighborhood_attention kv");
  // Host copies (the Views themselves in host memory).
  const auto host_padded = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), padded.view());
  const auto host_k = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kf.view());
  const auto host_v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), vf.view());
  copy_rows(host_k, kf.interior_box(), 0, host_padded, padded_interior, 0, C, false);
  copy_rows(host_v, vf.interior_box(), 0, host_padded, padded_interior, C, C, false);
  Kokkos::deep_copy(padded.view(), host_padded);
  const std::shared_ptr<HaloExchange<T>> plan = HaloPlanCache<T>::shared(comm).plan(padded, where);
  plan->start(padded);

  // While the messages travel: pack Q and the owned K/V, compute the early queries.
  auto saved = std::make_shared<Saved<T>>();
  saved->q.resize(owned_grid.size(N));
  saved->kv.resize(padded_grid.size(N));
  saved->out.resize(owned_grid.size(N));
  saved->lse.resize(N * g->cells() * g->heads);
  const SpatialIndex none{0, 0, 0};
  {
    const auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), qf.view());
    box_to_packed(
        hq, qf.interior_box(), 0, C, saved->q.data(), owned_grid,
        {-Index(qf.ghosts().lower[0]), -Index(qf.ghosts().lower[1]), -Index(qf.ghosts().lower[2])},
        0);
    box_to_packed(host_padded, padded_interior, 0, 2 * C, saved->kv.data(), padded_grid, none, 0);
  }
  std::vector<Index> keys(g->window_cells());
  std::vector<T> scores(g->window_cells());
  forward_cells(*g, g->early, *saved, keys, scores);
  plan->finish(padded);

  // Ghost K/V into the packed buffer, then the queries near the shard's faces.
  {
    Kokkos::deep_copy(host_padded, padded.view());
    for (const Box& b : box_minus(whole(g->padded), padded_interior))
      box_to_packed(host_padded, b, 0, 2 * C, saved->kv.data(), padded_grid, none, 0);
  }
  for (const Box& b : box_minus(owned_box, g->early)) forward_cells(*g, b, *saved, keys, scores);

  auto node = make_result_node<T>("neighborhood_attention", {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>::uninitialized(dec, rank, N, C, {}, "neighborhood_attention");
  {
    auto host = Kokkos::create_mirror_view(node->field.view());
    packed_to_box(saved->out.data(), owned_grid, none, 0, C, host, owned_box, 0, false);
    Kokkos::deep_copy(node->field.view(), host);
  }
  if (!node->requires_grad) return Variable<T>(node);

  node->backward = [g, plan, saved, owned_grid, padded_grid, owned_box, padded_interior, dec,
                    rank](impl::Node<T>& self) {
    const Index C = g->channels, N = g->batch;
    const SpatialIndex none{0, 0, 0};
    const ShardTensor<T>& grad = self.grad_field();
    std::vector<T> dout(owned_grid.size(N));
    {
      const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad.view());
      box_to_packed(host, grad.interior_box(), 0, C, dout.data(), owned_grid,
                    {-Index(grad.ghosts().lower[0]), -Index(grad.ghosts().lower[1]),
                     -Index(grad.ghosts().lower[2])},
                    0);
    }
    std::vector<T> dq(owned_grid.size(N), T(0)), dkv(padded_grid.size(N), T(0));
    std::vector<Index> keys(g->window_cells());
    const bool need_kv = self.inputs[1]->requires_grad || self.inputs[2]->requires_grad;

    // Queries near the faces first: they complete the ghost keys' gradients, which go back
    // to their owners while the interior queries are computed.
    for (const Box& b : box_minus(owned_box, g->early))
      backward_cells(*g, b, *saved, dout, dq, dkv, keys);
    ShardTensor<T> padded_grad;
    typename FieldView<T>::HostMirror host_grad;
    if (need_kv) {
      padded_grad = ShardTensor<T>(dec, rank, N, 2 * C, g->ghosts, "neighborhood_attention dkv");
      host_grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), padded_grad.view());
      for (const Box& b : box_minus(whole(g->padded), padded_interior))
        packed_to_box(dkv.data(), padded_grid, none, 0, 2 * C, host_grad, b, 0, false);
      Kokkos::deep_copy(padded_grad.view(), host_grad);
      plan->reverse_start(padded_grad);
    }
    backward_cells(*g, g->early, *saved, dout, dq, dkv, keys);

    auto add_into = [&](impl::Node<T>& input, auto&& add_owned) {
      const ShardTensor<T>& target = input.grad_field();
      auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target.view());
      add_owned(host, target.interior_box());
      Kokkos::deep_copy(target.view(), host);
    };
    if (self.inputs[0]->requires_grad)
      add_into(*self.inputs[0], [&](const auto& host, const Box& box) {
        packed_to_box(dq.data(), owned_grid, {-box.lower[0], -box.lower[1], -box.lower[2]}, 0, C,
                      host, box, 0, true);
      });
    if (!need_kv) return;
    plan->reverse_finish(padded_grad);
    // Owned dK/dV: neighbours' contributions (now in padded_grad) plus this rank's own.
    Kokkos::deep_copy(host_grad, padded_grad.view());
    packed_to_box(dkv.data(), padded_grid, none, 0, 2 * C, host_grad, padded_interior, 0, true);
    for (int i = 1; i <= 2; ++i) {
      if (!self.inputs[i]->requires_grad) continue;
      add_into(*self.inputs[i], [&](const auto& host, const Box& box) {
        copy_rows(host_grad, padded_interior, (i - 1) * C, host, box, 0, C, true);
      });
    }
  };
  return Variable<T>(node);
}

template Variable<float> neighborhood_attention(const Communicator&, const Variable<float>&,
                                                const Variable<float>&, const Variable<float>&,
                                                const NeighborhoodAttentionOptions&);
template Variable<double> neighborhood_attention(const Communicator&, const Variable<double>&,
                                                 const Variable<double>&, const Variable<double>&,
                                                 const NeighborhoodAttentionOptions&);

}  // namespace shardtensor
