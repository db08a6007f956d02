// The cuDNN backend of ConvLibraryPlan (kernels/conv_library.hpp): built when a CUDA build
// finds cuDNN (SHARDTENSOR_HAVE_CUDNN); otherwise every plan is empty and Conv runs the
// portable kernels.
//
// Float convolutions time cuDNN's graph API (the header-only FrontEnd, where the build has it)
// beside its legacy calls: per shape and direction one graph, every engine the heuristics and
// the fallback list offer that the numerical notes allow, each built and timed once on the
// run's own buffers, and the legacy algorithms timed by cudnnFind; the faster of the two runs.
// Double, and float with SHARDTENSOR_CUDNN_API=legacy, run the legacy calls alone
// (cudnnConvolutionForward / BackwardData / BackwardFilter, which cuDNN 9 keeps beside its
// graph API). Both work on the layouts the kernels already use: fields
// (batch, channel, x, y, z) in C order are NCDHW, weights (out, in / groups, kx, ky, kz) are
// its NCDHW filters. The input is the box of the padded buffer that this rank's windows read,
// so cuDNN pads nothing itself. cuDNN's engines want fully packed tensors at aligned
// addresses (seen on an H100: none takes the data gradient of a strided box, and the fast
// ones refuse a misaligned start): where the box is all of the buffer, cuDNN reads and writes
// the buffer in place; otherwise through a packed copy of the box. For each shape the algorithms
// are chosen once, on a direction's first run, by timing them on the run's own buffers
// (cudnnFind...AlgorithmEx), keeping only deterministic ones: two runs of a step give the
// same bits. Float keeps FMA math and algorithms that sum the products themselves (no FFT or
// Winograd transforms) unless the layer allows TF32 (ConvOptions::tf32).

#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/kernels/timed_choice.hpp"

#include <type_traits>

#ifdef SHARDTENSOR_HAVE_CUDNN
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <cstdint>
#include <sstream>

#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#include "shardtensor/kernels/channels_last.hpp"

#include <cstdlib>
#include <unordered_map>
#endif
#endif

namespace shardtensor::kernels {

#ifdef SHARDTENSOR_HAVE_CUDNN

bool conv_library_available() {
  return true;
}

namespace {

void check(cudnnStatus_t status, const char* call) {
  SHARDTENSOR_REQUIRE(status == CUDNN_STATUS_SUCCESS, "cuDNN",
                      call << " failed: " << cudnnGetErrorString(status));
}

/// How many of cudnnFind's results to read: none where cuDNN supports no algorithm for the
/// shape (the portable kernel runs), all it returned otherwise; other failures are errors.
int timed_results(cudnnStatus_t status, int returned, const char* call) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return 0;
  check(status, call);
  return returned;
}

/// The process's handle, on the stream of `space`. Created at the first convolution, destroyed
/// when Kokkos finalizes (while the CUDA context is still there).
cudnnHandle_t handle_on(const ExecutionSpace& space) {
  static const cudnnHandle_t handle = [] {
    cudnnHandle_t created = nullptr;
    check(cudnnCreate(&created), "cudnnCreate");
    Kokkos::push_finalize_hook([created] { cudnnDestroy(created); });
    return created;
  }();
  check(cudnnSetStream(handle, space.cuda_stream()), "cudnnSetStream");
  return handle;
}

template <class T>
constexpr cudnnDataType_t data_type =
    std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;

/// An algorithm chosen for one direction: not yet (`chosen` false), none that qualified
/// (`found` false: the portable kernel runs), or one, its workspace and its math type.
template <class Algorithm>
struct Choice {
  bool chosen = false, found = false;
  Algorithm algorithm{};
  std::size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  float milliseconds = 0;  // cudnnFind's time of it
};

/// Whether an algorithm sums the products themselves, rather than transforming the operands
/// (FFT, Winograd), whose float rounding grows with the transform: float without TF32 keeps
/// to these, so its results stay within 1e-5 of the CPU's.
bool sums_products(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool sums_products(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool sums_products(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

/// The pick (least_workspace_near_fastest) of cuDNN's timed results that ran, are
/// deterministic and fit the workspace bound; for float without TF32 (`float_accuracy`), of
/// those with FMA math that sum the products themselves.
template <class Algorithm, class Perf>
Choice<Algorithm> fastest(const std::vector<Perf>& results, int returned, std::size_t limit,
                          bool float_accuracy) {
  Choice<Algorithm> choice;
  choice.chosen = true;
  std::vector<const Perf*> qualified;
  std::vector<TimedCandidate> timed;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = results[i];
    const bool tensor_cores =
        p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC ||
        p.memory > limit || (float_accuracy && (tensor_cores || !sums_products(p.algo))))
      continue;
    qualified.push_back(&p);
    timed.push_back({p.time, p.memory});
  }
  if (const int pick = least_workspace_near_fastest(timed); pick >= 0) {
    const Perf& p = *qualified[pick];
    choice.found = true;
    choice.algorithm = p.algo;
    choice.workspace = p.memory;
    choice.math = p.mathType;
    choice.milliseconds = p.time;
  }
  return choice;
}

/// The workspace bound of a plan made now: `share` of the memory the device has free and,
/// under a memory budget (memory.budget_mib), of the room left below it.
std::size_t workspace_bound(double share) {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) free = 0;
  std::uint64_t room = free;
  if (const std::uint64_t budget = memory_budget(); budget > 0) {
    const std::uint64_t used = memory_snapshot().total.current;
    room = std::min<std::uint64_t>(room, used < budget ? budget - used : 0);
  }
  return static_cast<std::size_t>(std::clamp(share, 0.0, 1.0) * double(room));
}

/// Values of T that hold `bytes` (the workspace is a View of T).
template <class T>
std::size_t values_for(std::size_t bytes) {
  return (bytes + sizeof(T) - 1) / sizeof(T);
}

/// Scratch for cudnnFind, freed after the choice.
using FindScratch = Kokkos::View<char*, DefaultMemorySpace>;

FindScratch find_scratch(std::size_t bytes) {
  MemoryCategoryScope memory(MemoryCategory::workspaces);
  return FindScratch(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cudnn_find")),
                     bytes);
}

/// A packed copy of the windows' box, for a call (see the top of the file).
template <class T>
using PackedBox = Kokkos::View<T*, DefaultMemorySpace>;

template <class T>
PackedBox<T> packed_box(Index values) {
  MemoryCategoryScope memory(MemoryCategory::workspaces);
  return PackedBox<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cudnn_box")),
                      values);
}

