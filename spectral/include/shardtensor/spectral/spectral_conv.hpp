#pragma once
// SpectralConv<T>: the Fourier layer of a Fourier neural operator (Li et al. 2021) on a
// sharded 2-D or 3-D field, equal to the unsharded layer.

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/spectral/distributed_fft.hpp"

namespace shardtensor {

struct SpectralConvOptions {
  int in_channels = 1;
  int out_channels = 1;
  /// Fourier modes kept per spatial dim (its length, 2 or 3, sets the dims). Along every axis
  /// but the last, the modes 0 .. m-1 and -m .. -1 are kept (at most extent / 2); along the
  /// last (halved) axis the modes 0 .. m-1 (at most extent / 2 + 1).
  std::vector<int> modes;
  /// Initialisation seed (same on every rank); 0 derives it from the layer name.
  std::uint64_t seed = 0;
};

/// y = inverse_fft(W * fft(x)): forward FFT, at each kept mode k the complex matrix product
/// Y(o, k) = sum_i X(i, k) W(i, o, k), every other mode zero, inverse FFT. No bias.
///
/// Parameters `weight_real` and `weight_imag`, the real and imaginary parts of W, each of shape
/// (in, out, 2 m0, 2 m1, m2) in 3-D and (in, out, 2 m0, m1) in 2-D: along the axes kept with
/// both signs, entries j < m hold mode j and entries j >= m hold mode j - 2m (the reference
/// FNO's corner blocks weights1..4 side by side). Drawn from U(-1/(in*out), 1/(in*out)).
///
/// Sharding: DistributedFFT (two all-to-alls forward, two back); the spectrum is split in
/// slabs of axis 1, so each rank multiplies the kept modes it holds and the weight gradient is
/// summed over the ranks. Output on the input's decomposition, no ghost cells.
template <class T>
class SpectralConv : public Module<T> {
 public:
  SpectralConv(const Communicator& comm, SpectralConvOptions options,
               const std::string& name = "spectral_conv");

  Variable<T> forward(const Variable<T>& input) override;
  /// The FFT reads only the owned cells.
  bool reads_owned_cells_only() const override { return true; }

  const SpectralConvOptions& options() const { return options_; }
  Variable<T> weight_real() const { return weight_real_; }
  Variable<T> weight_imag() const { return weight_imag_; }

  /// Throws unless a field of these global extents can keep the layer's modes.
  void check_extents(const Decomposition& d) const;

 private:
  /// The FFT plan for a field of this layout (built on first use, then reused).
  DistributedFFT<T>& fft_for(const Decomposition& d, Index batch, Index channels);

  Communicator comm_;
  SpectralConvOptions options_;
  std::string name_;
  Variable<T> weight_real_, weight_imag_;
  std::vector<std::shared_ptr<DistributedFFT<T>>> ffts_;
};

extern template class SpectralConv<float>;
extern template class SpectralConv<double>;

}  // namespace shardtensor
