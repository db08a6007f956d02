#include "shardtensor/layers/upsample.hpp"

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"

#include <cmath>

namespace shardtensor {

namespace {

/// Per-axis data of the upsampling kernels.
struct UpsampleShape {
  Index channels;
  Index scale[3];
  Index out_offset[3];  // global index of the first local output
  Index in_offset[3];   // global index of the first owned input
  Index out[3];         // local output extents
  Index in[3];          // extents of the input buffer (owned cells plus ghosts)
  Index ghost[3];       // ghost cells below the owned ones in the input buffer

  /// Linear interpolation along an axis: buffer index of the lower source and its weight
  /// (the upper source, index + 1, gets 1 - weight).
  template <class T>
  KOKKOS_INLINE_FUNCTION void linear_source(int axis, Index o, Index& lower, T& weight) const {
    const double source = (double(out_offset[axis] + o) + 0.5) / double(scale[axis]) - 0.5;
    const double floor_source = math::floor(source);
    lower = static_cast<Index>(floor_source) - in_offset[axis] + ghost[axis];
    weight = static_cast<T>(1.0 - (source - floor_source));
  }
};

/// Linear interpolation per axis, computed once per call instead of once per cell (and per
/// candidate output in the backward): entry first[a] + o holds output o's lower source along
/// axis a (buffer index) and its weight. The same values linear_source gives, so the same sums.
template <class T>
struct LinearTable {
  Kokkos::View<Index*, DefaultMemorySpace> lower;
  Kokkos::View<T*, DefaultMemorySpace> weight;
  Index first[3];

  explicit LinearTable(const UpsampleShape& g)
      : lower(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::table.lower"),
              g.out[0] + g.out[1] + g.out[2]),
        weight(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::table.weight"),
               g.out[0] + g.out[1] + g.out[2]),
        first{0, g.out[0], g.out[0] + g.out[1]} {
    const auto l = lower;
    const auto w = weight;
    const Index second = first[1], third = first[2];
    Kokkos::parallel_for(
        "Upsample::table", l.extent(0), KOKKOS_LAMBDA(const Index i) {
          const int axis = i < second ? 0 : i < third ? 1 : 2;
          g.linear_source(axis, i - (axis == 0 ? 0 : axis == 1 ? second : third), l(i), w(i));
        });
  }
};

template <class T>
void upsample_forward(const UpsampleShape& g, UpsampleMode mode, const FieldView<T>& x,
                      const FieldView<T>& y) {
  const LinearTable<T> table(g);
  const auto lower = table.lower;
  const auto weight = table.weight;
  const Index f0 = table.first[0], f1 = table.first[1], f2 = table.first[2];
  const Index extents[3] = {g.out[0], g.out[1], g.out[2]};
  for_each_cell_by_lines(
      "Upsample::forward", y.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ox, const Index oy, const Index oz) {
        if (mode == UpsampleMode::nearest) {
          const Index o[3] = {ox, oy, oz};
          Index i[3];
          for (int a = 0; a < 3; ++a)
            i[a] = (g.out_offset[a] + o[a]) / g.scale[a] - g.in_offset[a] + g.ghost[a];
          y(n, c, ox, oy, oz) = x(n, c, i[0], i[1], i[2]);
          return;
        }
        const Index lx = lower(f0 + ox), ly = lower(f1 + oy), lz = lower(f2 + oz);
        const T wx = weight(f0 + ox), wy = weight(f1 + oy), wz = weight(f2 + oz);
        // Unused axes have scale 1: source = o exactly, weight 1 on the lower cell.
        const Index hx = g.in[0] > 1 ? lx + 1 : lx, hy = g.in[1] > 1 ? ly + 1 : ly,
                    hz = g.in[2] > 1 ? lz + 1 : lz;
        y(n, c, ox, oy, oz) =
            wx * (wy * (wz * x(n, c, lx, ly, lz) + (1 - wz) * x(n, c, lx, ly, hz)) +
                  (1 - wy) * (wz * x(n, c, lx, hy, lz) + (1 - wz) * x(n, c, lx, hy, hz))) +
            (1 - wx) * (wy * (wz * x(n, c, hx, ly, lz) + (1 - wz) * x(n, c, hx, ly, hz)) +
                        (1 - wy) * (wz * x(n, c, hx, hy, lz) + (1 - wz) * x(n, c, hx, hy, hz)));
      });
}

/// Input-buffer gradient: each input cell gathers from the outputs that read it.
template <class T>
void upsample_backward(const UpsampleShape& g, UpsampleMode mode, const FieldView<T>& gy,
                       const FieldView<T>& gx) {
  const LinearTable<T> table(g);
  const auto lower_of = table.lower;
  const auto weight_of = table.weight;
  const Index f0 = table.first[0], f1 = table.first[1], f2 = table.first[2];
  const Index extents[3] = {g.in[0], g.in[1], g.in[2]};
  for_each_cell_by_lines(
      "Upsample::backward", gx.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ix, const Index iy, const Index iz) {
        const Index i[3] = {ix, iy, iz};
        // Candidate outputs per axis and this cell's weight in each.
        Index first[3], last[3];
        for (int a = 0; a < 3; ++a) {
          const Index global = i[a] - g.ghost[a] + g.in_offset[a];
          first[a] = (global - 1) * g.scale[a] - g.out_offset[a];
          last[a] = (global + 2) * g.scale[a] - g.out_offset[a];
          if (first[a] < 0) first[a] = 0;
          if (last[a] > g.out[a]) last[a] = g.out[a];
        }
        T sum = 0;
        for (Index ox = first[0]; ox < last[0]; ++ox)
          for (Index oy = first[1]; oy < last[1]; ++oy)
            for (Index oz = first[2]; oz < last[2]; ++oz) {
              const Index o[3] = {ox, oy, oz};
              T weight = 1;
              for (int a = 0; a < 3 && weight != T(0); ++a) {
                if (mode == UpsampleMode::nearest) {
                  weight =
                      (g.out_offset[a] + o[a]) / g.scale[a] - g.in_offset[a] + g.ghost[a] == i[a]
                          ? weight
                          : T(0);
                  continue;
                }
                if (g.in[a] == 1) continue;  // unused axis
                const Index entry = (a == 0 ? f0 : a == 1 ? f1 : f2) + o[a];
                const Index lower = lower_of(entry);
                const T w = weight_of(entry);
                weight *= lower == i[a] ? w : (lower + 1 == i[a] ? 1 - w : T(0));
              }
              sum += weight * gy(n, c, ox, oy, oz);
            }
        gx(n, c, ix, iy, iz) += sum;  // accumulates: nearest mode writes the input gradient
      });
}

}  // namespace

