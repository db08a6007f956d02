#include "shardtensor/layers/pooling.hpp"

#include "shardtensor/core/kokkos_math.hpp"

#include "shardtensor/layers/impl/per_dim_option.hpp"

#include <algorithm>
#include <limits>

namespace shardtensor {

template <class T>
Pool<T>::Pool(const Communicator& comm, PoolOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const int ndims = static_cast<int>(options_.window.size());
  const std::string kind = options_.kind == PoolKind::max ? "MaxPool" : "AvgPool";
  SHARDTENSOR_REQUIRE(ndims >= 1 && ndims <= max_spatial_dims, kind + " '" + name + "'",
                      "window needs 1 to 3 sizes, got " << ndims);
  const std::string where = kind + std::to_string(ndims) + "d '" + name + "'";
  const std::vector<int> stride =
      impl::per_dim_option(options_.stride, ndims, options_.window, "stride", where);
  const std::vector<int> padding =
      impl::per_dim_option(options_.padding, ndims, std::vector<int>(ndims, 0), "padding", where);
  const std::vector<int> padding_after =
      impl::per_dim_option(options_.padding_after, ndims, padding, "padding_after", where);
  const std::vector<int> dilation =
      impl::per_dim_option(options_.dilation, ndims, std::vector<int>(ndims, 1), "dilation", where);
  geometry_.ndims = ndims;
  geometry_.ceil_mode = options_.ceil_mode;
  for (int d = 0; d < ndims; ++d) {
    SHARDTENSOR_REQUIRE(options_.window[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 &&
                            padding[d] >= 0 && padding_after[d] >= 0,
                        where,
                        "window " << options_.window[d] << ", stride " << stride[d]
                                  << ", dilation " << dilation[d] << ", padding " << padding[d]
                                  << " before and " << padding_after[d] << " after along dim "
                                  << d);
    SHARDTENSOR_REQUIRE(2 * std::max(padding[d], padding_after[d]) <= options_.window[d], where,
                        "padding " << std::max(padding[d], padding_after[d]) << " along dim "
                                   << d << " exceeds half the window " << options_.window[d]);
    SHARDTENSOR_REQUIRE(
        options_.kind == PoolKind::max || dilation[d] == 1, where,
        "average pooling has no dilation, got " << dilation[d] << " along dim " << d);
    geometry_.kernel[d] = options_.window[d];
    geometry_.stride[d] = stride[d];
    geometry_.dilation[d] = dilation[d];
    geometry_.padding_lower[d] = padding[d];
    geometry_.padding_upper[d] = padding_after[d];
  }
  Index taps = 1;
  for (int d = 0; d < ndims; ++d) taps *= options_.window[d];
  SHARDTENSOR_REQUIRE(options_.kind == PoolKind::average || taps <= kernels::max_pool_taps, where,
                      "a window of " << taps << " cells is more than max pooling's "
                                     << kernels::max_pool_taps);
  SHARDTENSOR_REQUIRE(
      options_.padding_mode == PaddingMode::zeros || options_.padding_mode == PaddingMode::periodic,
      where, "padding mode " << to_string(options_.padding_mode) << " is not supported by pooling");
  SHARDTENSOR_REQUIRE(!options_.ceil_mode || options_.padding_mode == PaddingMode::zeros, where,
                      "ceil_mode needs zeros padding, not " << to_string(options_.padding_mode));
  const T constant = options_.kind == PoolKind::max ? -math::infinity<T>() : T(0);
  halo_ =
      std::make_shared<HaloPadding<T>>(comm_, geometry_, options_.padding_mode, constant, where);
}

template <class T>
Variable<T> Pool<T>::forward(const Variable<T>& input) {
  const std::string where = (options_.kind == PoolKind::max ? "MaxPool" : "AvgPool") +
                            std::to_string(geometry_.ndims) + "d '" + name_ + "'";
  SHARDTENSOR_REQUIRE(input.is_field(), where, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  const Decomposition out_decomposition = geometry_.output_decomposition(x.decomposition(), where);
  // Windows inside every shard (2x2 pooling on even splits) read the input itself: a copy
  // with ghost cells nobody reads was 2 % of a U-Net's inference.
  const ShardTensor<T> padded =
      x.ghosts().none() && geometry_.reads_owned_cells_only(x.decomposition()) ? x
                                                                               : halo_->forward(x);
  ShardTensor<T> y = ShardTensor<T>::uninitialized(out_decomposition, x.rank(), x.batch(),
                                                   x.channels(), {}, name_ + ".output");
  auto node = make_result_node<T>(name_, {input.node()});
  kernels::PoolArgmax argmax;  // only backward reads it
  if (options_.kind == PoolKind::max && node->requires_grad)
    argmax = decltype(argmax)(name_ + ".argmax", x.batch(), x.channels(), y.local_extent(0),
                              y.local_extent(1), y.local_extent(2));
  kernels::PoolShape shape{};
  shape.channels = x.channels();
  // Periodic padding cells are the field's own: always counted.
  const bool count_padding =
      options_.count_include_pad || options_.padding_mode == PaddingMode::periodic;
  const auto base = window_base(geometry_, x, y);
  for (int d = 0; d < max_spatial_dims; ++d) {
    shape.k[d] = geometry_.kernel[d];
    shape.s[d] = geometry_.stride[d];
    shape.d[d] = geometry_.dilation[d];
    shape.base[d] = base[d];
    shape.out[d] = y.local_extent(d);
    shape.padded[d] = padded.allocated_extent(d);
    shape.first_global[d] =
        y.global_box().lower[d] * geometry_.stride[d] - geometry_.padding_lower[d];
    const Index extent = x.decomposition().global_extent(d);
    shape.counted_lower[d] = count_padding ? -geometry_.padding_lower[d] : 0;
    shape.counted_upper[d] = count_padding ? extent + geometry_.padding_upper[d] : extent;
  }
  if (!plan_ || !(plan_->shape() == shape)) plan_.emplace(ExecutionSpace(), shape, options_.kind);
  const kernels::PoolPlan plan = *plan_;  // the graph may outlive the layer
  kernels::pool_forward(ExecutionSpace(), plan, padded.view(), y.view(), argmax);

  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    const std::shared_ptr<HaloPadding<T>> halo = halo_;  // the graph may outlive the layer
    const std::string label = name_ + ".padded_grad";
    // Backward needs the padded buffer's layout, not its values (max pooling kept the argmax):
    // capturing the buffer held a copy of the input from forward to backward.
    const Decomposition padded_layout = padded.decomposition();
    const GhostWidths padded_ghosts = padded.ghosts();
    const int rank = padded.rank();
    const Index batch = padded.batch(), channels = padded.channels();
    const bool scatter = options_.kind == PoolKind::max && plan.disjoint();  // adds into zeros
    node->backward = [=](impl::Node<T>& self) {
      const bool first = x_node->take_unfilled_grad_field();  // written, not added to
      if (first && padded_ghosts.none()) {
        // The input read in place: its gradient, new, is the kernel's buffer (no second one
        // copied into it).
        const auto gx = x_node->grad_field().view();
        if (scatter) Kokkos::deep_copy(ExecutionSpace(), gx, T(0));
        kernels::pool_backward(ExecutionSpace(), plan, self.grad_field().view(), argmax, gx);
        return;
      }
      ShardTensor<T> grad_padded(padded_layout, rank, batch, channels, padded_ghosts, label);
      kernels::pool_backward(ExecutionSpace(), plan, self.grad_field().view(), argmax,
                             grad_padded.view());
      halo->backward(grad_padded, x_node->grad_field(), first);
    };
  }
  return Variable<T>(node);
}

template class Pool<float>;
template class Pool<double>;

}  // namespace shardtensor
