#pragma once
// The execution space instance that every kernel takes first (those of kernels/, and core's
// cell loops; as ArborX's algorithms do). A kernel dispatches all its work on that instance:
// layers pass the default one (`ExecutionSpace()`); work that should run beside other work
// gets an instance of its own (on a GPU, a stream). Kernels do not fence: a caller that reads
// their results on the host, or on another instance, fences `space` first.

#include <Kokkos_Core.hpp>
#include <type_traits>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// The execution space of the kernels: the one whose memory (DefaultMemorySpace) fields and
/// parameters live in.
using ExecutionSpace = Kokkos::DefaultExecutionSpace;

/// True where the kernels run on the host (Serial, OpenMP): host code may then read their
/// Views and split work over the host threads itself.
constexpr bool kernels_run_on_host =
    std::is_same<ExecutionSpace, Kokkos::DefaultHostExecutionSpace>::value;

/// An instance whose work may run beside the default instance's: on a GPU a stream of its
/// own (the halo exchange packs and unpacks there while interior kernels run). Host backends
/// give the default instance: their kernels run one after another anyway.
inline ExecutionSpace independent_instance() {
#if KOKKOS_VERSION >= 40000
  if constexpr (!kernels_run_on_host)
    return Kokkos::Experimental::partition_space(ExecutionSpace(), 1)[0];
#endif
  return ExecutionSpace();
}

/// The iteration of an MDRangePolicy over the cells of LayoutRight views (fields, their
/// subviews): the last index fastest on every backend. CUDA's default runs the first index
/// fastest, so neighbouring threads touched cells a plane apart and every access was its own
/// memory transaction; the host backends' default is this one already.
template <unsigned N>
using RightRank = Kokkos::Rank<N, Kokkos::Iterate::Right, Kokkos::Iterate::Right>;

/// The indices [0, n) on `space`.
inline Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<Index>> kernel_range(
    const ExecutionSpace& space, Index n) {
  return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<Index>>(space, 0, n);
}

/// Sets every element of a contiguous View to `value` on `space`, as one kernel that nothing
/// waits for. Kokkos::deep_copy(view, value) fences before and after: two device syncs per
/// parameter per training step where gradients are zeroed.
template <class View>
void fill_values(const ExecutionSpace& space, const View& view,
                 typename View::non_const_value_type value = 0) {
  using Value = typename View::non_const_value_type;
  Value* const data = view.data();
  Kokkos::parallel_for(
      "fill_values", kernel_range(space, Index(view.span())),
      KOKKOS_LAMBDA(const Index i) { data[i] = value; });
}

}  // namespace shardtensor
