#pragma once
// Models: U-Net, sequential containers, the config-driven builder and summaries.

#include "shardtensor/models/builder.hpp"
#include "shardtensor/models/fno.hpp"
#include "shardtensor/models/sequential.hpp"
#include "shardtensor/models/summary.hpp"
#include "shardtensor/models/unet.hpp"
#include "shardtensor/models/vit.hpp"
