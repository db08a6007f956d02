// The cuDNN backend of ConvLibraryPlan (kernels/conv_library.hpp): built when a CUDA build
// finds cuDNN (SHARDTENSOR_HAVE_CUDNN); otherwise every plan is empty and Conv runs the
// portable kernels.
//
// cuDNN's convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter, which
// cuDNN 9 keeps beside its graph API) on the layouts the kernels already use: fields
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

#include <type_traits>

#ifdef SHARDTENSOR_HAVE_CUDNN
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <cstdint>
#include <sstream>

#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/error.hpp"
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

/// The fastest of cuDNN's timed results (sorted fastest first) that ran, is deterministic and
/// fits the workspace bound; for float without TF32 (`float_accuracy`), one with FMA math
/// that sums the products itself.
template <class Algorithm, class Perf>
Choice<Algorithm> fastest(const std::vector<Perf>& results, int returned, std::size_t limit,
                          bool float_accuracy) {
  Choice<Algorithm> choice;
  choice.chosen = true;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = results[i];
    const bool tensor_cores =
        p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC ||
        p.memory > limit || (float_accuracy && (tensor_cores || !sums_products(p.algo))))
      continue;
    choice.found = true;
    choice.algorithm = p.algo;
    choice.workspace = p.memory;
    choice.math = p.mathType;
    break;
  }
  return choice;
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
  /// the bound asks for (`workspace_size(algorithm, &bytes)`), not the bound itself.
  template <class Perf, class Algorithm, class WorkspaceSize, class Find>
  void choose(Choice<Algorithm>& choice, int algorithms, WorkspaceSize workspace_size, Find find,
              const char* call) {
    std::lock_guard<std::mutex> lock(choosing);
    if (choice.chosen) return;
    std::size_t needed = 0;
    for (int a = 0; a < algorithms; ++a) {
      std::size_t bytes = 0;
      if (workspace_size(static_cast<Algorithm>(a), &bytes) == CUDNN_STATUS_SUCCESS &&
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
                                    std::size_t workspace_bytes, bool tf32) {
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
                                   static_cast<long long>(workspace_bytes)};
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
    plan->workspace_limit = workspace_bytes;
    cached = std::move(plan);
  }
  plan_ = cached;
}

template <class T>
bool ConvLibraryPlan<T>::forward(const ExecutionSpace& space, const FieldView<T>& xp,
                                 const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
                                 const FieldView<T>& y, ConvWorkspace<T>& workspace) const {
  if (!plan_) return false;
  Plan& p = *plan_;
  const cudnnHandle_t handle = handle_on(space);
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
ConvLibraryPlan<T>::ConvLibraryPlan(const ConvShape&, const Index[3], std::size_t, bool) {}

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