/// How a choice reads in conv_library_report: the algorithm's number in its direction's enum.
template <class Algorithm>
std::string describe(const Choice<Algorithm>& c) {
  if (!c.chosen) return "not run";
  if (!c.found) return "none (portable kernel)";
  std::ostringstream out;
  out << "algorithm " << int(c.algorithm) << (c.math == CUDNN_FMA_MATH ? ", FMA" : ", tensor ops")
      << ", " << c.workspace << " bytes";
  return out.str();
}

#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

/// Whether float convolutions may go through cuDNN's graph API (the FrontEnd): the default,
/// unless SHARDTENSOR_CUDNN_API=legacy asks for the legacy cudnnFind/cudnnConvolution* calls
/// alone. On an H200 the graph path passed the conv-family and model tests and ran the 128^3
/// conv's step in 53 ms against the legacy calls' 74 (scripts/device/bench.sh runs both).
bool graph_api() {
  static const bool graph = [] {
    const char* api = std::getenv("SHARDTENSOR_CUDNN_API");
    return !(api && std::string(api) == "legacy");
  }();
  return graph;
}

/// Whether the graph path hands cuDNN channels-last copies (NDHWC, the layout of its tensor-core
/// engines) made by one fused kernel each way (kernels/channels_last.hpp):
/// SHARDTENSOR_CUDNN_LAYOUT=channels_last. Which is faster is measured on a GPU.
bool channels_last_copies() {
  static const bool copies = [] {
    const char* layout = std::getenv("SHARDTENSOR_CUDNN_LAYOUT");
    return layout && std::string(layout) == "channels_last";
  }();
  return copies;
}

/// Strides of (N, C, spatial) extents stored channels-last: (N, spatial, C).
std::vector<std::int64_t> channels_last_strides(const std::vector<std::int64_t>& dims) {
  const std::int64_t c = dims[1], x = dims[2], y = dims[3], z = dims[4];
  return {c * x * y * z, 1, y * z * c, z * c, c};
}

/// One direction's graph, built, filtered and timed at its first run; `found` false where no
/// engine qualified (the portable kernel runs).
struct GraphChoice {
  bool chosen = false, found = false;
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t plan = -1;  // the winner's index among the graph's execution plans
  std::int64_t workspace = 0;
  std::string name;
  float milliseconds = 0;  // its fastest timed run
};

