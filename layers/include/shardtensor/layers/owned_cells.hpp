#pragma once
// The owned cells of fields laid out with different ghost widths: copied or added from one to
// the other, or copied into a field without ghost cells.

#include <string>

#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// target's owned cells = source's (the same owned cells, any ghost widths on either).
template <class T>
void copy_owned_cells(const ShardTensor<T>& source, const ShardTensor<T>& target);

/// target's owned cells += source's (the same owned cells, any ghost widths on either).
template <class T>
void add_owned_cells(const ShardTensor<T>& source, const ShardTensor<T>& target);

/// A new field without ghost cells, labelled `label`, holding a copy of `field`'s owned cells:
/// where a field is kept and its ghost cells are no longer read (a gradient that was a padded
/// buffer), so that it holds only the cells it owns.
template <class T>
ShardTensor<T> without_ghosts(const ShardTensor<T>& field, const std::string& label);

extern template void copy_owned_cells(const ShardTensor<float>&, const ShardTensor<float>&);
extern template void copy_owned_cells(const ShardTensor<double>&, const ShardTensor<double>&);
extern template void add_owned_cells(const ShardTensor<float>&, const ShardTensor<float>&);
extern template void add_owned_cells(const ShardTensor<double>&, const ShardTensor<double>&);
extern template ShardTensor<float> without_ghosts(const ShardTensor<float>&, const std::string&);
extern template ShardTensor<double> without_ghosts(const ShardTensor<double>&, const std::string&);

}  // namespace shardtensor
