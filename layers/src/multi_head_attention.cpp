#include "shardtensor/layers/multi_head_attention.hpp"

#include "shardtensor/layers/neighborhood_attention.hpp"
#include "shardtensor/layers/ring_attention.hpp"

namespace shardtensor {

AttentionKind attention_kind_from_string(const std::string& name) {
  if (name == "global") return AttentionKind::global;
  if (name == "neighborhood") return AttentionKind::neighborhood;
  SHARDTENSOR_FAIL("MultiHeadAttention",
                   "unknown attention '" << name << "'; accepted values: global, neighborhood");
}

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const Communicator& comm,
                                          MultiHeadAttentionOptions options,
                                          const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const MultiHeadAttentionOptions& o = options_;
  const std::string where = "MultiHeadAttention '" + name_ + "'";
  SHARDTENSOR_REQUIRE(o.dims >= 1 && o.dims <= max_spatial_dims, where,
                      "dims " << o.dims << " must be 1, 2 or 3");
  SHARDTENSOR_REQUIRE(
      o.heads >= 1 && o.channels >= 1, where,
      "heads " << o.heads << " and channels " << o.channels << " must be at least 1");
  SHARDTENSOR_REQUIRE(o.channels % o.heads == 0, where,
                      "channels " << o.channels << " not divisible by heads " << o.heads);
  q_ = projection("q", o.bias);
  // No key bias: it adds q . b_k to every score of a query, which the softmax cancels, so
  // its gradient is zero (rounding noise) and it would only be dead weight.
  k_ = projection("k", false);
  v_ = projection("v", o.bias);
  out_ = projection("out", o.bias);
}

template <class T>
std::shared_ptr<Conv<T>> MultiHeadAttention<T>::projection(const std::string& name, bool bias) {
  // Distinct, reproducible seeds per projection from one module seed (0: from the names).
  const std::uint64_t seed =
      options_.seed == 0 ? 0 : hash_bits(options_.seed, Module<T>::initialisation_seed(0, name));
  auto conv = make_pointwise_conv<T>(comm_, options_.dims, options_.channels, options_.channels,
                                     seed, name_ + "." + name, bias);
  this->register_module(name, conv);
  return conv;
}

template <class T>
Variable<T> MultiHeadAttention<T>::forward(const Variable<T>& input) {
  const Variable<T> q = (*q_)(input), k = (*k_)(input), v = (*v_)(input);
  if (options_.kind == AttentionKind::global)
    return (*out_)(
        ring_attention(comm_, q, k, v, options_.heads, false, options_.tf32, options_.bf16));
  NeighborhoodAttentionOptions n;
  n.heads = options_.heads;
  n.window = options_.window;
  n.dilation = options_.dilation;
  n.bf16 = options_.bf16;
  return (*out_)(neighborhood_attention(comm_, q, k, v, n));
}

template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;

}  // namespace shardtensor
