#pragma once
// Conv<T>: N-D convolution (1-3 spatial dims) of a sharded field, with any kernel size,
// stride, dilation, padding mode and group count, equal to the unsharded convolution.

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/conv.hpp"
#include "shardtensor/layers/halo_padding.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

/// How Conv computes: the fast path (cuDNN in a GPU build that has it; else blocked im2col +
/// GEMM through KokkosBlas::gemm, or the host's vector kernels) or a direct loop (the
/// reference the fast path is tested against).
enum class ConvAlgorithm { gemm, direct };

struct ConvOptions {
  int in_channels = 1;
  int out_channels = 1;
  std::vector<int> kernel;    ///< one size per spatial dim (its length sets the dims)
  std::vector<int> stride;    ///< default 1
  std::vector<int> dilation;  ///< default 1
  std::vector<int> padding;   ///< cells added before (and after) the field per dim, default 0
  /// Cells added after the field per dim where they differ from `padding` (an ONNX file's
  /// asymmetric pads, a Pad node); default: `padding`.
  std::vector<int> padding_after;
  PaddingMode padding_mode = PaddingMode::zeros;
  int groups = 1;
  bool bias = true;
  /// Initialisation seed (same on every rank); 0 derives it from the layer name, so layers
  /// with different names start from different weights.
  std::uint64_t seed = 0;
  ConvAlgorithm algorithm = ConvAlgorithm::gemm;
  /// Bound on the GEMM path's scratch memory; chunks of output planes are sized to fit.
  std::size_t workspace_bytes = std::size_t(16) << 20;
  /// GEMM path, float, a host backend and a vector path (AVX2, AVX-512, NEON:
  /// kernels/vector_isa.hpp): register-blocked convolution kernels instead of im2col +
  /// KokkosBlas::gemm for unit strides. false: always KokkosBlas::gemm.
  bool vector_kernels = true;
  /// On the vector kernels, float 3x3 windows (in the last two axes; any window in the first)
  /// with unit strides and dilations and at least 8 input and 8 output channels per group:
  /// the forward and the input gradient by Winograd's F(2x4, 3x3) on planes of 64 output columns
  /// or more (3x fewer multiplications; within 2e-6 of the direct sums, relative to the largest,
  /// not their bits), by F(2x2, 3x3) on narrower ones and for the weight gradient (2.25x; within
  /// 1e-6); the same bits on every instruction set. false: the direct register tiles everywhere.
  bool winograd = true;
  /// GEMM path in a build with a convolution library (cuDNN in CUDA builds,
  /// kernels/conv_library.hpp): the library's convolutions where it has an algorithm for the
  /// shape, the portable kernels otherwise. false: always the portable kernels.
  bool library_kernels = true;
  /// Bound on the library's workspace: this share of the memory the device has free when a
  /// shape is first planned (and of the room left under memory.budget_mib, if set). Its
  /// algorithms are chosen among those that fit, the least workspace among those within 5 %
  /// of the fastest; all layers share one buffer, as large as the largest chosen needs.
  /// Module::set_library_workspace_share sets it for a whole model
  /// (memory.library_workspace_share).
  double library_workspace_share = 0.25;
  /// Float through the library may use TF32 tensor cores (about 1e-3 relative error, several
  /// times faster); off (the default, unlike PyTorch's cuDNN), a GPU's float results match the
  /// CPU's to 1e-5. Module::allow_tf32 sets it for a whole model (config: training.tf32).
  bool tf32 = false;
  /// bf16 operands (PyTorch autocast's convolution): the input, the weight and, in backward,
  /// the output gradient are rounded to bfloat16 (core/bfloat16.hpp), products are summed in
  /// float, and the output is rounded to bfloat16; the weight and input gradients stay float
  /// (the optimizer updates float master weights). Float layers only. Module::compute_in_bf16
  /// sets it for a whole model (config: training.precision: bf16).
  bool bf16 = false;
  /// Forward overlaps the halo exchange with interior compute: the outputs whose windows
  /// read no exchanged ghost cell are computed while the messages travel, then the rest. The
  /// results are the same either way; off measures what the overlap saves
  /// (Module::overlap_halo for a whole model, bench_scaling --overlap off).
  bool overlap_halo = true;
};