/// Milliseconds of the fastest of `runs` calls of `run` on `stream`, after one untimed call; a
/// negative value where a call failed.
template <class Run>
float fastest_run_ms(cudaStream_t stream, int runs, const Run& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best = -1;
  if (run()) {
    for (int i = 0; i < runs; ++i) {
      cudaEventRecord(start, stream);
      const bool ran = run();
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float ms = 0;
      if (!ran || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
        best = -1;
        break;
      }
      best = best < 0 ? ms : std::min(best, ms);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

/// Tensor uids of every graph: the two operands and the result.
enum : std::int64_t { operand_a = 1, operand_b = 2, result = 3 };

std::shared_ptr<fe::graph::Tensor_attributes> graph_tensor(
    fe::graph::Graph& g, const char* name, std::int64_t uid, const std::vector<std::int64_t>& dims,
    const std::vector<std::int64_t>& strides) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

std::string describe(const GraphChoice& c) {
  if (!c.chosen) return "not run";
  if (!c.found) return "none (portable kernel)";
  return "graph engine " + c.name + ", " + std::to_string(c.workspace) + " bytes";
}

/// Whether a direction runs its graph rather than the legacy algorithm: float directions time
/// both (on an H200 at 128^3 the legacy forward's implicit GEMM took 7.1 ms, the graph's fastest
/// engine 22.7 ms, while only the graph had a weight gradient within the workspace bound) and
/// run the faster (least_workspace_near_fastest: within 5 %, the smaller workspace); a
/// direction that has only one runs it.
template <class Algorithm>
bool graph_runs(const GraphChoice& graph, const Choice<Algorithm>& legacy) {
  if (!graph.found || !legacy.found) return graph.found;
  return least_workspace_near_fastest({{graph.milliseconds, std::size_t(graph.workspace)},
                                       {legacy.milliseconds, legacy.workspace}}) == 0;
}

/// A direction's choice as conv_library_report shows it: both candidates and which runs.
template <class Algorithm>
std::string describe(const GraphChoice& graph, const Choice<Algorithm>& legacy) {
  if (!graph.chosen) return "not run";
  std::ostringstream out;
  out << describe(graph);
  if (graph.found) out << " (" << graph.milliseconds << " ms)";
  out << " or " << describe(legacy);
  if (legacy.found) out << " (" << legacy.milliseconds << " ms)";
  out << ": runs "
      << (graph_runs(graph, legacy) ? "the graph"
          : legacy.found            ? "the algorithm"
                                    : "neither");
  return out.str();
}

/// C-order strides of `dims`.
std::vector<std::int64_t> packed_strides(const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> strides(dims.size(), 1);
  for (std::size_t a = dims.size() - 1; a-- > 0;) strides[a] = strides[a + 1] * dims[a + 1];
  return strides;
}
#endif

}  // namespace

template <class T>
struct ConvLibraryPlan<T>::Plan {
  cudnnTensorDescriptor_t input = nullptr, output = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t weight = nullptr;
  cudnnConvolutionDescriptor_t convolution = nullptr;
  Box window;                 // the box of the padded buffer that the windows read
  Index window_values = 0;    // its values, all batches and channels
  bool whole_buffer = false;  // the box is all of the padded buffer
  Index weight_values = 0;
  std::string shape;  // for conv_library_report
  std::size_t workspace_limit = 0;
  bool float_accuracy = false;  // float without TF32: FMA math, no transform algorithms
  std::mutex choosing;          // the choices are made on first use, by whichever layer runs first
  Choice<cudnnConvolutionFwdAlgo_t> forward;
  Choice<cudnnConvolutionBwdDataAlgo_t> data;
  Choice<cudnnConvolutionBwdFilterAlgo_t> weight_gradient;
  // The graph API's view of the same convolution: tensor extents (N, C, spatial) and steps.
  std::vector<std::int64_t> input_dims, output_dims, weight_dims, steps, dilations;
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  GraphChoice graph_forward, graph_data, graph_weight;
  // Float convolutions time the graphs (unless SHARDTENSOR_CUDNN_API=legacy); double keeps the
  // legacy calls (on an H200 the graph engines' double results failed the finite-difference
  // and adjoint tests; double is for checks, not speed).
  bool graph = false;
  bool channels_last = false;  // the graphs read and write channels-last copies

  enum class Direction { forward, data, weight };

  /// Builds one direction's graph, keeps the engines whose numerical notes this plan allows
  /// (never down-converting inputs or reduced-precision reductions; never nondeterministic;
  /// for float without TF32 no tensor cores, FFT or Winograd) and whose workspace fits the
  /// bound, builds every such plan and times them on these operands (`a`, `b` in, `out`
  /// written), keeping least_workspace_near_fastest's pick. Runs once per direction.
  void choose_graph(GraphChoice& choice, Direction direction, cudnnHandle_t handle, const void* a,
                    const void* b, void* out) {
    std::lock_guard<std::mutex> lock(choosing);
    if (choice.chosen) return;
    choice.chosen = true;
    const auto type = std::is_same_v<T, float> ? fe::DataType_t::FLOAT : fe::DataType_t::DOUBLE;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(type).set_intermediate_data_type(type).set_compute_data_type(type);
    const std::vector<std::int64_t> no_padding(3, 0);
    const auto strides = [&](const std::vector<std::int64_t>& dims) {
      return channels_last ? channels_last_strides(dims) : packed_strides(dims);
    };
    const auto x_strides = strides(input_dims), y_strides = strides(output_dims),
               w_strides = strides(weight_dims);
    std::shared_ptr<fe::graph::Tensor_attributes> out_tensor;
    if (direction == Direction::forward) {
      auto x = graph_tensor(*g, "x", operand_a, input_dims, x_strides);
      auto w = graph_tensor(*g, "w", operand_b, weight_dims, w_strides);
      out_tensor = g->conv_fprop(x, w,
                                 fe::graph::Conv_fprop_attributes()
                                     .set_padding(no_padding)
                                     .set_stride(steps)
                                     .set_dilation(dilations));
      out_tensor->set_dim(output_dims).set_stride(y_strides);
    } else if (direction == Direction::data) {
      auto dy = graph_tensor(*g, "dy", operand_a, output_dims, y_strides);
      auto w = graph_tensor(*g, "w", operand_b, weight_dims, w_strides);
      out_tensor = g->conv_dgrad(dy, w,
                                 fe::graph::Conv_dgrad_attributes()
                                     .set_padding(no_padding)
                                     .set_stride(steps)
                                     .set_dilation(dilations));
      out_tensor->set_dim(input_dims).set_stride(x_strides);
    } else {
      auto dy = graph_tensor(*g, "dy", operand_a, output_dims, y_strides);
      auto x = graph_tensor(*g, "x", operand_b, input_dims, x_strides);
      out_tensor = g->conv_wgrad(dy, x,
                                 fe::graph::Conv_wgrad_attributes()
                                     .set_padding(no_padding)
                                     .set_stride(steps)
                                     .set_dilation(dilations));
      out_tensor->set_dim(weight_dims).set_stride(w_strides);
    }
    out_tensor->set_output(true).set_uid(result).set_data_type(type);
    std::vector<fe::NumericalNote_t> refused{fe::NumericalNote_t::DOWN_CONVERT_INPUTS,
                                             fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION,
                                             fe::NumericalNote_t::NONDETERMINISTIC};
    if (float_accuracy)
      for (auto note : {fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::FFT,
                        fe::NumericalNote_t::WINOGRAD})
        refused.push_back(note);
    if (g->validate().is_bad() || g->build_operation_graph(handle).is_bad() ||
        g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}).is_bad())
      return;
    const auto limit = static_cast<std::int64_t>(workspace_limit);
    g->deselect_numeric_notes(refused);
    g->deselect_workspace_greater_than(limit);
    if (g->check_support(handle).is_bad()) return;
    // Every candidate that builds (the others were deselected or are unsupported here), then
    // each timed on these operands. Built one by one: the FrontEnd's own autotune sizes its
    // scratch over every candidate and reads the unbuilt ones (seen crashing on an H200).
    std::vector<std::pair<std::int64_t, std::int64_t>> built;  // (plan, workspace bytes)
    std::int64_t largest = 0;
    for (std::int64_t i = 0; i < g->get_execution_plan_count(); ++i) {
      std::int64_t bytes = 0;
      if (g->build_plan_at_index(i).is_bad() ||
          g->get_workspace_size_plan_at_index(i, bytes).is_bad() || bytes > limit)
        continue;
      built.emplace_back(i, bytes);
      largest = std::max(largest, bytes);
    }
    if (built.empty()) return;
    std::unordered_map<std::int64_t, void*> pointers{
        {operand_a, const_cast<void*>(a)}, {operand_b, const_cast<void*>(b)}, {result, out}};
    const FindScratch scratch = find_scratch(std::size_t(largest));
    cudaStream_t stream = nullptr;
    check(cudnnGetStream(handle, &stream), "cudnnGetStream");
    std::vector<std::int64_t> ran;
    std::vector<TimedCandidate> timed;
    for (const auto& candidate : built) {
      const std::int64_t plan = candidate.first;
      const float ms = fastest_run_ms(stream, 3, [&] {
        return g->execute_plan_at_index(handle, pointers, scratch.data(), plan).is_good();
      });
      if (ms < 0) continue;
      ran.push_back(plan);
      timed.push_back({ms, std::size_t(candidate.second)});
    }
    const int pick = least_workspace_near_fastest(timed);
    if (pick < 0) return;
    choice.plan = ran[pick];
    choice.workspace = std::int64_t(timed[pick].workspace);
    choice.milliseconds = timed[pick].milliseconds;
    if (g->get_plan_name_at_index(choice.plan, choice.name).is_bad()) choice.name = "(unnamed)";
    choice.graph = std::move(g);
    choice.found = true;
  }

  /// Runs a chosen graph on these operands with `workspace` (its workspace bytes).
  void run_graph(const GraphChoice& choice, cudnnHandle_t handle, const void* a, const void* b,
                 void* out, void* workspace) const {
    std::unordered_map<std::int64_t, void*> pointers{
        {operand_a, const_cast<void*>(a)}, {operand_b, const_cast<void*>(b)}, {result, out}};
    auto status = choice.graph->execute_plan_at_index(handle, pointers, workspace, choice.plan);
    SHARDTENSOR_REQUIRE(status.is_good(), "cuDNN graph",
                        choice.name << ": " << status.get_message());
  }
#endif

  ~Plan() {
    if (input) cudnnDestroyTensorDescriptor(input);
    if (output) cudnnDestroyTensorDescriptor(output);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (weight) cudnnDestroyFilterDescriptor(weight);
    if (convolution) cudnnDestroyConvolutionDescriptor(convolution);
  }

  /// Makes `choice` on its first call, among one direction's `algorithms` (its
  /// ..._ALGO_COUNT): `find(requested, &returned, results, scratch, scratch_bytes)` times them
  /// (cudnnFind...AlgorithmEx), with scratch for the largest workspace that one of them within
  /// the bound asks for (`workspace_size(algorithm, &bytes)`), not the bound itself; for float
  /// without TF32, only those that sum the products (the others cannot be chosen).
  template <class Perf, class Algorithm, class WorkspaceSize, class Find>
  void choose(Choice<Algorithm>& choice, int algorithms, WorkspaceSize workspace_size, Find find,
              const char* call) {
    std::lock_guard<std::mutex> lock(choosing);
    if (choice.chosen) return;
    std::size_t needed = 0;
    for (int a = 0; a < algorithms; ++a) {
      std::size_t bytes = 0;
      if ((!float_accuracy || sums_products(static_cast<Algorithm>(a))) &&
          workspace_size(static_cast<Algorithm>(a), &bytes) == CUDNN_STATUS_SUCCESS &&
          bytes <= workspace_limit)
        needed = std::max(needed, bytes);
    }
    std::vector<Perf> results(algorithms);
    const FindScratch scratch = find_scratch(needed);
    int returned = 0;
    const cudnnStatus_t status =
        find(algorithms, &returned, results.data(), scratch.data(), needed);
    choice =
        fastest<Algorithm>(results, timed_results(status, returned, call), needed, float_accuracy);
  }

  template <class Algorithm>
  void use(const Choice<Algorithm>& choice) const {
    check(cudnnSetConvolutionMathType(convolution, choice.math), "cudnnSetConvolutionMathType");
  }

  /// Whether cuDNN may work on the padded buffer at `data` in place: the box is all of it and
  /// it starts aligned (Kokkos' allocations do).
  bool in_place(const T* data) const {
    return whole_buffer && reinterpret_cast<std::uintptr_t>(data) % 128 == 0;
  }

  /// The input as cuDNN reads it: the padded buffer, or a packed copy of the box in `copy`.
  const T* input_of(const ExecutionSpace& space, const FieldView<T>& xp, PackedBox<T>& copy) const {
    if (in_place(xp.data())) return xp.data();
    copy = packed_box<T>(window_values);
    pack_box(space, xp, window, copy);
    return copy.data();
  }
};

