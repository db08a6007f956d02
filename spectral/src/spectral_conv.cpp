#include "shardtensor/spectral/spectral_conv.hpp"
#include "shardtensor/core/execution.hpp"

#include <vector>

namespace shardtensor {

namespace {

std::string layer_name(std::size_t ndims, const std::string& name) {
  return "SpectralConv" + std::to_string(ndims) + "d '" + name + "'";
}

/// For each local mode along one axis, its index in the weight's axis, or -1 if the layer
/// drops the mode. `both_signs`: the axis keeps modes 0..m-1 and n-m..n-1 (not the last axis).
Kokkos::View<Index*, DefaultMemorySpace> weight_index_map(Index first_mode, Index local_modes,
                                                          Index extent, Index kept,
                                                          bool both_signs) {
  Kokkos::View<Index*, DefaultMemorySpace> map("spectral_conv_modes", local_modes);
  auto host = Kokkos::create_mirror_view(map);
  for (Index l = 0; l < local_modes; ++l) {
    const Index k = first_mode + l;
    host(l) = k < kept ? k : (both_signs && k >= extent - kept ? k - (extent - 2 * kept) : -1);
  }
  Kokkos::deep_copy(map, host);
  return map;
}

/// The kept modes of one rank's spectrum block and where their weights are.
struct ModeMap {
  Kokkos::View<Index*, DefaultMemorySpace> axis[max_spatial_dims];
  Index weight_extent[max_spatial_dims] = {1, 1, 1};  // (w0, w1, w2)
};

}  // namespace

template <class T>
SpectralConv<T>::SpectralConv(const Communicator& comm, SpectralConvOptions options,
                              const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const std::size_t ndims = options_.modes.size();
  SHARDTENSOR_REQUIRE(ndims == 2 || ndims == 3, "SpectralConv '" + name + "'",
                      "modes needs 2 or 3 sizes (one per spatial dim), got " << ndims);
  const std::string where = layer_name(ndims, name);
  SHARDTENSOR_REQUIRE(options_.in_channels >= 1 && options_.out_channels >= 1, where,
                      "in_channels " << options_.in_channels << " and out_channels "
                                     << options_.out_channels << " must be at least 1");
  std::vector<Index> shape{options_.in_channels, options_.out_channels};
  for (std::size_t a = 0; a < ndims; ++a) {
    SHARDTENSOR_REQUIRE(options_.modes[a] >= 1, where,
                        "modes " << options_.modes[a] << " along axis " << a
                                 << " must be at least 1");
    shape.push_back(a + 1 < ndims ? 2 * options_.modes[a] : options_.modes[a]);
  }
  const double bound = 1.0 / (double(options_.in_channels) * double(options_.out_channels));
  const std::uint64_t seed = this->initialisation_seed(options_.seed, name);
  weight_real_ = this->register_parameter("weight_real", shape, bound, 2 * seed);
  weight_imag_ = this->register_parameter("weight_imag", shape, bound, 2 * seed + 1);
}

template <class T>
void SpectralConv<T>::check_extents(const Decomposition& d) const {
  const int ndims = int(options_.modes.size());
  const std::string where = layer_name(ndims, name_);
  SHARDTENSOR_REQUIRE(d.ndims() == ndims, where,
                      "input is a " << d.ndims() << "-D field (" << d.describe()
                                    << "), the layer is " << ndims << "-D");
  for (int a = 0; a < ndims; ++a) {
    const Index n = d.global_extent(a);
    const bool last = a == ndims - 1;
    const Index limit = last ? n / 2 + 1 : n / 2;
    SHARDTENSOR_REQUIRE(
        options_.modes[a] <= limit, where,
        "modes " << options_.modes[a] << " along axis " << a << " exceed the Nyquist limit "
                 << limit << " of a field extent " << n
                 << (last ? " (the last axis keeps modes 0 .. m-1: m <= extent / 2 + 1)"
                          : " (modes -m .. m-1 are kept: m <= extent / 2)"));
  }
}

template <class T>
DistributedFFT<T>& SpectralConv<T>::fft_for(const Decomposition& d, Index batch, Index channels) {
  for (const auto& fft : ffts_)
    if (fft->decomposition() == d && fft->batch() == batch && fft->channels() == channels)
      return *fft;
  ffts_.push_back(std::make_shared<DistributedFFT<T>>(comm_, d, batch, channels));
  return *ffts_.back();
}

template <class T>
Variable<T> SpectralConv<T>::forward(const Variable<T>& input) {
  const int ndims = int(options_.modes.size());
  const std::string where = layer_name(ndims, name_);
  SHARDTENSOR_REQUIRE(input.is_field(), where, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(x.channels() == options_.in_channels, where,
                      "input has " << x.channels() << " channels, the layer expects "
                                   << options_.in_channels);
  check_extents(x.decomposition());
  const Decomposition& d = x.decomposition();
  const Index batch = x.batch(), cin = options_.in_channels, cout = options_.out_channels;
  DistributedFFT<T>& fft_in = fft_for(d, batch, cin);
  DistributedFFT<T>& fft_out = fft_for(d, batch, cout);
  std::shared_ptr<DistributedFFT<T>> in_plan, out_plan;
  for (const auto& f : ffts_) {
    if (f.get() == &fft_in) in_plan = f;
    if (f.get() == &fft_out) out_plan = f;
  }

  // Which local modes are kept, and where their weights are.
  const Box modes = fft_in.local_spectral_box();
  ModeMap map;
  for (int a = 0; a < max_spatial_dims; ++a) {
    const bool spatial = a < ndims;
    const Index kept = spatial ? options_.modes[a] : 1;
    const bool both_signs = a + 1 < ndims;
    map.weight_extent[a] = both_signs ? 2 * kept : kept;
    map.axis[a] = weight_index_map(modes.lower[a], modes.extent[a],
                                   spatial ? d.global_extent(a) : 1, kept, both_signs);
  }

  const SpectralView<T> xs = fft_in.forward(x);
  const SpectralView<T> ys = fft_out.allocate_spectrum("spectral_conv_modes");
  const auto wr = weight_real_.data(), wi = weight_imag_.data();
  const auto m0 = map.axis[0], m1 = map.axis[1], m2 = map.axis[2];
  const Index w0 = map.weight_extent[0], w1 = map.weight_extent[1], w2 = map.weight_extent[2];
  const Index e0 = modes.extent[0], e1 = modes.extent[1], e2 = modes.extent[2];
  // Flat weight index of (i, o) at the local mode (k0, k1, k2), or -1 for a dropped mode.
  const auto weight_at = KOKKOS_LAMBDA(Index i, Index o, Index k0, Index k1, Index k2)->Index {
    const Index j0 = m0(k0), j1 = m1(k1), j2 = m2(k2);
    if (j0 < 0 || j1 < 0 || j2 < 0) return -1;
    return (((i * cout + o) * w0 + j0) * w1 + j1) * w2 + j2;
  };
  using Complex = Kokkos::complex<T>;
  const Index cells = e0 * e1 * e2;
  Kokkos::parallel_for(
      "SpectralConv::forward", batch * cout * cells, KOKKOS_LAMBDA(const Index flat) {
        const Index cell = flat % cells, no = flat / cells;
        const Index n = no / cout, o = no % cout;
        const Index k2 = cell % e2, k1 = (cell / e2) % e1, k0 = cell / (e1 * e2);
        if (weight_at(0, o, k0, k1, k2) < 0) return;  // stays zero
        Complex sum(0, 0);
        for (Index i = 0; i < cin; ++i) {
          const Index w = weight_at(i, o, k0, k1, k2);
          sum += xs(n, i, k0, k1, k2) * Complex(wr(w), wi(w));
        }
        ys(n, o, k0, k1, k2) = sum;
      });
  const ShardTensor<T> y = fft_out.inverse(ys);

  auto node = make_result_node<T>(where, {input.node(), weight_real_.node(), weight_imag_.node()});
  node->field = y;
  if (node->requires_grad) {
    auto xn = input.node(), wrn = weight_real_.node(), win = weight_imag_.node();
    const Communicator comm = comm_;
    node->backward = [=](impl::Node<T>& self) {
      const SpectralView<T> gys = out_plan->inverse_adjoint(self.grad_field());
      if (wrn->requires_grad || win->requires_grad) {
        // dL/dW = sum_n conj(X) GY per kept mode; each (i, o, mode) has its own weight entry.
        const ReplicatedView<T> gwr = wrn->grad_partial(comm), gwi = win->grad_partial(comm);
        Kokkos::parallel_for(
            "SpectralConv::backward_weight", cin * cout * cells, KOKKOS_LAMBDA(const Index flat) {
              const Index cell = flat % cells, io = flat / cells;
              const Index i = io / cout, o = io % cout;
              const Index k2 = cell % e2, k1 = (cell / e2) % e1, k0 = cell / (e1 * e2);
              const Index w = weight_at(i, o, k0, k1, k2);
              if (w < 0) return;
              Complex sum(0, 0);
              for (Index n = 0; n < batch; ++n)
                sum += Kokkos::conj(xs(n, i, k0, k1, k2)) * gys(n, o, k0, k1, k2);
              gwr(w) += sum.real();
              gwi(w) += sum.imag();
            });
      }
      if (xn->requires_grad) {
        // GX = sum_o GY conj(W), then the adjoint of the forward FFT.
        const SpectralView<T> gxs = in_plan->allocate_spectrum("spectral_conv_input_grad");
        Kokkos::parallel_for(
            "SpectralConv::backward_input", batch * cin * cells, KOKKOS_LAMBDA(const Index flat) {
              const Index cell = flat % cells, ni = flat / cells;
              const Index n = ni / cin, i = ni % cin;
              const Index k2 = cell % e2, k1 = (cell / e2) % e1, k0 = cell / (e1 * e2);
              if (weight_at(i, 0, k0, k1, k2) < 0) return;
              Complex sum(0, 0);
              for (Index o = 0; o < cout; ++o) {
                const Index w = weight_at(i, o, k0, k1, k2);
                sum += gys(n, o, k0, k1, k2) * Complex(wr(w), -wi(w));
              }
              gxs(n, i, k0, k1, k2) = sum;
            });
        const ShardTensor<T> gx = in_plan->forward_adjoint(gxs);
        const ShardTensor<T>& grad = xn->grad_field();
        const auto src = gx.view();
        const auto dst = grad.view();
        const Box interior = grad.interior_box();
        const Index g0 = interior.lower[0], g1 = interior.lower[1], g2 = interior.lower[2];
        Kokkos::parallel_for(
            "SpectralConv::add_input_grad",
            Kokkos::MDRangePolicy<RightRank<5>>(
                {0, 0, 0, 0, 0}, {Index(src.extent(0)), Index(src.extent(1)), Index(src.extent(2)),
                                  Index(src.extent(3)), Index(src.extent(4))}),
            KOKKOS_LAMBDA(const Index n, const Index c, const Index i, const Index j,
                          const Index k) {
              dst(n, c, i + g0, j + g1, k + g2) += src(n, c, i, j, k);
            });
      }
    };
  }
  return Variable<T>(node);
}

template class SpectralConv<float>;
template class SpectralConv<double>;

}  // namespace shardtensor