/// The kernels a Conv's forward chose for itself and its backward (Conv::last_paths).
struct ConvKernelPaths {
  bool library = false;            ///< the backend's convolution library (cuDNN)
  bool vector_kernels = false;     ///< the host's vector kernels (plane path)
  bool winograd = false;           ///< forward and input gradient on Winograd's tiles
  bool winograd_gradient = false;  ///< the weight gradient on Winograd's tiles
};

/// Convolution layer. Weights (out, in / groups, kx[, ky[, kz]]) and bias (out) are replicated;
/// their gradients are summed over the ranks that share the field.
///
/// Forward on each rank: copy the shard into a buffer with the ghost cells the windows need,
/// exchange halos (periodic padding wraps), fill zeros / replicate / reflect padding at open
/// global boundaries, and convolve the outputs this rank owns. Backward runs the adjoints in
/// reverse: input gradient into the padded buffer, padding adjoint, reverse halo exchange.
/// Where the vector kernels run and nothing but x is split (zeros or periodic padding), no
/// padded copy: the kernels read the input itself and its neighbours' x-planes
/// (SlabExchange); backward exchanges the output gradient's planes the same way.
template <class T>
class Conv : public Module<T> {
 public:
  Conv(const Communicator& comm, ConvOptions options, const std::string& name = "conv");

  Variable<T> forward(const Variable<T>& input) override;
  /// The input is copied into a padded buffer first: its ghost cells are never read.
  bool reads_owned_cells_only() const override { return true; }
  void allow_tf32(bool on) override { options_.tf32 = on; }
  void set_library_workspace_share(double share) override;
  void compute_in_bf16(bool on) override;
  void overlap_halo(bool on) override { options_.overlap_halo = on; }

  /// The ghost cells an input laid out like `like` (a field without ghost cells) should carry
  /// for forward to pad it in place instead of copying it, where its producer allocates them
  /// for this layer (concat_channels' `ghosts`): the padding's widths where forward would
  /// make a padded copy, none where it reads an input without ghost cells itself (the plane
  /// path, where nothing or only x is exchanged) or reads no ghost cell, or rounds to bf16.
  GhostWidths padded_input_ghosts(const ShardTensor<T>& like) const;

  const ConvOptions& options() const { return options_; }
  const WindowGeometry& geometry() const { return geometry_; }
  /// The kernels the last forward chose (its input's shape and layout decide; bench_conv
  /// reports them). All false before the first forward.
  const ConvKernelPaths& last_paths() const { return last_paths_; }
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

 private:
  /// Whether every rank reads `input` with slabs (`mine`: this rank may), once per layout.
  bool slabs_agree(const ShardTensor<T>& input, bool mine, Index below, Index above);

  Communicator comm_;
  ConvOptions options_;
  WindowGeometry geometry_;
  std::string name_;
  Variable<T> weight_, bias_;
  std::shared_ptr<HaloPadding<T>> halo_;  // shared with backward closures
  // Whether every rank reads slabs for inputs of this layout (the key): agreed once.
  std::vector<long long> slab_key_;
  bool slabs_agreed_ = false;
  ConvKernelPaths last_paths_;
  std::shared_ptr<kernels::ConvWorkspace<T>> workspace_ =
      std::make_shared<kernels::ConvWorkspace<T>>();
};

extern template class Conv<float>;
extern template class Conv<double>;

/// A pointwise (1x1) convolution over `dims` spatial dims, PyTorch's nn.Linear applied to
/// every cell: the projections, MLPs and skips of the models.
template <class T>
std::shared_ptr<Conv<T>> make_pointwise_conv(const Communicator& comm, int dims, Index in_channels,
                                             Index out_channels, std::uint64_t seed,
                                             const std::string& name, bool bias = true) {
  ConvOptions c;
  c.in_channels = static_cast<int>(in_channels);
  c.out_channels = static_cast<int>(out_channels);
  c.kernel.assign(dims, 1);
  c.bias = bias;
  c.seed = seed;
  return std::make_shared<Conv<T>>(comm, c, name);
}

}  // namespace shardtensor
