#pragma once
// Umbrella header of the optim module: optimizers, learning-rate schedules, gradient clipping.

#include "shardtensor/optim/grad_clip.hpp"
#include "shardtensor/optim/lr_schedule.hpp"
#include "shardtensor/optim/optimizer.hpp"
