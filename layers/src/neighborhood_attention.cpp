// Neighbourhood (window) attention (see neighborhood_attention.hpp and docs/attention.md).
//
// Compute runs on host copies in channel-last ("packed") order, [batch][cell][channel], so
// that each head's head_dim values of a cell are contiguous: the inner loops (dot products
// and weighted sums over head_dim) run over consecutive memory. K and V share one packed
// buffer over the padded grid (owned cells plus ghosts), K in channels [0, C) and V in
// [C, 2C) of every cell, so one halo exchange (of a 2C-channel field) fills both and one
// adjoint exchange returns both gradients.

#include "shardtensor/layers/neighborhood_attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/comm/halo_plan_cache.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/bfloat16_rounding.hpp"
#include "shardtensor/kernels/neighborhood_attention.hpp"

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
  /// The same for the kernels, with per axis and owned index x the window positions
  /// o in [first, last) whose keys lie in the field (all of them along periodic axes).
  kernels::NeighborhoodGrid grid;

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

/// The forward's inputs and results, channel-last, kept for backward.
template <class T>
struct Saved {
  kernels::PackedRows<T> q;    // owned cells, C channels
  kernels::PackedRows<T> kv;   // padded cells, K then V (2C channels)
  kernels::PackedRows<T> out;  // owned cells, C channels
  kernels::PackedRows<T> lse;  // owned cells, heads: log-sum-exp of the scaled scores
};

