#include "shardtensor/layers/conv.hpp"

#include <cmath>
#include <sstream>

namespace shardtensor {

namespace {

std::vector<int> per_dim(const std::vector<int>& values, int ndims, int fallback, const char* what,
                         const std::string& where) {
  if (values.empty()) return std::vector<int>(ndims, fallback);
  SHARDTENSOR_REQUIRE(static_cast<int>(values.size()) == ndims, where,
                      what << " has " << values.size() << " values for a " << ndims << "-D kernel");
  return values;
}

/// Index arithmetic shared by the kernels: weights (out, in / groups, kx, ky, kz) in C order.
struct ConvShape {
  Index batch, in_channels, out_channels, in_per_group, out_per_group;
  Index k[3], s[3], d[3];
  Index base[3];  // padded-buffer index of the first local output's window start
  Index out[3];   // local output extents

  KOKKOS_INLINE_FUNCTION Index weight_index(Index co, Index cig, Index a, Index b, Index c) const {
    return (((co * in_per_group + cig) * k[0] + a) * k[1] + b) * k[2] + c;
  }
};

template <class T>
void conv_forward(const ConvShape& g, const FieldView<T>& xp, const ReplicatedView<T>& w,
                  const ReplicatedView<T>& bias, const FieldView<T>& y) {
  const bool has_bias = bias.extent(0) > 0;
  const Index total = g.batch * g.out_channels * g.out[0] * g.out[1] * g.out[2];
  Kokkos::parallel_for(
      "Conv::forward", total, KOKKOS_LAMBDA(const Index flat) {
        Index r = flat;
        const Index oz = r % g.out[2];
        r /= g.out[2];
        const Index oy = r % g.out[1];
        r /= g.out[1];
        const Index ox = r % g.out[0];
        r /= g.out[0];
        const Index co = r % g.out_channels;
        const Index n = r / g.out_channels;
        const Index group = co / g.out_per_group;
        T sum = has_bias ? bias(co) : T(0);
        for (Index cig = 0; cig < g.in_per_group; ++cig) {
          const Index ci = group * g.in_per_group + cig;
          for (Index a = 0; a < g.k[0]; ++a)
            for (Index b = 0; b < g.k[1]; ++b)
              for (Index c = 0; c < g.k[2]; ++c)
                sum +=
                    w(g.weight_index(co, cig, a, b, c)) *
                    xp(n, ci, g.base[0] + ox * g.s[0] + a * g.d[0],
                       g.base[1] + oy * g.s[1] + b * g.d[1], g.base[2] + oz * g.s[2] + c * g.d[2]);
        }
        y(n, co, ox, oy, oz) = sum;
      });
}

/// Gradient of the padded input: each cell gathers from the outputs whose windows cover it.
template <class T>
void conv_backward_data(const ConvShape& g, const FieldView<T>& gy, const ReplicatedView<T>& w,
                        const FieldView<T>& gxp) {
  const Index px = gxp.extent(2), py = gxp.extent(3), pz = gxp.extent(4);
  const Index total = g.batch * g.in_channels * px * py * pz;
  Kokkos::parallel_for(
      "Conv::backward_data", total, KOKKOS_LAMBDA(const Index flat) {
        Index r = flat;
        const Index iz = r % pz;
        r /= pz;
        const Index iy = r % py;
        r /= py;
        const Index ix = r % px;
        r /= px;
        const Index ci = r % g.in_channels;
        const Index n = r / g.in_channels;
        const Index group = ci / g.in_per_group, cig = ci % g.in_per_group;
        T sum = 0;
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ox = window_output_of(ix, g.base[0], a, g.s[0], g.d[0], g.out[0]);
          if (ox < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index oy = window_output_of(iy, g.base[1], b, g.s[1], g.d[1], g.out[1]);
            if (oy < 0) continue;
            for (Index c = 0; c < g.k[2]; ++c) {
              const Index oz = window_output_of(iz, g.base[2], c, g.s[2], g.d[2], g.out[2]);
              if (oz < 0) continue;
              for (Index cog = 0; cog < g.out_per_group; ++cog) {
                const Index co = group * g.out_per_group + cog;
                sum += w(g.weight_index(co, cig, a, b, c)) * gy(n, co, ox, oy, oz);
              }
            }
          }
        }
        gxp(n, ci, ix, iy, iz) = sum;
      });
}

/// This rank's partial sums of the weight and bias gradients (over its own outputs), in
/// double: they add up every output cell, and float sums in different orders on different
/// decompositions would differ by more than float precision.
template <class T>
void conv_backward_parameters(const ConvShape& g, const FieldView<T>& gy, const FieldView<T>& xp,
                              const ReplicatedView<T>& gw, const ReplicatedView<T>& gb) {
  if (gw.extent(0) > 0) {
    Kokkos::parallel_for(
        "Conv::backward_weight", static_cast<Index>(gw.extent(0)), KOKKOS_LAMBDA(const Index flat) {
          Index r = flat;
          const Index c = r % g.k[2];
          r /= g.k[2];
          const Index b = r % g.k[1];
          r /= g.k[1];
          const Index a = r % g.k[0];
          r /= g.k[0];
          const Index cig = r % g.in_per_group;
          const Index co = r / g.in_per_group;
          const Index ci = (co / g.out_per_group) * g.in_per_group + cig;
          double sum = 0;  // many terms: accumulate in double
          for (Index n = 0; n < g.batch; ++n)
            for (Index ox = 0; ox < g.out[0]; ++ox)
              for (Index oy = 0; oy < g.out[1]; ++oy)
                for (Index oz = 0; oz < g.out[2]; ++oz)
                  sum += gy(n, co, ox, oy, oz) * xp(n, ci, g.base[0] + ox * g.s[0] + a * g.d[0],
                                                    g.base[1] + oy * g.s[1] + b * g.d[1],
                                                    g.base[2] + oz * g.s[2] + c * g.d[2]);
          gw(flat) += static_cast<T>(sum);
        });
  }
  if (gb.extent(0) > 0) {
    Kokkos::parallel_for(
        "Conv::backward_bias", g.out_channels, KOKKOS_LAMBDA(const Index co) {
          double sum = 0;  // many terms: accumulate in double
          for (Index n = 0; n < g.batch; ++n)
            for (Index ox = 0; ox < g.out[0]; ++ox)
              for (Index oy = 0; oy < g.out[1]; ++oy)
                for (Index oz = 0; oz < g.out[2]; ++oz) sum += gy(n, co, ox, oy, oz);
          gb(co) += static_cast<T>(sum);
        });
  }
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
  const std::vector<int> stride = per_dim(options_.stride, ndims, 1, "stride", where);
  const std::vector<int> dilation = per_dim(options_.dilation, ndims, 1, "dilation", where);
  const std::vector<int> padding = per_dim(options_.padding, ndims, 0, "padding", where);
  for (int d = 0; d < ndims; ++d) {
    SHARDTENSOR_REQUIRE(
        options_.kernel[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 && padding[d] >= 0, where,
        "kernel " << options_.kernel[d] << ", stride " << stride[d] << ", dilation " << dilation[d]
                  << ", padding " << padding[d] << " along dim " << d);
    geometry_.kernel[d] = options_.kernel[d];
    geometry_.stride[d] = stride[d];
    geometry_.dilation[d] = dilation[d];
    geometry_.padding[d] = padding[d];
  }
  SHARDTENSOR_REQUIRE(options_.in_channels >= 1 && options_.out_channels >= 1 &&
                          options_.groups >= 1 && options_.in_channels % options_.groups == 0 &&
                          options_.out_channels % options_.groups == 0,
                      where,
                      "groups " << options_.groups << " must divide in_channels "
                                << options_.in_channels << " and out_channels "
                                << options_.out_channels);
  std::vector<Index> shape{options_.out_channels, options_.in_channels / options_.groups};
  Index fan_in = options_.in_channels / options_.groups;
  for (int d = 0; d < ndims; ++d) {
    shape.push_back(options_.kernel[d]);
    fan_in *= options_.kernel[d];
  }
  // PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = this->register_parameter("weight", shape, bound, 2 * options_.seed);
  if (options_.bias)
    bias_ = this->register_parameter("bias", {options_.out_channels}, bound, 2 * options_.seed + 1);
  halo_ = std::make_unique<HaloPadding<T>>(comm_, geometry_, options_.padding_mode, T(0), where);
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

  const ShardTensor<T> padded = halo_->forward(x);

  ShardTensor<T> y(out_decomposition, x.rank(), x.batch(), options_.out_channels, {},
                   name_ + ".output");
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
  const ReplicatedView<T> no_bias;
  conv_forward(shape, padded.view(), weight_.data(), bias_.defined() ? bias_.data() : no_bias,
               y.view());

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node(), weight_.node()};
  if (bias_.defined()) inputs.push_back(bias_.node());
  auto node = make_result_node<T>(name_, inputs);
  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    auto w_node = weight_.node();
    auto b_node = bias_.defined() ? bias_.node() : nullptr;
    const Communicator comm = comm_;
    HaloPadding<T>* halo = halo_.get();
    node->backward = [=](impl::Node<T>& self) {
      const FieldView<T> gy = self.grad_field().view();
      const ReplicatedView<T> gw =
          w_node->requires_grad ? w_node->grad_partial(comm) : ReplicatedView<T>();
      const ReplicatedView<T> gb =
          b_node && b_node->requires_grad ? b_node->grad_partial(comm) : ReplicatedView<T>();
      conv_backward_parameters(shape, gy, padded.view(), gw, gb);
      if (x_node->requires_grad) {
        ShardTensor<T> grad_padded(padded.decomposition(), padded.rank(), padded.batch(),
                                   padded.channels(), padded.ghosts(), name_ + ".padded_grad");
        conv_backward_data(shape, gy, w_node->data, grad_padded.view());
        halo->backward(grad_padded, x_node->grad_field());
      }
    };
  }
  return Variable<T>(node);
}

template class Conv<float>;
template class Conv<double>;

}  // namespace shardtensor