template <class T>
Upsample<T>::Upsample(const Communicator& comm, std::vector<int> scale, UpsampleMode mode,
                      const std::string& name)
    : comm_(comm), ndims_(static_cast<int>(scale.size())), mode_(mode), name_(name) {
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
      one_cell_each_side.padding[d] = 1;
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
  ShardTensor<T> y(Decomposition::from_split_points(points, periodic), x.rank(), x.batch(),
                   x.channels(), {}, name_ + ".output");
  const ShardTensor<T> source = mode_ == UpsampleMode::linear ? halo_->forward(x) : x;
  UpsampleShape shape{};
  shape.channels = x.channels();
  for (int d = 0; d < max_spatial_dims; ++d) {
    shape.scale[d] = scale_[d];
    shape.out_offset[d] = y.global_box().lower[d];
    shape.in_offset[d] = x.global_box().lower[d];
    shape.out[d] = y.local_extent(d);
    shape.in[d] = source.allocated_extent(d);
    shape.ghost[d] = source.ghosts().lower[d];
  }
  upsample_forward(shape, mode_, source.view(), y.view());

  auto node = make_result_node<T>(name_, {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    const UpsampleMode mode = mode_;
    const std::shared_ptr<HaloPadding<T>> halo = halo_;  // the graph may outlive the layer
    const std::string label = name_ + ".source_grad";
    node->backward = [=](impl::Node<T>& self) {
      if (mode == UpsampleMode::nearest) {
        upsample_backward(shape, mode, self.grad_field().view(), x_node->grad_field().view());
        return;
      }
      ShardTensor<T> grad_source(source.decomposition(), source.rank(), source.batch(),
                                 source.channels(), source.ghosts(), label);
      upsample_backward(shape, mode, self.grad_field().view(), grad_source.view());
      halo->backward(grad_source, x_node->grad_field());
    };
  }
  return Variable<T>(node);
}

template class Upsample<float>;
template class Upsample<double>;

}  // namespace shardtensor
