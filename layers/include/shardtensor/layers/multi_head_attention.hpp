#pragma once
// MultiHeadAttention<T>: self-attention over the cells (tokens) of a sharded field, with
// query/key/value/output projections, by ring attention (global) or neighbourhood attention.

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/layers/conv.hpp"

namespace shardtensor {

enum class AttentionKind {
  global,        ///< every token attends to every token: ring_attention
  neighborhood,  ///< every token attends to a window around it: neighborhood_attention
};

/// "global", "neighborhood"; throws Error listing them otherwise.
AttentionKind attention_kind_from_string(const std::string& name);

struct MultiHeadAttentionOptions {
  int dims = 2;       ///< spatial dims of the token field
  int channels = 64;  ///< embedding width (= heads x head dim)
  int heads = 4;
  AttentionKind kind = AttentionKind::global;
  std::vector<Index> window{7};    ///< neighbourhood: window per axis (one value: every axis)
  std::vector<Index> dilation{1};  ///< neighbourhood: dilation per axis
  bool bias = true;                ///< biases of the q, v and output projections (k never has one)
  std::uint64_t seed = 0;          ///< initialisation seed; 0 derives it from the layer name
  /// Global attention's float products may run on TF32 tensor cores where the GPU has them
  /// (as ConvOptions::tf32). Module::allow_tf32 sets it with the projections' (training.tf32).
  bool tf32 = false;
  /// Attention in bf16 (autocast's numerics: ring_attention's and neighborhood_attention's
  /// `bf16`). Module::compute_in_bf16 sets it with the projections' (training.precision).
  bool bf16 = false;
};

/// y = W_o attention(W_q x, W_k x, W_v x) + b_o, the projections pointwise (1x1
/// convolutions: PyTorch's nn.Linear on each token), attention per head with scale
/// 1 / sqrt(head dim). Parameter names: q.weight, q.bias, k.weight, v.weight, v.bias,
/// out.weight, out.bias. The key projection has no bias: a key bias adds the same q . b to
/// every score of a query, which the softmax cancels (PyTorch's in_proj_bias for k gets a
/// zero gradient for the same reason).
///
/// Sharding: the projections need no communication; global attention rings K/V blocks
/// around the ranks of `comm` (docs/attention.md, "Ring attention"), neighbourhood
/// attention exchanges a halo of K/V the width of the window ("Neighbourhood attention").
/// The module's output has the input's decomposition.
template <class T>
class MultiHeadAttention : public Module<T> {
 public:
  MultiHeadAttention(const Communicator& comm, MultiHeadAttentionOptions options,
                     const std::string& name = "attention");

  Variable<T> forward(const Variable<T>& input) override;
  bool reads_owned_cells_only() const override { return true; }
  void allow_tf32(bool on) override {
    options_.tf32 = on;
    Module<T>::allow_tf32(on);
  }
  void compute_in_bf16(bool on) override {
    Module<T>::compute_in_bf16(on);  // the projections (double refuses, naming the layer)
    options_.bf16 = on;
  }

  const MultiHeadAttentionOptions& options() const { return options_; }

 private:
  std::shared_ptr<Conv<T>> projection(const std::string& name, bool bias);

  Communicator comm_;
  MultiHeadAttentionOptions options_;
  std::string name_;
  std::shared_ptr<Conv<T>> q_, k_, v_, out_;
};

extern template class MultiHeadAttention<float>;
extern template class MultiHeadAttention<double>;

}  // namespace shardtensor
