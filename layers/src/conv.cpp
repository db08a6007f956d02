#include "shardtensor/layers/conv.hpp"

#include "conv_kernels.hpp"

#include "shardtensor/comm/slab_exchange.hpp"
#include "shardtensor/kernels/bfloat16_rounding.hpp"
#include "shardtensor/kernels/conv.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/layers/impl/conv_parameters.hpp"
#include "shardtensor/layers/impl/per_dim_option.hpp"
#include "shardtensor/layers/saved_field.hpp"

#include <array>
#include <optional>
#include <sstream>

// The module: options, parameters, the halo exchange and its overlap, the choice of kernel
// family (kernels/conv.hpp, kernels/conv_library.hpp) and the backward closure. The kernels run on
// the rotated view below.

namespace shardtensor {

namespace {

using kernels::ChunkFilter;
using kernels::ConvShape;
using kernels::PlanePlan;

// 1-D and 2-D fields are stored as (x, 1, 1) and (x, y, 1): their trailing axes have extent 1,
// so the same memory is also a (1, 1, x) or (1, x, y) field. Every kernel above runs along
// contiguous z rows (im2col copies whole rows, the plane path's GEMMs and vector kernels
// stream them); a z row of one cell defeats them all. So a 1-D or 2-D convolution computes
// on the rotated view, where the field's rows lie along z: computed axis a is stored axis
// (a + ndims) % 3.

/// Axes rotated by `shift`: computed axis a holds stored axis (a + shift) % 3.
struct AxisRotation {
  int shift = 0;
  template <class Array>
  Array apply(const Array& stored) const {
    Array computed = stored;
    for (int a = 0; a < 3; ++a) computed[a] = stored[(a + shift) % 3];
    return computed;
  }
  Box apply(const Box& stored) const { return {apply(stored.lower), apply(stored.extent)}; }
  /// The computed axis that holds stored axis `stored`.
  int computed_axis(int stored) const { return (stored - shift + 3) % 3; }
  /// The same memory as a field with rotated spatial extents (no copy).
  template <class T>
  FieldView<T> apply(const FieldView<T>& stored) const {
    if (shift == 0 || stored.extent(0) == 0) return stored;  // (an empty gradient)
    const std::array<Index, 3> e = apply(std::array<Index, 3>{
        Index(stored.extent(2)), Index(stored.extent(3)), Index(stored.extent(4))});
    return FieldView<T>(stored.data(), stored.extent(0), stored.extent(1), e[0], e[1], e[2]);
  }
};

/// The rotation of a convolution of `ndims` dimensions whose padded input is `padded`: none
/// for 3-D, or when an axis past ndims is not a single cell (then the rotated view would not
/// be the same memory).
template <class T>
AxisRotation rotation_for(int ndims, const ShardTensor<T>& padded) {
  for (int a = ndims; a < 3; ++a)
    if (padded.allocated_extent(a) != 1) return {};
  return {ndims % 3};
}

/// A convolution's shape with its axes rotated (see AxisRotation).
inline ConvShape rotated(const ConvShape& g, const AxisRotation& rotation) {
  ConvShape r = g;
  for (int a = 0; a < 3; ++a) {
    const int s = (a + rotation.shift) % 3;
    r.k[a] = g.k[s], r.s[a] = g.s[s], r.d[a] = g.d[s], r.base[a] = g.base[s], r.out[a] = g.out[s];
    r.wrap[a] = g.wrap[s];
  }
  if (g.slab_axis >= 0) r.slab_axis = rotation.computed_axis(g.slab_axis);
  return r;
}

/// The cells of the slabs (below and above the source along the stored x axis), in the
/// kernels' rotated source indices: a chunk whose windows touch neither runs before they arrive.
template <class T>
std::vector<Box> slab_boxes(const FieldView<T>& source, const AxisRotation& rotation, Index below,
                            Index above) {
  constexpr Index everywhere = Index(1) << 40;
  const int a = rotation.computed_axis(0);
  Box lower{{-everywhere, -everywhere, -everywhere},
            {2 * everywhere, 2 * everywhere, 2 * everywhere}};
  Box upper = lower;
  lower.lower[a] = -below, lower.extent[a] = below;
  upper.lower[a] = Index(source.extent(2 + a)), upper.extent[a] = above;
  return {lower, upper};
}

std::string layer_name(int ndims, const std::string& name) {
  return "Conv" + std::to_string(ndims) + "d '" + name + "'";
}

}  // namespace

template <class T>
Conv<T>::Conv(const Communicator& comm, ConvOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const int ndims = static_cast<int>(options_.kernel.size());
  SHARDTENSOR_REQUIRE(ndims >= 1 && ndims <= max_spatial_dims, "Conv '" + name + "'",
                      "kernel needs 1 to 3 sizes, got " << ndims);
  const std::string where = layer_name(ndims, name);
  geometry_.ndims = ndims;
  const std::vector<int> stride = impl::per_dim_option(options_.stride, ndims, 1, "stride", where);
  const std::vector<int> dilation =
      impl::per_dim_option(options_.dilation, ndims, 1, "dilation", where);
  const std::vector<int> padding =
      impl::per_dim_option(options_.padding, ndims, 0, "padding", where);
  const std::vector<int> padding_after =
      impl::per_dim_option(options_.padding_after, ndims, padding, "padding_after", where);
  for (int d = 0; d < ndims; ++d) {
    SHARDTENSOR_REQUIRE(options_.kernel[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 &&
                            padding[d] >= 0 && padding_after[d] >= 0,
                        where,
                        "kernel " << options_.kernel[d] << ", stride " << stride[d]
                                  << ", dilation " << dilation[d] << ", padding " << padding[d]
                                  << " before and " << padding_after[d] << " after along dim "
                                  << d);
    geometry_.kernel[d] = options_.kernel[d];
    geometry_.stride[d] = stride[d];
    geometry_.dilation[d] = dilation[d];
    geometry_.padding_lower[d] = padding[d];
    geometry_.padding_upper[d] = padding_after[d];
  }
  impl::check_channel_groups(options_.in_channels, options_.out_channels, options_.groups, where);
  double bound = 0;
  const std::vector<Index> shape = impl::kernel_weight_shape(
      options_.out_channels, options_.in_channels / options_.groups, options_.kernel, bound);
  const std::uint64_t seed = this->initialisation_seed(options_.seed, name);
  weight_ = this->register_parameter("weight", shape, bound, 2 * seed);
  if (options_.bias)
    bias_ = this->register_parameter("bias", {options_.out_channels}, bound, 2 * seed + 1);
  halo_ = std::make_shared<HaloPadding<T>>(comm_, geometry_, options_.padding_mode, T(0), where);
  workspace_->budget_bytes = options_.workspace_bytes;
  set_library_workspace_share(options_.library_workspace_share);
}

template <class T>
void Conv<T>::set_library_workspace_share(double share) {
  SHARDTENSOR_REQUIRE(
      share >= 0 && share <= 1, layer_name(geometry_.ndims, name_),
      "library_workspace_share must be a share of free memory from 0 to 1, got " << share);
  options_.library_workspace_share = share;
}

template <class T>
void Conv<T>::compute_in_bf16(bool on) {
  halo_->round_to_bfloat16(on);  // refuses a double layer
  options_.bf16 = on;
}

template <class T>
bool Conv<T>::slabs_agree(const ShardTensor<T>& input, bool mine, Index below, Index above) {
  // Every rank decides alike where all run the same kernels; a rank that cannot (another
  // vector path, no bf16 dot products) must not leave the others waiting for its planes.
  const Decomposition& d = input.decomposition();
  std::vector<long long> key{input.batch(), input.channels(), options_.bf16, mine, below, above};
  for (int a = 0; a < max_spatial_dims; ++a) {
    key.push_back(d.global_extent(a));
    key.push_back(d.process_grid(a));
  }
  if (key == slab_key_) return slabs_agreed_;
  const std::vector<long long> all = comm_.allgather({mine, below, above});
  slabs_agreed_ = true;
  for (std::size_t i = 0; i < all.size(); i += 3)
    slabs_agreed_ = slabs_agreed_ && all[i] == 1 && all[i + 1] == below && all[i + 2] == above;
  slab_key_ = key;
  return slabs_agreed_;
}

template <class T>
GhostWidths Conv<T>::padded_input_ghosts(const ShardTensor<T>& like) const {
  if (options_.bf16 || halo_->reads_in_place(like)) return {};
  // forward's may_read_input and may_read_slabs: a library reads a padded buffer always.
  std::array<bool, 3> wraps{};
  const bool library = options_.library_kernels && kernels::conv_library_available();
  if (!library && (halo_->reads_input_itself(like, wraps) ||
                   (geometry_.ndims != 1 && halo_->reads_input_with_slabs(like, wraps))))
    return {};
  return halo_->ghosts();
}

template <class T>
Variable<T> Conv<T>::forward(const Variable<T>& input) {
  const std::string where = layer_name(geometry_.ndims, name_);
  SHARDTENSOR_REQUIRE(input.is_field(), where, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(
      x.channels() == options_.in_channels, where,
      "input has " << x.channels() << " channels, the layer expects " << options_.in_channels);
  const Decomposition out_decomposition = geometry_.output_decomposition(x.decomposition(), where);
  // The host vector kernels keep this layer's packed weights between calls in eval mode only:
  // in training the weights change every step (a kept pair goes when the layer trains again).
  workspace_->keeps_forward_weights = !this->is_training();
  if (!workspace_->keeps_forward_weights) workspace_->forward_weights = {};

  // Where nothing is exchanged (zeros padding, or periodic on one rank), the plane path may
  // read the input itself: no padded copy (a pass over the field, and its memory); where only
  // x is split, it may read the input and its neighbours' planes (slabs). Else post the halo
  // exchange first; chunks of outputs whose windows read no exchanged ghost cell are computed
  // while the messages travel.
  std::array<bool, 3> wraps{};
  // bf16: only kernels that round as they read (below).
  const bool may_read_input =
      halo_->reads_input_itself(x, wraps, options_.bf16) && !halo_->reads_in_place(x);
  const AxisRotation rotation = rotation_for(geometry_.ndims, x);
  // The vector kernels take slabs along their plane or row axis (not a 1-D field's z).
  const bool may_read_slabs = !may_read_input && !halo_->reads_in_place(x) &&
                              rotation.computed_axis(0) < 2 &&
                              halo_->reads_input_with_slabs(x, wraps, options_.bf16);
  // An input whose producer allocated it with this layer's ghost cells for it (a U-Net's
  // concatenation) is padded in place: no copy beside it.
  const bool ghosts_are_scratch = input.node()->scratch_ghosts;
  ShardTensor<T> padded =
      may_read_input || may_read_slabs ? x : halo_->start(x, ghosts_are_scratch);
  // Padded in place with a graph, its ghost cells are this layer's from now on: no other layer
  // pads them again (it makes a copy), so they hold what this layer's backward reads. (Without
  // a graph nothing reads them back: a recomputed unit's first run leaves the flag to its run
  // inside backward.)
  const bool padded_in_place = padded.view().data() == x.view().data() && !x.ghosts().none();
  if (padded_in_place && grad_enabled()) input.node()->scratch_ghosts = false;

  ShardTensor<T> y = ShardTensor<T>::uninitialized(out_decomposition, x.rank(), x.batch(),
                                                   options_.out_channels, {}, name_ + ".output");
  ConvShape shape{x.batch(),
                  options_.in_channels,
                  options_.out_channels,
                  options_.in_channels / options_.groups,
                  options_.out_channels / options_.groups,
                  {},
                  {},
                  {},
                  {},
                  {}};
  const auto base = window_base(geometry_, x, y);
  for (int d = 0; d < max_spatial_dims; ++d) {
    shape.k[d] = geometry_.kernel[d];
    shape.s[d] = geometry_.stride[d];
    shape.d[d] = geometry_.dilation[d];
    shape.out[d] = y.local_extent(d);
    shape.base[d] = base[d];
  }
  // From here on the kernels see the rotated axes (1-D and 2-D rows along z); a padded
  // buffer's axes past ndims are single cells as the input's are.
  // The kernels reading the padded buffer, or the input itself (`unpadded`: its cells start
  // the ghost widths later; the plane path only, a library reads a padded buffer).
  const auto kernels_for = [&](bool unpadded) {
    ConvShape g = shape;
    ConvOptions options = options_;
    std::array<Index, 3> extent{};
    const GhostWidths& ghosts = halo_->ghosts();
    for (int d = 0; d < max_spatial_dims; ++d) {
      extent[d] = x.local_extent(d) + (unpadded ? 0 : ghosts.lower[d] + ghosts.upper[d]);
      if (unpadded) g.base[d] -= ghosts.lower[d];
      if (unpadded) g.wrap[d] = wraps[d];
    }
    if (unpadded && may_read_slabs) g.slab_axis = 0;
    if (unpadded) options.library_kernels = false;
    return impl::ConvKernels<T>(rotated(g, rotation), rotation.apply(extent).data(), options,
                                workspace_);
  };
  impl::ConvKernels<T> kernels = kernels_for(false);
  bool reads_input = false;
  // A wrapped axis needs the input's extent for the outputs: the output gradient wraps
  // around the same way (each input cell's windows are one output's, mod the extent).
  // So does a slab axis, on every rank: the output gradient's slabs are exchanged the same way.
  bool same_extents = true;
  for (int d = 0; d < max_spatial_dims; ++d)
    if (wraps[d] && (shape.out[d] != x.local_extent(d) || shape.s[d] != 1)) same_extents = false;
  if (may_read_slabs) {
    same_extents = same_extents && shape.s[0] == 1;
    for (int r = 0; r < comm_.size(); ++r)
      same_extents =
          same_extents && out_decomposition.extent(r, 0) == x.decomposition().extent(r, 0);
  }
  // The planes read past the input's ends along x (a slab exchange's widths).
  const Index below = halo_->ghosts().lower[0] - shape.base[0],
              above = shape.base[0] - halo_->ghosts().lower[0] + (shape.k[0] - 1) * shape.d[0];
  if ((may_read_input || may_read_slabs) && same_extents && !kernels.uses_library()) {
    // Not where the rings would push the vector kernels out of the workspace budget.
    const impl::ConvKernels<T> planes = kernels_for(true);
    reads_input = planes.runs_planes() &&
                  (planes.runs_vector_kernels() || !kernels.runs_vector_kernels()) &&
                  (!options_.bf16 || planes.rounds_bf16_as_it_reads());
    if (may_read_slabs)
      reads_input = slabs_agree(x,
                                reads_input && below >= 0 && above >= 0 &&
                                    SlabExchange<T>::covers(x.decomposition(), below, above),
                                below, above);
    if (reads_input) kernels = planes;
  } else if (may_read_slabs) {
    reads_input = slabs_agree(x, false, below, above);  // collective: every rank calls it
  }
  const bool slabs = may_read_slabs && reads_input;
  last_paths_ = {kernels.uses_library(), kernels.runs_vector_kernels(), kernels.runs_winograd(),
                 kernels.runs_winograd_gradient()};
  if ((may_read_input || may_read_slabs) && !reads_input)
    padded = halo_->start(x, ghosts_are_scratch);
  shape = rotated(shape, rotation);
  const FieldView<T> xp = rotation.apply(padded.view()), yv = rotation.apply(y.view());
  const ReplicatedView<T> bias = bias_.defined() ? bias_.data() : ReplicatedView<T>();
  // bf16: the padded input is rounded as HaloPadding copies it in (or by the vector kernels as
  // they read it); the weight here, unless the vector kernels round it as they pack it.
  const ReplicatedView<T> w = options_.bf16 && !kernels.rounds_bf16_weights()
                                  ? kernels::bfloat16_copy(weight_.data(), name_ + ".weight_bf16")
                                  : weight_.data();
  // With `split`, the outputs whose windows read none of the `travelling` boxes of xp first,
  // while those cells travel, then, once `arrived` returns, the rest; else all after it.
  const auto forward_around = [&](bool split, const std::vector<Box>& travelling,
                                  const auto& arrived, const kernels::SourceSlabs<T>& from) {
    if (!split) {
      arrived();
      return kernels.forward(xp, w, bias, yv, {}, from);
    }
    ChunkFilter filter{ChunkFilter::avoiding, travelling};
    kernels.forward(xp, w, bias, yv, filter, from);
    arrived();
    filter.keep = ChunkFilter::touching;
    kernels.forward(xp, w, bias, yv, filter, from);
  };
  std::optional<SlabExchange<T>> exchange;  // the input's slabs
  if (slabs) {
    // A bf16 layer's kernels round the planes they read: bfloat16 planes change nothing.
    exchange.emplace(
        comm_, x, below, above, halo_->periodic(),
        options_.bf16 ? SlabExchange<T>::wire_for_bfloat16_readers(comm_) : HaloWire::native);
    const bool split = kernels.runs_in_chunks() && options_.overlap_halo;
    forward_around(split, split ? slab_boxes(xp, rotation, below, above) : std::vector<Box>(),
                   [&] { exchange->wait(); },
                   {rotation.apply(exchange->lower()), rotation.apply(exchange->upper())});
  } else if (reads_input) {
    kernels.forward(xp, w, bias, yv);
  } else {
    const bool split =
        kernels.runs_in_chunks() && options_.overlap_halo && halo_->padding_ready_after_start();
    std::vector<Box> exchanged;
    if (split)
      for (const Box& box : halo_->exchanged_boxes(padded))
        exchanged.push_back(rotation.apply(box));
    forward_around(split, exchanged, [&] { halo_->finish(padded); }, {});
  }
  if (options_.bf16) kernels::round_to_bfloat16(ExecutionSpace(), y.view());

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node(), weight_.node()};
  if (bias_.defined()) inputs.push_back(bias_.node());
  auto node = make_result_node<T>(name_, inputs);
  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    auto w_node = weight_.node();
    auto b_node = bias_.defined() ? bias_.node() : nullptr;
    const Communicator comm = comm_;
    const std::shared_ptr<HaloPadding<T>> halo = halo_;  // the graph may outlive the layer
    // The graph keeps no values: capture the input (bf16: rounded into 16 bits, all the
    // layer reads of it). Backward reads the padded input again. Kept whole, it was a second
    // copy of every convolution's input from forward to backward (the closure holds the input
    // anyway): keep only its shell, and rebuild the buffer in backward.
    // Not in a recomputed unit's run inside backward, whose backward comes next: packing would
    // only add the 16 bits beside the float input for that short while (the unit's first
    // conv, after the U-Net's concatenation: its peak).
    const bool packed = options_.bf16 && !impl::recomputing_flag();
    SavedField<T> saved_input(input, packed ? SavedPacking::rounded : SavedPacking::none,
                              name_ + ".saved_input");
    // An input padded in place and saved as it is keeps the padded buffer itself to backward
    // (its ghost cells are this layer's alone, above): no shell to rebuild it from. Where a
    // recomputed unit's first conv pads its concatenation (the U-Net's peak), that shell was
    // a halo's worth beside it.
    const bool keeps_padded = padded_in_place && !packed;
    PaddedShell<T> shell = reads_input || keeps_padded ? PaddedShell<T>() : halo_->shell(padded, x);
    // The neighbours' planes that forward read (a surface), for the weight gradient.
    FieldView<T> slab_lower = slabs ? exchange->lower() : FieldView<T>(),
                 slab_upper = slabs ? exchange->upper() : FieldView<T>();
    const bool periodic = halo_->periodic();
    const bool bf16 = options_.bf16;
    node->backward = [=](impl::Node<T>& self) mutable {
      ShardTensor<T> padded;
      bool in_place = false;         // the buffer is the input itself (HaloPadding::reads_in_place)
      bool padded_in_place = false;  // the input itself, its ghost cells filled (pads_in_place)
      {
        const ShardTensor<T> input_value = saved_input.value();  // unpacked: goes at the brace
        padded = reads_input || keeps_padded ? input_value : halo->rebuild(input_value, shell);
        const bool same = padded.view().data() == input_value.view().data();
        in_place = same && padded.ghosts() == GhostWidths{};
        padded_in_place = same && !in_place;
      }
      // Backward runs once: free what it kept before the gradients are allocated.
      shell = {};
      saved_input = {};
      // Whether this closure holds the input's only reference: no Variable of it, no other op
      // kept it, not a caller's array (unmanaged: no count). Before xp, a second reference.
      const bool sole_reference = (in_place || padded_in_place) && padded.view().use_count() == 1;
      const FieldView<T> xp = rotation.apply(padded.view());
      // bf16: the output gradient is an operand too (rounded in place, or into a copy where
      // its memory is shared: a caller's gradient).
      const ShardTensor<T> grad_output =
          bf16 ? kernels::bfloat16_rounded(self.grad_field(), name_ + ".grad_bf16")
               : self.grad_field();
      const FieldView<T> gy = rotation.apply(grad_output.view());
      // The output gradient's planes that the input gradient reads past its ends: the
      // mirror of forward's (its windows run the other way).
      std::optional<SlabExchange<T>> gy_exchange;
      if (slabs)
        gy_exchange.emplace(
            comm, grad_output, above, below, periodic,
            bf16 ? SlabExchange<T>::wire_for_bfloat16_readers(comm) : HaloWire::native);
      const ReplicatedView<T> gw =
          w_node->requires_grad ? w_node->grad_partial(comm) : ReplicatedView<T>();
      const ReplicatedView<T> gb =
          b_node && b_node->requires_grad ? b_node->grad_partial(comm) : ReplicatedView<T>();
      // Where the input gradient goes before the halo adjoint. A buffer that is the input
      // itself (HaloPadding::reads_in_place, or read unpadded) has no ghost or padding cell:
      // if nothing has added to the input's gradient yet, that gradient takes it directly
      // (no second buffer, no adjoint). The plane path runs the weight gradient first, so a
      // rebuilt buffer is dead when the input gradient (which writes every cell) goes into it.
      const bool direct =
          in_place && x_node->requires_grad && x_node->field_grad.view().span() == 0;
      // Where this closure holds the input's only reference and the plane path runs, the
      // input is dead once the weight gradient has read it: its buffer takes the input
      // gradient (one field fewer in flight, as for a rebuilt padded buffer). Else the plane
      // path writes every cell of a new gradient: no zero fill first.
      if (direct && kernels.input_gradient_after_weights() &&
          !(sole_reference && x_node->adopt_grad_field(padded)))
        x_node->take_unfilled_grad_field();
      // Likewise an input padded in place: its buffer takes the input gradient and becomes
      // that gradient (the halo adjoint below zeroes its ghost cells).
      const bool grad_in_input = padded_in_place && sole_reference && x_node->requires_grad &&
                                 kernels.input_gradient_after_weights() &&
                                 x_node->adopt_grad_field(padded, /*ghosts_zeroed=*/true);
      ShardTensor<T> grad_padded;
      if (x_node->requires_grad)
        grad_padded =
            direct ? x_node->grad_field()
            : kernels.input_gradient_after_weights() &&
                    ((!in_place && !padded_in_place) || grad_in_input)
                ? padded
                : ShardTensor<T>(padded.decomposition(), padded.rank(), padded.batch(),
                                 padded.channels(), padded.ghosts(), name_ + ".padded_grad");
      if (slabs) {
        kernels.backward_parameters(gy, xp, gw, gb,
                                    {rotation.apply(slab_lower), rotation.apply(slab_upper)});
        slab_lower = slab_upper = FieldView<T>();
        gy_exchange->wait();
        if (x_node->requires_grad)
          kernels.backward_input(
              gy, w, rotation.apply(grad_padded.view()),
              {rotation.apply(gy_exchange->lower()), rotation.apply(gy_exchange->upper())});
      } else {
        kernels.backward(gy, xp, w, gw, gb, rotation.apply(grad_padded.view()));
      }
      if (grad_in_input) {
        halo->backward(grad_padded, grad_padded, /*overwrite=*/true);
      } else if (x_node->requires_grad && !direct) {
        const bool first = x_node->take_unfilled_grad_field();  // written, not added to
        halo->backward(grad_padded, x_node->grad_field(), first);
      }
    };
  }
  return Variable<T>(node);
}

template class Conv<float>;
template class Conv<double>;

}  // namespace shardtensor
