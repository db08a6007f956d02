#pragma once
// PositionalEmbedding<T>: adds to each token a vector that depends on its global position,
// sharded like the tokens.

#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

enum class PositionKind {
  sincos,   ///< fixed sines and cosines of the global token coordinates (no parameters)
  learned,  ///< a parameter per (channel, token) of a fixed token grid
  none,     ///< adds nothing
};

/// y = x + pe(c, global token).
///
/// sincos: the channels are shared out among the axes, 2 * floor(channels / (2 dims)) per
/// axis (any rest is zero); along axis d with F = that count / 2 frequencies
/// w_f = 10000^(-f / F), channel 2f carries sin(w_f t_d) and channel 2f + 1 cos(w_f t_d)
/// (the 2-D sin-cos embedding of MAE, per axis). Needs nothing but the global index, so
/// every rank computes its own part and any grid size works.
///
/// learned: a parameter of shape (channels, grid...) for the token grid `grid` (given at
/// construction; other grids throw), drawn from U(-0.02, 0.02). The parameter is replicated
/// like every parameter, but each rank reads and differentiates only the entries of its
/// own tokens; the autodiff sums the per-rank partial gradients (Node::grad_partial).
template <class T>
class PositionalEmbedding : public Module<T> {
 public:
  PositionalEmbedding(const Communicator& comm, PositionKind kind, int channels,
                      std::vector<Index> grid = {}, std::uint64_t seed = 0,
                      const std::string& name = "positional_embedding");

  Variable<T> forward(const Variable<T>& input) override;
  bool reads_owned_cells_only() const override { return true; }

  PositionKind kind() const { return kind_; }

 private:
  Communicator comm_;
  PositionKind kind_;
  int channels_;
  std::vector<Index> grid_;
  std::string name_;
  Variable<T> table_;  // learned: (channels, grid...)
};

/// "sincos", "learned", "none"; throws Error listing them otherwise.
PositionKind position_kind_from_string(const std::string& name);

extern template class PositionalEmbedding<float>;
extern template class PositionalEmbedding<double>;

}  // namespace shardtensor
