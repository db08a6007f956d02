#pragma once
// Umbrella header of the layers module.

#include "shardtensor/layers/concat.hpp"
#include "shardtensor/layers/conv.hpp"
#include "shardtensor/layers/conv_transpose.hpp"
#include "shardtensor/layers/crop_pad.hpp"
#include "shardtensor/layers/dropout.hpp"
#include "shardtensor/layers/grad_clip.hpp"
#include "shardtensor/layers/loss.hpp"
#include "shardtensor/layers/lr_schedule.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/layers/normalization.hpp"
#include "shardtensor/layers/optimizer.hpp"
#include "shardtensor/layers/padding.hpp"
#include "shardtensor/layers/pointwise.hpp"
#include "shardtensor/layers/pooling.hpp"
#include "shardtensor/layers/upsample.hpp"
#include "shardtensor/layers/variable.hpp"
