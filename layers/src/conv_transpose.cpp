#include "shardtensor/layers/conv_transpose.hpp"

#include "shardtensor/kernels/bfloat16_rounding.hpp"
#include "shardtensor/kernels/conv_transpose.hpp"

#include "shardtensor/layers/impl/conv_parameters.hpp"
#include "shardtensor/layers/saved_field.hpp"
#include "shardtensor/layers/impl/per_dim_option.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace shardtensor {

namespace {

std::string layer_name(int ndims, const std::string& name) {
  return "ConvTranspose" + std::to_string(ndims) + "d '" + name + "'";
}

}  // namespace

template <class T>
ConvTranspose<T>::ConvTranspose(const Communicator& comm, ConvTransposeOptions options,
                                const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  ndims_ = static_cast<int>(options_.kernel.size());
  SHARDTENSOR_REQUIRE(ndims_ >= 1 && ndims_ <= max_spatial_dims, "ConvTranspose '" + name + "'",
                      "kernel needs 1 to 3 sizes, got " << ndims_);
  where_ = layer_name(ndims_, name);
  const std::vector<int> stride =
      impl::per_dim_option(options_.stride, ndims_, 1, "stride", where_);
  const std::vector<int> dilation =
      impl::per_dim_option(options_.dilation, ndims_, 1, "dilation", where_);
  const std::vector<int> padding =
      impl::per_dim_option(options_.padding, ndims_, 0, "padding", where_);
  const std::vector<int> output_padding =
      impl::per_dim_option(options_.output_padding, ndims_, 0, "output_padding", where_);
  for (int d = 0; d < ndims_; ++d) {
    SHARDTENSOR_REQUIRE(options_.kernel[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 &&
                            padding[d] >= 0 && output_padding[d] >= 0,
                        where_,
                        "kernel " << options_.kernel[d] << ", stride " << stride[d] << ", dilation "
                                  << dilation[d] << ", padding " << padding[d]
                                  << ", output_padding " << output_padding[d] << " along dim "
                                  << d);
    SHARDTENSOR_REQUIRE(output_padding[d] < std::max(stride[d], dilation[d]), where_,
                        "output_padding " << output_padding[d] << " along dim " << d
                                          << " must be smaller than the stride " << stride[d]
                                          << " or the dilation " << dilation[d]);
    kernel_[d] = options_.kernel[d];
    stride_[d] = stride[d];
    dilation_[d] = dilation[d];
    padding_[d] = padding[d];
    output_padding_[d] = output_padding[d];
  }
  impl::check_channel_groups(options_.in_channels, options_.out_channels, options_.groups, where_);
  // Weights (in, out / groups, k...); fan_in is taken from the second axis, as in PyTorch.
  double bound = 0;
  const std::vector<Index> shape = impl::kernel_weight_shape(
      options_.in_channels, options_.out_channels / options_.groups, options_.kernel, bound);
  const std::uint64_t seed = this->initialisation_seed(options_.seed, name);
  weight_ = this->register_parameter("weight", shape, bound, 2 * seed);
  if (options_.bias)
    bias_ = this->register_parameter("bias", {options_.out_channels}, bound, 2 * seed + 1);
}

template <class T>
Index ConvTranspose<T>::output_extent(int dim, Index input) const {
  return (input - 1) * stride_[dim] - 2 * padding_[dim] + dilation_[dim] * (kernel_[dim] - 1) +
         output_padding_[dim] + 1;
}

template <class T>
Decomposition ConvTranspose<T>::output_decomposition(const Decomposition& input) const {
  SHARDTENSOR_REQUIRE(
      input.ndims() == ndims_, where_,
      "input field has " << input.ndims() << " spatial dims, the kernel " << ndims_);
  std::vector<std::vector<Index>> points(ndims_);
  std::vector<bool> periodic(ndims_);
  for (int d = 0; d < ndims_; ++d) {
    const Index n = input.global_extent(d);
    const Index outputs = output_extent(d, n);
    SHARDTENSOR_REQUIRE(outputs >= 1, where_,
                        "input extent " << n << " along dim " << d << " gives output extent "
                                        << outputs << " (kernel " << kernel_[d] << ", stride "
                                        << stride_[d] << ", dilation " << dilation_[d]
                                        << ", padding " << padding_[d] << ", output_padding "
                                        << output_padding_[d] << ")");
    const std::vector<Index>& in = input.split_points(d);
    const int parts = input.process_grid(d);
    points[d].push_back(0);
    for (int i = 1; i < parts; ++i) points[d].push_back(in[i] * stride_[d]);
    points[d].push_back(outputs);
    for (int i = 0; i < parts; ++i)
      SHARDTENSOR_REQUIRE(points[d][i] < points[d][i + 1], where_,
                          "stride " << stride_[d] << " and padding " << padding_[d]
                                    << " leave the ranks at grid position " << i << " along dim "
                                    << d << " (input cells [" << in[i] << ", " << in[i + 1]
                                    << ")) with no output (their outputs would start at "
                                    << points[d][i] << ", global output extent " << outputs << ")");
    periodic[d] = input.periodic(d);
  }
  return Decomposition::from_split_points(points, periodic);
}

template <class T>
GhostWidths ConvTranspose<T>::input_ghosts(const Decomposition& input) const {
  const Decomposition output = output_decomposition(input);
  GhostWidths g;
  for (int dim = 0; dim < ndims_; ++dim) {
    const Index n = input.global_extent(dim), s = stride_[dim];
    const std::vector<Index>& in = input.split_points(dim);
    const std::vector<Index>& out = output.split_points(dim);
    const int parts = input.process_grid(dim);
    Index lower = 0, upper = 0;
    for (int r = 0; r < parts; ++r) {
      const Index a = in[r], b = in[r + 1], lo = out[r], hi = out[r + 1];
      // Per tap, the owned outputs with an input behind them read consecutive inputs, from
      // those of the first to those of the last such output; inputs past the global boundary
      // are not read.
      Index first = std::numeric_limits<Index>::max(), last = std::numeric_limits<Index>::min();
      for (Index t = 0; t < kernel_[dim]; ++t) {
        const Index shift = padding_[dim] - t * dilation_[dim];  // i * s = o + shift
        const Index o_low = lo + kernels::floor_mod(-(lo + shift), s);
        const Index o_high = hi - 1 - kernels::floor_mod(hi - 1 + shift, s);
        if (o_low > o_high) continue;
        const Index i_low = std::max<Index>(kernels::floor_div(o_low + shift, s), 0);
        const Index i_high = std::min(kernels::floor_div(o_high + shift, s), n - 1);
        if (i_low > i_high) continue;
        first = std::min(first, i_low);
        last = std::max(last, i_high);
      }
      if (first > last) continue;  // reads nothing
      if (r > 0) lower = std::max(lower, a - first);
      if (r < parts - 1) upper = std::max(upper, last - (b - 1));
    }
    g.lower[dim] = static_cast<int>(lower);
    g.upper[dim] = static_cast<int>(upper);
  }
  return g;
}

template <class T>
std::shared_ptr<HaloPadding<T>> ConvTranspose<T>::halo_for(const GhostWidths& ghosts) {
  std::vector<int> key(ghosts.lower.begin(), ghosts.lower.end());
  key.insert(key.end(), ghosts.upper.begin(), ghosts.upper.end());
  auto& halo = halos_[key];
  if (!halo) {
    BoundaryPadding zeros;  // ghosts past the global boundary: zeros (never read)
    zeros.lower = ghosts.lower;
    zeros.upper = ghosts.upper;
    halo = std::make_shared<HaloPadding<T>>(comm_, ghosts, zeros, where_);
    halo->round_to_bfloat16(options_.bf16);
  }
  return halo;
}

template <class T>
void ConvTranspose<T>::compute_in_bf16(bool on) {
  SHARDTENSOR_REQUIRE(!on || (std::is_same<T, float>::value), where_,
                      "bf16 operands need a float model, this one is double");
  options_.bf16 = on;
  for (auto& [ghosts, halo] : halos_) halo->round_to_bfloat16(on);
}

template <class T>
Variable<T> ConvTranspose<T>::forward(const Variable<T>& input) {
  SHARDTENSOR_REQUIRE(input.is_field(), where_, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  const ShardTensor<T> y =
      ShardTensor<T>::uninitialized(output_decomposition(x.decomposition()), x.rank(), x.batch(),
                                    options_.out_channels, {}, name_ + ".output");
  const std::shared_ptr<impl::Node<T>> node = write_output(input, y, 0);
  node->field = y;
  return Variable<T>(node);
}

template <class T>
std::shared_ptr<impl::Node<T>> ConvTranspose<T>::forward_into(const Variable<T>& input,
                                                              const ShardTensor<T>& into,
                                                              Index first) {
  SHARDTENSOR_REQUIRE(input.is_field(), where_, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  const Decomposition out_decomposition = output_decomposition(x.decomposition());
  SHARDTENSOR_REQUIRE(into.decomposition() == out_decomposition && into.batch() == x.batch() &&
                          into.rank() == x.rank(),
                      where_,
                      "the output field (batch "
                          << into.batch() << ", " << into.decomposition().describe()
                          << ") is not this input's output (batch " << x.batch() << ", "
                          << out_decomposition.describe() << ")");
  SHARDTENSOR_REQUIRE(first >= 0 && first + options_.out_channels <= into.channels(), where_,
                      "output channels [" << first << ", " << first + options_.out_channels
                                          << ") outside the field's " << into.channels());
  const std::shared_ptr<impl::Node<T>> node = write_output(input, into, first);
  node->released = typename impl::Node<T>::Layout{out_decomposition, x.rank(), x.batch(),
                                                  Index(options_.out_channels), GhostWidths{}};
  return node;
}

template <class T>
std::shared_ptr<impl::Node<T>> ConvTranspose<T>::write_output(const Variable<T>& input,
                                                              const ShardTensor<T>& y,
                                                              Index first) {
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(
      x.channels() == options_.in_channels, where_,
      "input has " << x.channels() << " channels, the layer expects " << options_.in_channels);
  const std::shared_ptr<HaloPadding<T>> halo = halo_for(input_ghosts(x.decomposition()));

  // The kernel's shape for an input buffer `padded` (the input itself where no ghost is read).
  const auto shape_for = [&](const ShardTensor<T>& padded) {
    kernels::ConvTransposeShape shape{x.batch(),
                                      options_.in_channels,
                                      options_.out_channels,
                                      options_.in_channels / options_.groups,
                                      options_.out_channels / options_.groups,
                                      {},
                                      {},
                                      {},
                                      {},
                                      {},
                                      {},
                                      {},
                                      {},
                                      {}};
    for (int d = 0; d < max_spatial_dims; ++d) {
      shape.k[d] = kernel_[d];
      shape.s[d] = stride_[d];
      shape.d[d] = dilation_[d];
      shape.p[d] = padding_[d];
      shape.out_first[d] = y.global_box().lower[d];
      shape.out[d] = y.local_extent(d);
      shape.in_first[d] = x.global_box().lower[d] - padded.ghosts().lower[d];
      shape.in_global[d] = x.decomposition().global_extent(d);
      shape.padded[d] = padded.allocated_extent(d);
    }
    return shape;
  };
  // bf16 on the GEMM path (the U-Net's upsampling) with no ghost cell to read: the GEMMs round
  // the input as they copy its rows, so the input itself is read, in forward and backward, and
  // no rounded copy of it is made beside it.
  kernels::ConvTransposeShape shape = shape_for(x);
  const bool rounds_on_read = options_.bf16 && halo->ghosts() == GhostWidths{} &&
                              x.ghosts() == GhostWidths{} &&
                              kernels::conv_transpose_rounds_on_read(shape);
  shape.round_source = rounds_on_read;
  const ShardTensor<T> padded = rounds_on_read ? x : halo->forward(x);
  if (!rounds_on_read) shape = shape_for(padded);
  const ReplicatedView<T> no_bias;
  // bf16: the input is rounded as HaloPadding copies it in (or by the GEMMs as they read it);
  // the weight here.
  const ReplicatedView<T> w = options_.bf16
                                  ? kernels::bfloat16_copy(weight_.data(), name_ + ".weight_bf16")
                                  : weight_.data();
  kernels::ConvTransposeOutput at;  // the owned cells of y's channels from `first`
  at.channel = first;
  for (int d = 0; d < max_spatial_dims; ++d) at.lower[d] = y.ghosts().lower[d];
  at.bf16 = options_.bf16;
  kernels::conv_transpose_forward(ExecutionSpace(), shape, padded.view(), w,
                                  bias_.defined() ? bias_.data() : no_bias, y.view(), at);

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node(), weight_.node()};
  if (bias_.defined()) inputs.push_back(bias_.node());
  auto node = make_result_node<T>(name_, inputs);
  if (node->requires_grad) {
    auto x_node = input.node();
    auto w_node = weight_.node();
    auto b_node = bias_.defined() ? bias_.node() : nullptr;
    const Communicator comm = comm_;
    const std::string name = name_;
    // As Conv: keep the padded input's shell, not a second copy of the input (conv.cpp).
    PaddedShell<T> shell = rounds_on_read ? PaddedShell<T>() : halo->shell(padded, x);
    // The graph keeps no values: capture the input (bf16: rounded into 16 bits, as in Conv).
    SavedField<T> saved_input(input, options_.bf16 ? SavedPacking::rounded : SavedPacking::none,
                              name_ + ".saved_input");
    const bool bf16 = options_.bf16;
    node->backward = [=](impl::Node<T>& self) mutable {
      // (Where the GEMMs round on read, the saved input itself: its bf16 values round to
      // themselves.)
      const ShardTensor<T> padded =
          rounds_on_read ? saved_input.value() : halo->rebuild(saved_input.value(), shell);
      // Backward runs once: free what it kept before the gradients are allocated.
      shell = {};
      saved_input = {};
      // bf16: the output gradient is an operand too (rounded in place where unshared, as in Conv).
      const ShardTensor<T> grad_output =
          bf16 ? kernels::bfloat16_rounded(self.grad_field(), name + ".grad_bf16")
               : self.grad_field();
      const FieldView<T> gy = grad_output.view();
      const ReplicatedView<T> gw =
          w_node->requires_grad ? w_node->grad_partial(comm) : ReplicatedView<T>();
      const ReplicatedView<T> gb =
          b_node && b_node->requires_grad ? b_node->grad_partial(comm) : ReplicatedView<T>();
      ShardTensor<T> grad_padded;
      if (x_node->requires_grad)
        grad_padded = ShardTensor<T>(padded.decomposition(), padded.rank(), padded.batch(),
                                     padded.channels(), padded.ghosts(), name + ".padded_grad");
      kernels::conv_transpose_backward(ExecutionSpace(), shape, gy, padded.view(), w, gw, gb,
                                       grad_padded.view());
      if (x_node->requires_grad) {
        const bool first = x_node->take_unfilled_grad_field();  // written, not added to
        halo->backward(grad_padded, x_node->grad_field(), first);  // shared: may outlive the layer
      }
    };
  }
  return node;
}

template class ConvTranspose<float>;
template class ConvTranspose<double>;

}  // namespace shardtensor