namespace {

/// The plans made so far, per shape (every field of the key below).
template <class T>
struct PlanCache {
  std::mutex mutex;
  std::map<std::vector<long long>, std::shared_ptr<typename ConvLibraryPlan<T>::Plan>> plans;
};

template <class T>
PlanCache<T>& plan_cache() {
  static PlanCache<T> cache;
  return cache;
}

}  // namespace

namespace {
template <class T>
void report_plans(std::vector<std::string>& lines) {
  PlanCache<T>& cache = plan_cache<T>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  for (const auto& [key, plan] : cache.plans) {
    if (!plan) continue;
    std::lock_guard<std::mutex> choosing(plan->choosing);
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
    if (plan->channels_last) {
      lines.push_back(plan->shape + ": forward " + describe(plan->graph_forward) +
                      "; data gradient " + describe(plan->graph_data) + "; weight gradient " +
                      describe(plan->graph_weight));
      continue;
    }
    if (plan->graph) {
      lines.push_back(plan->shape + ": forward " + describe(plan->graph_forward, plan->forward) +
                      "; data gradient " + describe(plan->graph_data, plan->data) +
                      "; weight gradient " + describe(plan->graph_weight, plan->weight_gradient));
      continue;
    }
#endif
    lines.push_back(plan->shape + ": forward " + describe(plan->forward) + "; data gradient " +
                    describe(plan->data) + "; weight gradient " + describe(plan->weight_gradient));
  }
}
}  // namespace