SpatialIndex negated(const GhostWidths& w) {
  return {-Index(w.lower[0]), -Index(w.lower[1]), -Index(w.lower[2])};
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
  if (options.bf16 && !std::is_same<T, float>::value)
    return "bf16 operands need a float model, this one is double";
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

/// The windows, ghost widths, early-query box and per-index key ranges of one call.
std::shared_ptr<const Geometry> plan_geometry(const Decomposition& dec, int rank, Index batch,
                                              Index channels,
                                              const NeighborhoodAttentionOptions& options) {
  auto g = std::make_shared<Geometry>();
  g->ndims = dec.ndims();
  g->batch = batch;
  g->channels = channels;
  g->heads = options.heads;
  g->head_dim = channels / options.heads;
  const Box owned = dec.box(rank);
  const Index longest = std::max({owned.extent[0], owned.extent[1], owned.extent[2]});
  auto first = Kokkos::View<Index**, Kokkos::LayoutRight, Kokkos::HostSpace>(
      "neighborhood_attention first", 3, longest);
  auto last = Kokkos::View<Index**, Kokkos::HostSpace>("neighborhood_attention last", 3, longest);
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
    for (Index x = 0; x < g->local[a]; ++x) {
      const Index global = owned.lower[a] + x;
      if (dec.periodic(a)) {
        first(a, x) = 0;
        last(a, x) = g->window[a];
      } else {  // 0 <= global + dil * (o - below) <= extent - 1
        first(a, x) = std::max<Index>(0, below - global / dil);
        last(a, x) = std::min<Index>(g->window[a], below + (extent - 1 - global) / dil + 1);
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
  kernels::NeighborhoodGrid& grid = g->grid;
  grid.batch = g->batch;
  grid.channels = g->channels;
  grid.heads = g->heads;
  grid.head_dim = g->head_dim;
  for (int a = 0; a < max_spatial_dims; ++a) {
    grid.local[a] = g->local[a];
    grid.padded[a] = g->padded[a];
    grid.window[a] = g->window[a];
    grid.dilation[a] = g->dilation[a];
  }
  grid.first = Kokkos::create_mirror_view_and_copy(DefaultMemorySpace(), first);
  grid.last = Kokkos::create_mirror_view_and_copy(DefaultMemorySpace(), last);

  return g;
}

using kernels::pack_rows;
using kernels::PackedRows;
using kernels::unpack_rows;

/// Rounds packed rows to bfloat16 in place (a bf16 call's operands; float only).
template <class T>
void round_rows(const PackedRows<T>& rows) {
  kernels::round_to_bfloat16(ExecutionSpace(), rows.data(), rows.data(), rows.span());
}

/// The backward of one call: dQ, and dK/dV with the ghost keys' gradients sent back to their
/// owners (the halo adjoint) while the owned ones are computed.
template <class T>
struct Backward {
  std::shared_ptr<const Geometry> g;
  std::shared_ptr<HaloExchange<T>> plan;
  std::shared_ptr<Saved<T>> saved;
  Box owned_box, padded_interior;
  Decomposition dec;
  int rank;
  SpatialIndex to_padded;
  bool bf16;

  void operator()(impl::Node<T>& self) const {
    const Index C = g->channels, N = g->batch, H = g->heads;
    const SpatialIndex none{0, 0, 0};
    const ShardTensor<T>& grad = self.grad_field();
    const auto scratch = [&](const char* label, Index rows, Index columns) {
      return PackedRows<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                           rows, columns);
    };
    const PackedRows<T> dout = scratch("neighborhood dout", N * g->cells(), C);
    const PackedRows<T> delta = scratch("neighborhood delta", N * g->cells(), H);
    pack_rows(ExecutionSpace(), grad.view(), grad.interior_box(), 0, C, dout, g->local,
              negated(grad.ghosts()), 0);
    if (bf16) round_rows(dout);  // an operand of dV = P^T dO and dP = dO V^T
    kernels::neighborhood_delta(ExecutionSpace(), g->grid, dout, saved->out, delta);
    const bool need_kv = self.inputs[1]->requires_grad || self.inputs[2]->requires_grad;

    // The ghost keys' gradients first: they go back to their owners while the queries' and
    // the owned keys' gradients are computed.
    ShardTensor<T> padded_grad;
    PackedRows<T> dkv;
    if (need_kv) {
      dkv = scratch("neighborhood dkv", N * g->grid.padded_cells(), 2 * C);
      padded_grad = ShardTensor<T>(dec, rank, N, 2 * C, g->ghosts, "neighborhood_attention dkv");
      for (const Box& b : box_minus(whole(g->padded), padded_interior)) {
        kernels::neighborhood_backward_keys(ExecutionSpace(), g->grid, b, saved->q, saved->kv, dout,
                                            saved->lse, delta, dkv);
        unpack_rows(ExecutionSpace(), dkv, g->padded, none, 0, 2 * C, padded_grad.view(), b, 0,
                    false);
      }
      plan->reverse_start(padded_grad);
    }
    if (self.inputs[0]->requires_grad) {
      const PackedRows<T> dq = scratch("neighborhood dq", N * g->cells(), C);
      kernels::neighborhood_backward_queries(ExecutionSpace(), g->grid, saved->q, saved->kv, dout,
                                             saved->lse, delta, dq);
      const ShardTensor<T>& target = self.inputs[0]->grad_field();
      unpack_rows(ExecutionSpace(), dq, g->local, negated(target.ghosts()), 0, C, target.view(),
                  target.interior_box(), 0, true);
    }
    if (!need_kv) return;
    kernels::neighborhood_backward_keys(ExecutionSpace(), g->grid, padded_interior, saved->q,
                                        saved->kv, dout, saved->lse, delta, dkv);
    plan->reverse_finish(padded_grad);
    // Owned dK/dV: the neighbours' contributions (now in padded_grad) plus this rank's own,
    // gathered into the packed rows, then added into the inputs' gradients.
    unpack_rows(ExecutionSpace(), dkv, g->padded, none, 0, 2 * C, padded_grad.view(),
                padded_interior, 0, true);
    pack_rows(ExecutionSpace(), padded_grad.view(), padded_interior, 0, 2 * C, dkv, g->padded, none,
              0);
    for (int i = 1; i <= 2; ++i) {
      if (!self.inputs[i]->requires_grad) continue;
      const ShardTensor<T>& target = self.inputs[i]->grad_field();
      unpack_rows(ExecutionSpace(), dkv, g->padded, field_to_padded(target), (i - 1) * C, C,
                  target.view(), target.interior_box(), 0, true);
    }
  }

 private:
  /// A field's local cell -> the padded grid's cell.
  SpatialIndex field_to_padded(const ShardTensor<T>& f) const {
    const SpatialIndex below = negated(f.ghosts());
    return SpatialIndex{below[0] + to_padded[0], below[1] + to_padded[1], below[2] + to_padded[2]};
  }
};

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

  const int rank = comm.rank();
  const std::shared_ptr<const Geometry> g =
      plan_geometry(dec, rank, qf.batch(), qf.channels(), options);
  const Index C = g->channels, N = g->batch, H = g->heads;
  const SpatialIndex to_padded{g->ghosts.lower[0], g->ghosts.lower[1], g->ghosts.lower[2]};
  const SpatialIndex none{0, 0, 0};
  const Box owned_box = whole(g->local);
  const Box padded_interior = owned_box.shifted(to_padded);
  // K and V into the packed rows of the padded grid (K then V), and from there into the
  // interior of one padded 2C-channel field; start its halo exchange.
  const ShardTensor<T>& kf = k.value();
  const ShardTensor<T>& vf = v.value();
  auto saved = std::make_shared<Saved<T>>();
  {
    MemoryCategoryScope memory(MemoryCategory::activations);
    saved->kv = PackedRows<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "neighborhood kv"),
                              N * g->grid.padded_cells(), 2 * C);
    saved->q = PackedRows<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "neighborhood q"),
                             N * g->cells(), C);
    saved->out = PackedRows<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "neighborhood out"),
                               N * g->cells(), C);
    saved->lse = PackedRows<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "neighborhood lse"),
                               N * g->cells(), H);
  }
  const auto field_to_padded = [to_padded](const ShardTensor<T>& f) {  // local -> padded cell
    const SpatialIndex below = negated(f.ghosts());
    return SpatialIndex{below[0] + to_padded[0], below[1] + to_padded[1], below[2] + to_padded[2]};
  };
  pack_rows(ExecutionSpace(), kf.view(), kf.interior_box(), 0, C, saved->kv, g->padded,
            field_to_padded(kf), 0);
  pack_rows(ExecutionSpace(), vf.view(), vf.interior_box(), 0, C, saved->kv, g->padded,
            field_to_padded(vf), C);
  if (options.bf16) round_rows(saved->kv);  // the ghosts come rounded from their owners
  ShardTensor<T> padded(dec, rank, N, 2 * C, g->ghosts, "neighborhood_attention kv");
  unpack_rows(ExecutionSpace(), saved->kv, g->padded, none, 0, 2 * C, padded.view(),
              padded_interior, 0, false);
  const std::shared_ptr<HaloExchange<T>> plan = HaloPlanCache<T>::shared(comm).plan(padded, where);
  plan->start(padded, options.bf16 ? plan->wire_for_bfloat16_values() : HaloWire::native,
              OwnedCells::unchanged);  // only the packed rows are read meanwhile

  // While the messages travel: pack Q, compute the early queries.
  pack_rows(ExecutionSpace(), qf.view(), qf.interior_box(), 0, C, saved->q, g->local,
            negated(qf.ghosts()), 0);
  if (options.bf16) round_rows(saved->q);
  kernels::neighborhood_forward(ExecutionSpace(), g->grid, g->early, saved->q, saved->kv,
                                saved->out, saved->lse);
  plan->finish(padded);

  // Ghost K/V into the packed rows, then the queries near the shard's faces.
  for (const Box& b : box_minus(whole(g->padded), padded_interior))
    pack_rows(ExecutionSpace(), padded.view(), b, 0, 2 * C, saved->kv, g->padded, none, 0);
  for (const Box& b : box_minus(owned_box, g->early))
    kernels::neighborhood_forward(ExecutionSpace(), g->grid, b, saved->q, saved->kv, saved->out,
                                  saved->lse);

  if (options.bf16) round_rows(saved->out);  // backward's delta reads the rounded output too
  auto node = make_result_node<T>("neighborhood_attention", {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>::uninitialized(dec, rank, N, C, {}, "neighborhood_attention");
  unpack_rows(ExecutionSpace(), saved->out, g->local, none, 0, C, node->field.view(), owned_box, 0,
              false);
  if (!node->requires_grad) return Variable<T>(node);

  node->backward =
      Backward<T>{g, plan, saved, owned_box, padded_interior, dec, rank, to_padded, options.bf16};
  return Variable<T>(node);
}

template Variable<float> neighborhood_attention(const Communicator&, const Variable<float>&,
                                                const Variable<float>&, const Variable<float>&,
                                                const NeighborhoodAttentionOptions&);
template Variable<double> neighborhood_attention(const Communicator&, const Variable<double>&,
                                                 const Variable<double>&, const Variable<double>&,
                                                 const NeighborhoodAttentionOptions&);

}  // namespace shardtensor
