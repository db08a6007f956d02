#pragma once
// Umbrella header of the autograd module: Variable, graph nodes and backward.

#include "shardtensor/autograd/variable.hpp"