std::vector<std::string> conv_library_report() {
  std::vector<std::string> lines;
  report_plans<float>(lines);
  report_plans<double>(lines);
  return lines;
}

template <class T>
ConvLibraryPlan<T>::ConvLibraryPlan(const ConvShape& g, const Index padded[3],
                                    double workspace_share, bool tf32) {
  // The box of the padded buffer that the windows read, and the tensors' extents: cuDNN takes
  // int extents and strides.
  Index window[3];
  long long largest = g.batch * g.in_channels * padded[0] * padded[1] * padded[2];
  for (int a = 0; a < 3; ++a) {
    if (g.out[a] <= 0) return;
    window[a] = (g.out[a] - 1) * g.s[a] + (g.k[a] - 1) * g.d[a] + 1;
    SHARDTENSOR_REQUIRE(g.base[a] >= 0 && g.base[a] + window[a] <= padded[a], "ConvLibraryPlan",
                        "the windows along axis " << a << " (" << g.base[a] << " + " << window[a]
                                                  << " cells) exceed the padded buffer ("
                                                  << padded[a] << ")");
  }
  if (g.batch <= 0 || largest > INT_MAX ||
      g.batch * g.out_channels * g.out[0] * g.out[1] * g.out[2] > INT_MAX)
    return;
  const std::vector<long long> key{g.batch,
                                   g.in_channels,
                                   g.out_channels,
                                   g.in_per_group,
                                   g.out_per_group,
                                   g.k[0],
                                   g.k[1],
                                   g.k[2],
                                   g.s[0],
                                   g.s[1],
                                   g.s[2],
                                   g.d[0],
                                   g.d[1],
                                   g.d[2],
                                   g.out[0],
                                   g.out[1],
                                   g.out[2],
                                   g.base[0],
                                   g.base[1],
                                   g.base[2],
                                   padded[0],
                                   padded[1],
                                   padded[2],
                                   tf32,
                                   std::llround(workspace_share * 1e6)};
  PlanCache<T>& cache = plan_cache<T>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::shared_ptr<Plan>& cached = cache.plans[key];
  if (!cached) {
    auto plan = std::make_shared<Plan>();
    const cudnnDataType_t type = data_type<T>;
    const int in_dims[5] = {int(g.batch), int(g.in_channels), int(window[0]), int(window[1]),
                            int(window[2])};
    const int in_strides[5] = {int(g.in_channels * window[0] * window[1] * window[2]),
                               int(window[0] * window[1] * window[2]), int(window[1] * window[2]),
                               int(window[2]), 1};
    check(cudnnCreateTensorDescriptor(&plan->input), "cudnnCreateTensorDescriptor");
    check(cudnnSetTensorNdDescriptor(plan->input, type, 5, in_dims, in_strides),
          "cudnnSetTensorNdDescriptor (input)");
    const int out_dims[5] = {int(g.batch), int(g.out_channels), int(g.out[0]), int(g.out[1]),
                             int(g.out[2])};
    const int out_strides[5] = {int(g.out_channels * g.out[0] * g.out[1] * g.out[2]),
                                int(g.out[0] * g.out[1] * g.out[2]), int(g.out[1] * g.out[2]),
                                int(g.out[2]), 1};
    check(cudnnCreateTensorDescriptor(&plan->output), "cudnnCreateTensorDescriptor");
    check(cudnnSetTensorNdDescriptor(plan->output, type, 5, out_dims, out_strides),
          "cudnnSetTensorNdDescriptor (output)");
    const int bias_dims[5] = {1, int(g.out_channels), 1, 1, 1};
    const int bias_strides[5] = {int(g.out_channels), 1, 1, 1, 1};
    check(cudnnCreateTensorDescriptor(&plan->bias), "cudnnCreateTensorDescriptor");
    check(cudnnSetTensorNdDescriptor(plan->bias, type, 5, bias_dims, bias_strides),
          "cudnnSetTensorNdDescriptor (bias)");
    const int weight_dims[5] = {int(g.out_channels), int(g.in_per_group), int(g.k[0]), int(g.k[1]),
                                int(g.k[2])};
    check(cudnnCreateFilterDescriptor(&plan->weight), "cudnnCreateFilterDescriptor");
    check(cudnnSetFilterNdDescriptor(plan->weight, type, CUDNN_TENSOR_NCHW, 5, weight_dims),
          "cudnnSetFilterNdDescriptor");
    const int no_padding[3] = {0, 0, 0};
    const int stride[3] = {int(g.s[0]), int(g.s[1]), int(g.s[2])};
    const int dilation[3] = {int(g.d[0]), int(g.d[1]), int(g.d[2])};
    check(cudnnCreateConvolutionDescriptor(&plan->convolution), "cudnnCreateConvolutionDescriptor");
    check(cudnnSetConvolutionNdDescriptor(plan->convolution, 3, no_padding, stride, dilation,
                                          CUDNN_CROSS_CORRELATION, type),
          "cudnnSetConvolutionNdDescriptor");
    check(cudnnSetConvolutionGroupCount(plan->convolution, int(g.in_channels / g.in_per_group)),
          "cudnnSetConvolutionGroupCount");
    plan->float_accuracy = std::is_same_v<T, float> && !tf32;
    check(cudnnSetConvolutionMathType(plan->convolution,
                                      plan->float_accuracy ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH),
          "cudnnSetConvolutionMathType");
    plan->window.lower = {g.base[0], g.base[1], g.base[2]};
    plan->window.extent = {window[0], window[1], window[2]};
    plan->window_values = g.batch * g.in_channels * plan->window.size();
    plan->whole_buffer = true;
    for (int a = 0; a < 3; ++a)
      plan->whole_buffer = plan->whole_buffer && g.base[a] == 0 && window[a] == padded[a];
    std::ostringstream shape;
    shape << (std::is_same_v<T, float> ? "float" : "double") << " " << g.batch << "x"
          << g.in_channels << "x" << window[0] << "x" << window[1] << "x" << window[2] << " -> "
          << g.out_channels << ", kernel " << g.k[0] << "x" << g.k[1] << "x" << g.k[2]
          << ", stride " << g.s[0] << "x" << g.s[1] << "x" << g.s[2] << ", dilation " << g.d[0]
          << "x" << g.d[1] << "x" << g.d[2] << ", groups " << g.in_channels / g.in_per_group
          << (plan->whole_buffer ? "" : ", through a packed copy")
          << (plan->float_accuracy       ? ""
              : std::is_same_v<T, float> ? ", TF32"
                                         : "");
    plan->shape = shape.str();
    plan->weight_values = g.out_channels * g.in_per_group * g.k[0] * g.k[1] * g.k[2];
    plan->workspace_limit = workspace_bound(workspace_share);
    plan->input_dims = {g.batch, g.in_channels, window[0], window[1], window[2]};
    plan->output_dims = {g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]};
    plan->weight_dims = {g.out_channels, g.in_per_group, g.k[0], g.k[1], g.k[2]};
    plan->steps = {g.s[0], g.s[1], g.s[2]};
    plan->dilations = {g.d[0], g.d[1], g.d[2]};
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
    plan->graph = graph_api() && std::is_same_v<T, float>;
    plan->channels_last = plan->graph && channels_last_copies();
    if (plan->channels_last) plan->shape += ", channels-last copies";
#endif
    cached = std::move(plan);
  }
  plan_ = cached;
}

