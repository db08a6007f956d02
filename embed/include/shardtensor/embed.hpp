#pragma once
// Embedding API: a model inside an MPI simulation (C++). The C API is capi/shardtensor.h.

#include "shardtensor/embed/session.hpp"
#include "shardtensor/embed/solver_arrays.hpp"
#include "shardtensor/embed/solver_patch.hpp"
