#include "shardtensor/layers/upsample.hpp"

#include "shardtensor/core/kokkos_math.hpp"

namespace shardtensor {

template <class T>
Upsample<T>::Upsample(const Communicator& comm, std::vector<int> scale, UpsampleMode mode,
                      const std::string& name, LinearCoordinates coordinates)
    : comm_(comm),
      ndims_(static_cast<int>(scale.size())),
      mode_(mode),
      coordinates_(coordinates),
      name_(name) {
  where_ = std::string("Upsample") + std::to_string(ndims_) + "d '" + name + "'";
  SHARDTENSOR_REQUIRE(ndims_ >= 1 && ndims_ <= max_spatial_dims, where_,
                      "scale needs 1 to 3 factors, got " << ndims_);
  for (int d = 0; d < ndims_; ++d) {
    SHARDTENSOR_REQUIRE(scale[d] >= 1, where_,
                        "scale factor " << scale[d] << " along dim " << d << " must be >= 1");
    scale_[d] = scale[d];
  }
  if (mode_ == UpsampleMode::linear) {
    WindowGeometry one_cell_each_side;  // kernel 3, padding 1: one ghost per side
    one_cell_each_side.ndims = ndims_;
    for (int d = 0; d < ndims_; ++d) {
      one_cell_each_side.kernel[d] = 3;
      one_cell_each_side.padding_lower[d] = one_cell_each_side.padding_upper[d] = 1;
    }
    halo_ = std::make_shared<HaloPadding<T>>(comm_, one_cell_each_side, PaddingMode::replicate,
                                             T(0), where_);
  }
}

template <class T>
Variable<T> Upsample<T>::forward(const Variable<T>& input) {
  SHARDTENSOR_REQUIRE(input.is_field(), where_, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(x.ndims() == ndims_, where_,
                      "input field has " << x.ndims() << " spatial dims, the scale " << ndims_);
  std::vector<std::vector<Index>> points;
  std::vector<bool> periodic;
  for (int d = 0; d < ndims_; ++d) {
    points.push_back(x.decomposition().split_points(d));
    for (Index& p : points.back()) p *= scale_[d];
    periodic.push_back(x.decomposition().periodic(d));
  }
  // Every output cell is written below (no ghosts): no zero fill first.
  ShardTensor<T> y =
      ShardTensor<T>::uninitialized(Decomposition::from_split_points(points, periodic), x.rank(),
                                    x.batch(), x.channels(), {}, name_ + ".output");
  // Linear interpolation reads replicate padding past the field's ends. Where the shard is the
  // whole field (one part along every axis: nothing to exchange), the kernels clamp their
  // sources to it instead: the same values, without a padded copy of the input.
  const bool clamped = mode_ == UpsampleMode::linear && x.ghosts() == GhostWidths{} &&
                       halo_->exchanges_nothing(x.decomposition());
  const ShardTensor<T> source = mode_ == UpsampleMode::linear && !clamped ? halo_->forward(x) : x;
  kernels::UpsampleShape shape{};
  shape.clamped = clamped;
  shape.channels = x.channels();
  shape.coordinates = coordinates_;
  for (int d = 0; d < max_spatial_dims; ++d) {
    shape.scale[d] = scale_[d];
    shape.out_offset[d] = y.global_box().lower[d];
    shape.in_offset[d] = x.global_box().lower[d];
    shape.out[d] = y.local_extent(d);
    shape.in[d] = source.allocated_extent(d);
    shape.ghost[d] = source.ghosts().lower[d];
    shape.global_in[d] = x.decomposition().global_extent(d);
  }
  if (!plan_ || !(plan_->shape() == shape)) plan_.emplace(ExecutionSpace(), shape, mode_);
  const kernels::UpsamplePlan<T> plan = *plan_;  // the graph may outlive the layer
  kernels::upsample_forward(ExecutionSpace(), plan, source.view(), y.view());

  auto node = make_result_node<T>(name_, {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    const std::shared_ptr<HaloPadding<T>> halo = halo_;  // the graph may outlive the layer
    const std::string label = name_ + ".source_grad";
    node->backward = [=](impl::Node<T>& self) {
      if (plan.mode() == UpsampleMode::nearest || plan.shape().clamped) {
        kernels::upsample_backward(ExecutionSpace(), plan, self.grad_field().view(),
                                   x_node->grad_field().view());
        return;
      }
      ShardTensor<T> grad_source(source.decomposition(), source.rank(), source.batch(),
                                 source.channels(), source.ghosts(), label);
      kernels::upsample_backward(ExecutionSpace(), plan, self.grad_field().view(),
                                 grad_source.view());
      const bool first = x_node->take_unfilled_grad_field();  // written, not added to
      halo->backward(grad_source, x_node->grad_field(), first);
    };
  }
  return Variable<T>(node);
}

template class Upsample<float>;
template class Upsample<double>;

}  // namespace shardtensor