#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
namespace {

/// y += bias per output channel (the graph convolves only).
template <class T>
void add_bias(const ExecutionSpace& space, const ReplicatedView<T>& bias, const FieldView<T>& y) {
  using Policy = Kokkos::MDRangePolicy<ExecutionSpace, RightRank<5>, Kokkos::IndexType<Index>>;
  const Policy cells(space, {0, 0, 0, 0, 0},
                     {Index(y.extent(0)), Index(y.extent(1)), Index(y.extent(2)),
                      Index(y.extent(3)), Index(y.extent(4))});
  Kokkos::parallel_for(
      "cudnn_graph_bias", cells,
      KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) { y(n, c, i, j, k) += bias(c); });
}

/// gw += the values at `partial` (the graph's weight gradient overwrites its output).
template <class T>
void accumulate(const ExecutionSpace& space, const T* partial, const ReplicatedView<T>& gw) {
  Kokkos::parallel_for(
      "cudnn_graph_weight_gradient", Kokkos::RangePolicy<ExecutionSpace>(space, 0, gw.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { gw(i) += partial[i]; });
}

/// A weight vector (K, C per group, kernel) as a 5-D field, for its channels-last copies.
template <class T>
using WeightField = Kokkos::View<T*****, Kokkos::LayoutRight, DefaultMemorySpace,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T>
WeightField<T> weight_field(const T* w, const std::vector<std::int64_t>& dims) {
  return WeightField<T>(const_cast<T*>(w), dims[0], dims[1], dims[2], dims[3], dims[4]);
}

/// All cells of (N, C, spatial) extents.
Box whole_box(const std::vector<std::int64_t>& dims) {
  Box box;
  box.extent = {dims[2], dims[3], dims[4]};
  return box;
}

/// A channels-last copy of `box` of `field` (all batches and channels, `values` in all).
template <class T, class Field>
PackedBox<T> channels_last_copy(const ExecutionSpace& space, const Field& field, const Box& box,
                                Index values) {
  PackedBox<T> copy = packed_box<T>(values);
  pack_channels_last(space, field, box, copy);
  return copy;
}

}  // namespace
#endif

template <class T>
bool ConvLibraryPlan<T>::forward(const ExecutionSpace& space, const FieldView<T>& xp,
                                 const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
                                 const FieldView<T>& y, ConvWorkspace<T>& workspace) const {
  if (!plan_) return false;
  Plan& p = *plan_;
  const cudnnHandle_t handle = handle_on(space);
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  if (p.channels_last) {
    const PackedBox<T> x = channels_last_copy<T>(space, xp, p.window, p.window_values);
    const PackedBox<T> wc = channels_last_copy<T>(space, weight_field(w.data(), p.weight_dims),
                                                  whole_box(p.weight_dims), p.weight_values);
    const PackedBox<T> yc = packed_box<T>(Index(y.span()));
    p.choose_graph(p.graph_forward, Plan::Direction::forward, handle, x.data(), wc.data(),
                   yc.data());
    if (!p.graph_forward.found) return false;
    T* scratch = workspace.reserve(values_for<T>(std::size_t(p.graph_forward.workspace)));
    p.run_graph(p.graph_forward, handle, x.data(), wc.data(), yc.data(), scratch);
    unpack_channels_last(space, yc, y, whole_box(p.output_dims));
    if (bias.extent(0) > 0) add_bias(space, bias, y);
    return true;
  }
#endif
  PackedBox<T> copy;
  const T* input = p.input_of(space, xp, copy);
  p.template choose<cudnnConvolutionFwdAlgoPerf_t>(
      p.forward, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
      [&](cudnnConvolutionFwdAlgo_t algorithm, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, p.input, p.weight, p.convolution,
                                                       p.output, algorithm, bytes);
      },
      [&](int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* results, void* scratch,
          std::size_t scratch_bytes) {
        return cudnnFindConvolutionForwardAlgorithmEx(handle, p.input, input, p.weight, w.data(),
                                                      p.convolution, p.output, y.data(), requested,
                                                      returned, results, scratch, scratch_bytes);
      },
      "cudnnFindConvolutionForwardAlgorithmEx");
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  if (p.graph) {
    p.choose_graph(p.graph_forward, Plan::Direction::forward, handle, input, w.data(), y.data());
    if (graph_runs(p.graph_forward, p.forward)) {
      T* scratch = workspace.reserve(values_for<T>(std::size_t(p.graph_forward.workspace)));
      p.run_graph(p.graph_forward, handle, input, w.data(), y.data(), scratch);
      if (bias.extent(0) > 0) add_bias(space, bias, y);
      return true;
    }
  }
#endif
  if (!p.forward.found) return false;
  const T one = 1, zero = 0;
  T* scratch = workspace.reserve(values_for<T>(p.forward.workspace));
  p.use(p.forward);
  check(cudnnConvolutionForward(handle, &one, p.input, input, p.weight, w.data(), p.convolution,
                                p.forward.algorithm, scratch, p.forward.workspace, &zero, p.output,
                                y.data()),
        "cudnnConvolutionForward");
  if (bias.extent(0) > 0)
    check(cudnnAddTensor(handle, &one, p.bias, bias.data(), &one, p.output, y.data()),
          "cudnnAddTensor (bias)");
  return true;
}

template <class T>
bool ConvLibraryPlan<T>::backward_data(const ExecutionSpace& space, const FieldView<T>& gy,
                                       const ReplicatedView<T>& w, const FieldView<T>& gxp,
                                       ConvWorkspace<T>& workspace) const {
  if (!plan_) return false;
  Plan& p = *plan_;
  const cudnnHandle_t handle = handle_on(space);
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  if (p.channels_last) {
    const PackedBox<T> dy =
        channels_last_copy<T>(space, gy, whole_box(p.output_dims), Index(gy.span()));
    const PackedBox<T> wc = channels_last_copy<T>(space, weight_field(w.data(), p.weight_dims),
                                                  whole_box(p.weight_dims), p.weight_values);
    const PackedBox<T> dx = packed_box<T>(p.window_values);
    p.choose_graph(p.graph_data, Plan::Direction::data, handle, dy.data(), wc.data(), dx.data());
    if (!p.graph_data.found) return false;
    T* scratch = workspace.reserve(values_for<T>(std::size_t(p.graph_data.workspace)));
    p.run_graph(p.graph_data, handle, dy.data(), wc.data(), dx.data(), scratch);
    unpack_channels_last(space, dx, gxp, p.window);
    return true;
  }
#endif
  PackedBox<T> copy;  // where cuDNN cannot write the padded gradient in place
  if (!p.in_place(gxp.data())) copy = packed_box<T>(p.window_values);
  T* input_gradient = copy.data() ? copy.data() : gxp.data();
  p.template choose<cudnnConvolutionBwdDataAlgoPerf_t>(
      p.data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
      [&](cudnnConvolutionBwdDataAlgo_t algorithm, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            handle, p.weight, p.output, p.convolution, p.input, algorithm, bytes);
      },
      [&](int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results, void* scratch,
          std::size_t scratch_bytes) {
        return cudnnFindConvolutionBackwardDataAlgorithmEx(
            handle, p.weight, w.data(), p.output, gy.data(), p.convolution, p.input, input_gradient,
            requested, returned, results, scratch, scratch_bytes);
      },
      "cudnnFindConvolutionBackwardDataAlgorithmEx");
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  if (p.graph) {
    p.choose_graph(p.graph_data, Plan::Direction::data, handle, gy.data(), w.data(),
                   input_gradient);
    if (graph_runs(p.graph_data, p.data)) {
      T* scratch = workspace.reserve(values_for<T>(std::size_t(p.graph_data.workspace)));
      p.run_graph(p.graph_data, handle, gy.data(), w.data(), input_gradient, scratch);
      if (copy.data()) unpack_box(space, copy, gxp, p.window);
      return true;
    }
  }
