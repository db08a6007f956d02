#include "shardtensor/layers/halo_padding.hpp"

#include "shardtensor/layers/owned_cells.hpp"

#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/cell_index.hpp"

#include "shardtensor/comm/impl/layout_check.hpp"

namespace shardtensor {

namespace {

/// p[i * step] = 0 for i in [0, count). One or two cells (the padding of a 3- or 5-wide
/// window) are stored directly: as a loop they became a memset call per line, most of a
/// short line's time (2 % of the main job's step).
template <class T>
KOKKOS_INLINE_FUNCTION void zero_cells(T* p, Index count, Index step) {
  if (count == 1) {
    p[0] = T(0);
  } else if (count == 2) {
    p[0] = T(0);
    p[step] = T(0);
  } else {
    for (Index i = 0; i < count; ++i) p[i * step] = T(0);
  }
}

/// A value as the padded buffer holds it: rounded to bfloat16 where asked (float only).
template <class T>
struct PaddedValue {
  bool to_bfloat16;
  KOKKOS_INLINE_FUNCTION T operator()(T value) const {
    if constexpr (std::is_same<T, float>::value)
      return to_bfloat16 ? round_to_bfloat16(value) : value;
    return value;
  }
};

/// padded = the input's owned cells (rounded to bfloat16 if asked) with zeros around them (its
/// ghost and padding cells), in one pass over the lines of the buffer along its innermost axis
/// longer than one cell: a line outside the interior is zeroed whole, a line through it copied
/// with its two ends zeroed. On a GPU cell by cell (for_each_cell_by_lines). `padded` may be
/// the input itself (padded in place): then only the cells around its owned ones are zeroed.
template <class T>
void fill_padded(const ShardTensor<T>& input, const ShardTensor<T>& padded, bool to_bfloat16) {
  const Box inner = padded.interior_box();
  const auto v = padded.view();
  const auto s = input.interior();
  const bool in_place = input.view().data() == v.data();
  const Index e[3] = {padded.allocated_extent(0), padded.allocated_extent(1),
                      padded.allocated_extent(2)};
  if constexpr (!kernels_run_on_host) {
    const Index lo0 = inner.lower[0], lo1 = inner.lower[1], lo2 = inner.lower[2];
    const Index hi0 = inner.upper(0), hi1 = inner.upper(1), hi2 = inner.upper(2);
    const PaddedValue<T> value{to_bfloat16};
    for_each_cell_by_lines(
        ExecutionSpace(), "fill_padded", v.extent(0), v.extent(1), e,
        KOKKOS_LAMBDA(Index n, Index c, Index x, Index y, Index z) {
          const bool inside = x >= lo0 && x < hi0 && y >= lo1 && y < hi1 && z >= lo2 && z < hi2;
          if (!inside)
            v(n, c, x, y, z) = T(0);
          else if (!in_place)
            v(n, c, x, y, z) = value(s(n, c, x - lo0, y - lo1, z - lo2));
        });
    return;
  }
  const Lines lines(v.extent(0), v.extent(1), e);
  const int axis = lines.axis;
  const Index lo[3] = {inner.lower[0], inner.lower[1], inner.lower[2]};
  const Index hi[3] = {inner.upper(0), inner.upper(1), inner.upper(2)};
  const Index length = lines.length, step = v.stride(2 + axis), from_step = s.stride(2 + axis);
  const PaddedValue<T> value{to_bfloat16};
  for_each_line(
      ExecutionSpace(), "fill_padded", lines, KOKKOS_LAMBDA(const CellIndex& c) {
        // Scalars, not arrays indexed by the axis (a store and reload per line).
        const bool through_interior = (axis == 0 || (c.x >= lo[0] && c.x < hi[0])) &&
                                      (axis == 1 || (c.y >= lo[1] && c.y < hi[1])) &&
                                      (axis == 2 || (c.z >= lo[2] && c.z < hi[2]));
        T* p = &v(c.n, c.c, c.x, c.y, c.z);
        if (!through_interior) {
          for (Index i = 0; i < length; ++i) p[i * step] = T(0);
          return;
        }
        zero_cells(p, lo[axis], step);
        zero_cells(p + hi[axis] * step, length - hi[axis], step);
        if (in_place) return;
        const T* from = &s(c.n, c.c, axis == 0 ? 0 : c.x - lo[0], axis == 1 ? 0 : c.y - lo[1],
                           axis == 2 ? 0 : c.z - lo[2]);
        T* to = p + lo[axis] * step;
        const Index owned = hi[axis] - lo[axis];
        if (step == 1 && from_step == 1 && !value.to_bfloat16) {
          // The common case, unit strides and no rounding: a loop the compiler vectorises.
          for (Index i = 0; i < owned; ++i) to[i] = from[i];
          return;
        }
        for (Index i = 0; i < owned; ++i) to[i * step] = value(from[i * from_step]);
      });
}

/// Zeros / periodic / replicate / reflect padding of the widths the windows read past the
/// field's ends.
BoundaryPadding window_padding(const WindowGeometry& geometry, PaddingMode mode, double constant) {
  BoundaryPadding boundary;
  boundary.mode = mode;
  boundary.constant = constant;
  for (int d = 0; d < geometry.ndims; ++d) {
    boundary.lower[d] = geometry.padding_lower[d];
    boundary.upper[d] = geometry.reach_past_end(d);
  }
  return boundary;
}

}  // namespace

template <class T>
HaloPadding<T>::HaloPadding(const Communicator& comm, const WindowGeometry& geometry,
                            PaddingMode mode, T constant, std::string where)
    : HaloPadding(comm, geometry.input_ghosts(),
                  window_padding(geometry, mode, static_cast<double>(constant)), std::move(where)) {
}

template <class T>
HaloPadding<T>::HaloPadding(const Communicator& comm, const GhostWidths& ghosts,
                            const BoundaryPadding& boundary, std::string where)
    : comm_(comm), ghosts_(ghosts), boundary_(boundary), where_(std::move(where)), plans_(comm) {
  for (int d = 0; d < max_spatial_dims; ++d)
    SHARDTENSOR_REQUIRE(ghosts_.lower[d] >= 0 && ghosts_.upper[d] >= 0 && boundary_.lower[d] >= 0 &&
                            boundary_.upper[d] >= 0 && boundary_.lower[d] <= ghosts_.lower[d] &&
                            boundary_.upper[d] <= ghosts_.upper[d],
                        where_,
                        "boundary padding ("
                            << boundary_.lower[d] << ", " << boundary_.upper[d] << ") along dim "
                            << d << " must be non-negative and fit the ghost widths " << ghosts_);
}

template <class T>
void HaloPadding<T>::round_to_bfloat16(bool on) {
  SHARDTENSOR_REQUIRE(!on || (std::is_same<T, float>::value), where_,
                      "bf16 operands need a float model, this one is double");
  bfloat16_ = on;
}

template <class T>
Decomposition HaloPadding<T>::padded_decomposition(const Decomposition& input) const {
  // Same split; periodic when the padding wraps around (the op's padding mode decides, not
  // the field's periodic flags).
  std::vector<std::vector<Index>> points;
  for (int d = 0; d < input.ndims(); ++d) points.push_back(input.split_points(d));
  return Decomposition::from_split_points(
      points, std::vector<bool>(input.ndims(), boundary_.mode == PaddingMode::periodic));
}

template <class T>
HaloExchange<T>& HaloPadding<T>::plan_for(const ShardTensor<T>& padded) {
  return *plans_.plan(padded, where_);
}

template <class T>
void HaloPadding<T>::start_exchange(const ShardTensor<T>& padded) {
  HaloExchange<T>& plan = plan_for(padded);
  // The layers read the buffer between start() and finish() (the halo overlap), never write it.
  plan.start(padded, bfloat16_ ? plan.wire_for_bfloat16_values() : HaloWire::native,
             OwnedCells::unchanged);
}

template <class T>
ShardTensor<T> HaloPadding<T>::forward(const ShardTensor<T>& input, bool ghosts_are_scratch) {
  const ShardTensor<T> padded = start(input, ghosts_are_scratch);
  finish(padded);
  return padded;
}

template <class T>
bool HaloPadding<T>::reads_in_place(const ShardTensor<T>& input) const {
  // Without ghost cells the padded layout differs from the input's at most in its periodic
  // flags, which no read then sees: a periodic field into a kernel-2 stride-2 transposed
  // convolution (zeros padding) was copied whole for them.
  return !bfloat16_ && ghosts_ == GhostWidths{} && input.ghosts() == GhostWidths{};
}

template <class T>
bool HaloPadding<T>::pads_in_place(const ShardTensor<T>& input) const {
  return !bfloat16_ && input.owns_memory() && !(ghosts_ == GhostWidths{}) &&
         input.ghosts() == ghosts_ &&
         padded_decomposition(input.decomposition()) == input.decomposition();
}

template <class T>
bool HaloPadding<T>::reads_input_itself(const ShardTensor<T>& input, std::array<bool, 3>& wraps,
                                        bool reader_rounds) const {
  wraps = {false, false, false};
  if ((bfloat16_ && !reader_rounds) || !(input.ghosts() == GhostWidths{})) return false;
  if (boundary_.mode == PaddingMode::zeros)
    return boundary_.constant == 0 && exchanges_nothing(input.decomposition());
  if (boundary_.mode != PaddingMode::periodic || comm_.size() != 1) return false;
  for (int d = 0; d < max_spatial_dims; ++d)
    wraps[d] = ghosts_.lower[d] > 0 || ghosts_.upper[d] > 0;
  return true;
}

template <class T>
bool HaloPadding<T>::reads_input_with_slabs(const ShardTensor<T>& input, std::array<bool, 3>& wraps,
                                            bool reader_rounds) const {
  wraps = {false, false, false};
  const Decomposition& decomposition = input.decomposition();
  if ((bfloat16_ && !reader_rounds) || !(input.ghosts() == GhostWidths{}) ||
      comm_.size() != decomposition.nranks())
    return false;
  if (!(boundary_.mode == PaddingMode::zeros && boundary_.constant == 0) && !periodic())
    return false;
  if (!SlabExchange<T>::covers(decomposition, ghosts_.lower[0], ghosts_.upper[0])) return false;
  for (int d = 1; d < max_spatial_dims; ++d)
    wraps[d] = periodic() && (ghosts_.lower[d] > 0 || ghosts_.upper[d] > 0);
  return true;
}

template <class T>
bool HaloPadding<T>::exchanges_nothing(const Decomposition& decomposition) const {
  for (int d = 0; d < max_spatial_dims; ++d)
    if ((ghosts_.lower[d] > 0 || ghosts_.upper[d] > 0) &&
        (decomposition.process_grid(d) != 1 || boundary_.mode == PaddingMode::periodic))
      return false;
  return true;
}

template <class T>
ShardTensor<T> HaloPadding<T>::start(const ShardTensor<T>& input, bool ghosts_are_scratch) {
  const Decomposition decomposition = padded_decomposition(input.decomposition());
  check_padding_sources(decomposition, boundary_, where_);
  if (reads_in_place(input)) {
    // Sends nothing; finish() completes it as for a copy.
    if (!exchanges_nothing(decomposition)) start_exchange(input);
    return input;
  }
  if (ghosts_are_scratch && pads_in_place(input)) {
    // The shell starts at zero as a copy's would (what another layer left there goes).
    fill_padded(input, input, false);
    if (!exchanges_nothing(decomposition)) start_exchange(input);
    return input;
  }
  // Only the shell around the owned cells starts at zero (the ghosts and the zeros padding):
  // the owned cells are copied in the same pass (zero-filling them too was a second pass over
  // the field).
  ShardTensor<T> padded =
      ShardTensor<T>::uninitialized(decomposition, input.rank(), input.batch(), input.channels(),
                                    ghosts_, where_ + " padded input");
  fill_padded(input, padded, bfloat16_);
  if (!exchanges_nothing(decomposition)) start_exchange(padded);
  return padded;
}

template <class T>
void HaloPadding<T>::finish(const ShardTensor<T>& padded) {
  if (!exchanges_nothing(padded.decomposition())) plan_for(padded).finish(padded);
  // Zeros padding is already there (start() zero-fills the shell): filling it again was a
  // pass over every padding cell per layer call.
  if (!padding_ready_after_start()) fill_boundary_padding(padded, boundary_);
}

template <class T>
std::vector<Box> HaloPadding<T>::exchanged_boxes(const ShardTensor<T>& padded) {
  std::vector<Box> boxes;
  if (exchanges_nothing(padded.decomposition())) return boxes;
  for (const auto& m : plan_for(padded).messages())
    if (m.recv_count > 0) boxes.push_back(m.recv_box);
  return boxes;
}

template <class T>
void HaloPadding<T>::backward(const ShardTensor<T>& padded_grad, const ShardTensor<T>& input_grad,
                              bool overwrite) {
  // A buffer without ghost cells (the input itself, read in place or unpadded) has no
  // padding or ghost gradient to return. Zeros padding copies no cell: its gradient goes
  // nowhere (and is never read), so there is nothing to return either.
  const bool shell = !(padded_grad.ghosts() == GhostWidths{});
  if (shell && boundary_.mode != PaddingMode::zeros)
    unfill_boundary_padding(padded_grad, boundary_);
  if (shell && !exchanges_nothing(padded_grad.decomposition()))
    plan_for(padded_grad).reverse_accumulate(padded_grad);
  if (input_grad.view().data() == padded_grad.view().data()) {
    // The gradient of an input padded in place, taken over: its owned cells are in place.
    SHARDTENSOR_REQUIRE(overwrite, where_,
                        "a padded gradient can only be its input's own if written");
    if (shell) fill_padded(padded_grad, padded_grad, false);
    return;
  }
  if (overwrite)
    copy_owned_cells(padded_grad, input_grad);
  else
    add_owned_cells(padded_grad, input_grad);
}

template <class T>
PaddedShell<T> HaloPadding<T>::shell(const ShardTensor<T>& padded, const ShardTensor<T>& input) {
  PaddedShell<T> shell;
  shell.in_place =
      padded.view().data() == input.view().data() && !(padded.ghosts() == GhostWidths{});
  shell.boxes = exchanged_boxes(padded);  // the rest of the shell is recomputed in rebuild()
  const Index per_cell = padded.batch() * padded.channels();
  Index cells = 0;
  for (const Box& b : shell.boxes) cells += b.size();
  if (cells * per_cell == 0) return shell;  // nothing exchanged: no View (Kokkos allocates one)
  const auto no_init = Kokkos::view_alloc(Kokkos::WithoutInitializing, where_ + " padding shell");
  std::size_t offset = 0;
  if constexpr (std::is_same<T, float>::value) {
    if (bfloat16_) {  // bfloat16 values: their bits are all of them
      shell.bfloat16_values =
          Kokkos::View<std::uint16_t*, DefaultMemorySpace>(no_init, cells * per_cell);
      for (const Box& b : shell.boxes) {
        pack_box_bfloat16(ExecutionSpace(), padded.view(), b, shell.bfloat16_values, offset);
        offset += static_cast<std::size_t>(b.size() * per_cell);
      }
      return shell;
    }
  }
  shell.values = Kokkos::View<T*, DefaultMemorySpace>(no_init, cells * per_cell);
  for (const Box& b : shell.boxes) {
    pack_box(ExecutionSpace(), padded.view(), b, shell.values, offset);
    offset += static_cast<std::size_t>(b.size() * per_cell);
  }
  return shell;
}

template <class T>
ShardTensor<T> HaloPadding<T>::rebuild(const ShardTensor<T>& input,
                                       const PaddedShell<T>& shell) const {
  if (reads_in_place(input)) return input;
  // forward()'s steps, with the exchanged ghosts from the shell instead of the neighbours.
  ShardTensor<T> padded =
      shell.in_place ? input
                     : ShardTensor<T>::uninitialized(padded_decomposition(input.decomposition()),
                                                     input.rank(), input.batch(), input.channels(),
                                                     ghosts_, where_ + " padded input");
  fill_padded(input, padded, bfloat16_);
  const Index per_cell = padded.batch() * padded.channels();
  std::size_t offset = 0;
  for (const Box& b : shell.boxes) {
    if constexpr (std::is_same<T, float>::value) {
      if (shell.bfloat16_values.extent(0) > 0)
        unpack_box_bfloat16(ExecutionSpace(), shell.bfloat16_values, padded.view(), b, offset);
      else
        unpack_box(ExecutionSpace(), shell.values, padded.view(), b, UnpackMode::assign, offset);
    } else {
      unpack_box(ExecutionSpace(), shell.values, padded.view(), b, UnpackMode::assign, offset);
    }
    offset += static_cast<std::size_t>(b.size() * per_cell);
  }
  if (!padding_ready_after_start()) fill_boundary_padding(padded, boundary_);
  return padded;
}

template class HaloPadding<float>;
template class HaloPadding<double>;

}  // namespace shardtensor
