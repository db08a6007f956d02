#pragma once
// Grad mode: whether ops record the graph. Inference (validation, `shardtensor infer`, a
// session's infer call) runs under NoGradGuard: no op keeps its inputs or saves anything for
// backward, so an activation is freed as soon as nothing reads it any more, as in PyTorch's
// torch.no_grad().

namespace shardtensor {

namespace impl {
/// Per thread, like PyTorch's: a forward runs on the thread that called it, whatever the
/// backend's threads do inside its kernels.
inline bool& grad_mode_flag() {
  thread_local bool enabled = true;
  return enabled;
}
/// True while a block runs again inside backward (layers/recompute.hpp): what its first forward
/// already did once for the step (BatchNorm's running statistics) is not done twice.
inline bool& recomputing_flag() {
  thread_local bool recomputing = false;
  return recomputing;
}
}  // namespace impl

/// True unless a NoGradGuard is alive on this thread.
inline bool grad_enabled() {
  return impl::grad_mode_flag();
}

/// While alive, op results do not require gradients, whatever their inputs (parameters
/// included) require; the previous mode comes back when it goes (guards nest).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(impl::grad_mode_flag()) { impl::grad_mode_flag() = false; }
  ~NoGradGuard() { impl::grad_mode_flag() = previous_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace shardtensor
