#include "shardtensor/layers/owned_cells.hpp"

#include "shardtensor/core/cell_index.hpp"

namespace shardtensor {

namespace {

/// Calls op(source cell, target cell) for every owned cell of two fields with the same owned
/// cells (any ghost widths), line by line along the innermost axis longer than one cell: z in
/// 3-D, y in 2-D (whose z lines are single cells, where a per-cell index space costs more than
/// the copy itself); on a GPU cell by cell (for_each_cell_by_lines).
template <class T, class CellOp>
void for_each_interior_pair(const char* label, const ShardTensor<T>& source,
                            const ShardTensor<T>& target, CellOp op) {
  const auto s = source.interior();
  const auto t = target.interior();
  const Index e[3] = {Index(s.extent(2)), Index(s.extent(3)), Index(s.extent(4))};
  if constexpr (!kernels_run_on_host) {
    for_each_cell_by_lines(
        ExecutionSpace(), label, s.extent(0), s.extent(1), e,
        KOKKOS_LAMBDA(Index n, Index c, Index x, Index y, Index z) {
          op(s(n, c, x, y, z), t(n, c, x, y, z));
        });
    return;
  }
  const Lines lines(s.extent(0), s.extent(1), e);
  const Index length = lines.length, s_step = s.stride(2 + lines.axis),
              t_step = t.stride(2 + lines.axis);
  for_each_line(
      ExecutionSpace(), label, lines, KOKKOS_LAMBDA(const CellIndex& c) {
        const T* from = &s(c.n, c.c, c.x, c.y, c.z);
        T* to = &t(c.n, c.c, c.x, c.y, c.z);
        if (s_step == 1 && t_step == 1) {  // a loop the compiler vectorises
          for (Index i = 0; i < length; ++i) op(from[i], to[i]);
          return;
        }
        for (Index i = 0; i < length; ++i) op(from[i * s_step], to[i * t_step]);
      });
}

}  // namespace

template <class T>
void copy_owned_cells(const ShardTensor<T>& source, const ShardTensor<T>& target) {
  for_each_interior_pair(
      "copy_owned_cells", source, target, KOKKOS_LAMBDA(const T& from, T& to) { to = from; });
}

template <class T>
void add_owned_cells(const ShardTensor<T>& source, const ShardTensor<T>& target) {
  for_each_interior_pair(
      "add_owned_cells", source, target, KOKKOS_LAMBDA(const T& from, T& to) { to += from; });
}

template <class T>
ShardTensor<T> without_ghosts(const ShardTensor<T>& field, const std::string& label) {
  const ShardTensor<T> owned = ShardTensor<T>::uninitialized(
      field.decomposition(), field.rank(), field.batch(), field.channels(), {}, label);
  copy_owned_cells(field, owned);
  return owned;
}

#define SHARDTENSOR_INSTANTIATE(T)                                              \
  template void copy_owned_cells(const ShardTensor<T>&, const ShardTensor<T>&); \
  template void add_owned_cells(const ShardTensor<T>&, const ShardTensor<T>&);  \
  template ShardTensor<T> without_ghosts(const ShardTensor<T>&, const std::string&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor
