#pragma once
// Umbrella header of the autograd module: Variable, graph nodes, backward, grad mode.

#include "shardtensor/autograd/grad_mode.hpp"
#include "shardtensor/autograd/variable.hpp"
