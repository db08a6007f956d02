#pragma once
// Gradient clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_).

#include "shardtensor/optim/optimizer.hpp"

namespace shardtensor {

/// Returns the L2 norm of all parameter gradients together (accumulated in double), and if
/// c = max_norm / (norm + 1e-6) is below 1, multiplies every gradient by c. Parameters that
/// do not require gradients are ignored. A non-finite norm is returned as is (the caller
/// decides whether to skip the step); gradients are then scaled by a non-finite c.
///
/// No communication: after backward() a replicated parameter's gradient is already summed
/// over the domain group (and after Module::average_gradients, equal on all data-parallel
/// replicas), so every rank computes the same norm and the same scaling on its own.
template <class T>
double clip_grad_norm(const NamedParameters<T>& parameters, double max_norm);

/// The same over an optimizer's parameters, through its table of their addresses (the form a
/// training step uses): one kernel for the norm and one for the scaling, whatever the number
/// of parameters. Each parameter's sum of squares is taken by one team, so on the host the
/// norm does not depend on the number of threads.
template <class T>
double clip_grad_norm(Optimizer<T>& optimizer, double max_norm);

extern template double clip_grad_norm(const NamedParameters<float>&, double);
extern template double clip_grad_norm(const NamedParameters<double>&, double);
extern template double clip_grad_norm(Optimizer<float>&, double);
extern template double clip_grad_norm(Optimizer<double>&, double);

}  // namespace shardtensor
