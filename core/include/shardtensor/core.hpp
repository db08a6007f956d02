#pragma once
// Umbrella header of the core module.

#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/box.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/closest_name.hpp"
#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/ghost_widths.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/core/types.hpp"
