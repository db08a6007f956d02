#pragma once
// Umbrella header of the comm module.

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/gather_scatter.hpp"
#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/comm/redistribute.hpp"
#include "shardtensor/comm/slab_exchange.hpp"
