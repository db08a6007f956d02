#pragma once
// Where a correlation's source rows are, for the host kernels that read them row by row
// (conv_vector.cpp's ring copies, conv_winograd.cpp's transforms): the field's own, the
// field's an extent away along a `wrap` axis, past its ends along the slab axis its slabs'
// (SourceSlabs), or none (zeros).

#include "row_padding.hpp"
#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels::host {

class SourceRows {
 public:
  SourceRows(const Correlation& r, const FieldView<float>& src, const SourceSlabs<float>& slabs)
      : r_(r), src_(src), slabs_(slabs) {}
  /// Whether source plane sx has cells.
  bool plane(Index sx) const { return where(0, sx) != outside; }
  /// Row (sx, sy) of channel c of sample n (cell 0 of the row), null where it has no cells.
  const float* row(Index n, Index c, Index sx, Index sy) const {
    Index i[2] = {sx, sy};
    int field = in_field;
    for (int a = 0; a < 2; ++a) {
      const int w = where(a, i[a]);
      if (w == outside) return nullptr;
      if (w == in_field) {
        if (r_.wrap[a]) i[a] = wrapped(i[a], r_.src[a]);
      } else {
        field = w;
        i[a] = w == in_lower_slab ? i[a] + Index(slabs_.lower.extent(2 + a)) : i[a] - r_.src[a];
      }
    }
    if (field == in_field) return &src_(n, c, i[0], i[1], 0);
    return field == in_lower_slab ? &slabs_.lower(n, c, i[0], i[1], 0)
                                  : &slabs_.upper(n, c, i[0], i[1], 0);
  }

 private:
  static constexpr int in_field = 0, in_lower_slab = -1, in_upper_slab = 1, outside = 2;
  /// Where index i along axis a (0 or 1) lies: the field (or wrapped into it), a slab, or
  /// outside.
  int where(int a, Index i) const {
    if (r_.wrap[a] || (i >= 0 && i < r_.src[a])) return in_field;
    if (a != r_.slab_axis) return outside;
    if (i < 0) return -i <= Index(slabs_.lower.extent(2 + a)) ? in_lower_slab : outside;
    return i - r_.src[a] < Index(slabs_.upper.extent(2 + a)) ? in_upper_slab : outside;
  }
  const Correlation& r_;
  FieldView<float> src_;  // Views: shared handles, not copies of the cells
  SourceSlabs<float> slabs_;
};

}  // namespace shardtensor::kernels::host