#endif
  if (!p.data.found) return false;
  const T one = 1, zero = 0;
  T* scratch = workspace.reserve(values_for<T>(p.data.workspace));
  p.use(p.data);
  check(cudnnConvolutionBackwardData(handle, &one, p.weight, w.data(), p.output, gy.data(),
                                     p.convolution, p.data.algorithm, scratch, p.data.workspace,
                                     &zero, p.input, input_gradient),
        "cudnnConvolutionBackwardData");
  if (copy.data()) unpack_box(space, copy, gxp, p.window);
  return true;
}

template <class T>
bool ConvLibraryPlan<T>::backward_weight(const ExecutionSpace& space, const FieldView<T>& gy,
                                         const FieldView<T>& xp, const ReplicatedView<T>& gw,
                                         ConvWorkspace<T>& workspace) const {
  if (!plan_) return false;
  Plan& p = *plan_;
  const cudnnHandle_t handle = handle_on(space);
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  if (p.channels_last) {
    const PackedBox<T> dy =
        channels_last_copy<T>(space, gy, whole_box(p.output_dims), Index(gy.span()));
    const PackedBox<T> x = channels_last_copy<T>(space, xp, p.window, p.window_values);
    const PackedBox<T> dw = packed_box<T>(p.weight_values);  // timing writes here too
    p.choose_graph(p.graph_weight, Plan::Direction::weight, handle, dy.data(), x.data(), dw.data());
    if (!p.graph_weight.found) return false;
    T* scratch = workspace.reserve(values_for<T>(std::size_t(p.graph_weight.workspace)));
    p.run_graph(p.graph_weight, handle, dy.data(), x.data(), dw.data(), scratch);
    unpack_channels_last(space, dw, weight_field(gw.data(), p.weight_dims),
                         whole_box(p.weight_dims), UnpackMode::add);
    return true;
  }
#endif
  PackedBox<T> copy;
  const T* input = p.input_of(space, xp, copy);
  p.template choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
      p.weight_gradient, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
      [&](cudnnConvolutionBwdFilterAlgo_t algorithm, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            handle, p.input, p.output, p.convolution, p.weight, algorithm, bytes);
      },
      [&](int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results, void* scratch,
          std::size_t scratch_bytes) {
        // Timing writes the output: into a scratch weight, since gw accumulates.
        const ReplicatedView<T> timed(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cudnn_find_weight")),
            p.weight_values);
        return cudnnFindConvolutionBackwardFilterAlgorithmEx(
            handle, p.input, input, p.output, gy.data(), p.convolution, p.weight, timed.data(),
            requested, returned, results, scratch, scratch_bytes);
      },
      "cudnnFindConvolutionBackwardFilterAlgorithmEx");
#ifdef SHARDTENSOR_HAVE_CUDNN_FRONTEND
  if (p.graph) {
    if (!p.graph_weight.chosen) {  // timing writes the output: into a scratch weight
      const ReplicatedView<T> timed(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cudnn_find_weight")),
          p.weight_values);
      p.choose_graph(p.graph_weight, Plan::Direction::weight, handle, gy.data(), input,
                     timed.data());
    }
    if (graph_runs(p.graph_weight, p.weight_gradient)) {
      // The partial weight gradient after the workspace, at an aligned address: the engines
      // refuse a misaligned operand (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, seen on an H200).
      const std::size_t aligned = 256 / sizeof(T);
      const std::size_t workspace_values =
          (values_for<T>(std::size_t(p.graph_weight.workspace)) + aligned - 1) / aligned * aligned;
      T* scratch = workspace.reserve(workspace_values + std::size_t(p.weight_values));
      T* partial = scratch + workspace_values;
      p.run_graph(p.graph_weight, handle, gy.data(), input, partial, scratch);
      accumulate(space, partial, gw);
      return true;
    }
  }
#endif
  if (!p.weight_gradient.found) return false;
  const T one = 1;
  T* scratch = workspace.reserve(values_for<T>(p.weight_gradient.workspace));
  p.use(p.weight_gradient);
  check(cudnnConvolutionBackwardFilter(handle, &one, p.input, input, p.output, gy.data(),
                                       p.convolution, p.weight_gradient.algorithm, scratch,
                                       p.weight_gradient.workspace, &one, p.weight, gw.data()),
        "cudnnConvolutionBackwardFilter");
  return true;
}

#else  // no cuDNN: every plan is empty

bool conv_library_available() {
  return false;
}

std::vector<std::string> conv_library_report() {
  return {};
}

template <class T>
struct ConvLibraryPlan<T>::Plan {};

template <class T>
ConvLibraryPlan<T>::ConvLibraryPlan(const ConvShape&, const Index[3], double, bool) {}

template <class T>
bool ConvLibraryPlan<T>::forward(const ExecutionSpace&, const FieldView<T>&,
                                 const ReplicatedView<T>&, const ReplicatedView<T>&,
                                 const FieldView<T>&, ConvWorkspace<T>&) const {
  return false;
}

template <class T>
bool ConvLibraryPlan<T>::backward_data(const ExecutionSpace&, const FieldView<T>&,
                                       const ReplicatedView<T>&, const FieldView<T>&,
                                       ConvWorkspace<T>&) const {
  return false;
}

template <class T>
bool ConvLibraryPlan<T>::backward_weight(const ExecutionSpace&, const FieldView<T>&,
                                         const FieldView<T>&, const ReplicatedView<T>&,
                                         ConvWorkspace<T>&) const {
  return false;
}

#endif

template class ConvLibraryPlan<float>;
template class ConvLibraryPlan<double>;

}  // namespace shardtensor::kernels
