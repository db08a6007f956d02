#pragma once
// Small models the tests share: the options of a U-Net, an FNO and a ViT a few cells wide,
// each with fixed seeds (the same parameters in every test that builds them).

#include <vector>

#include "shardtensor/models/fno.hpp"
#include "shardtensor/models/unet.hpp"
#include "shardtensor/models/vit.hpp"

namespace shardtensor::test {

/// 2 -> 3 channels, 4 base channels, group norm of 2 groups.
inline models::UNetOptions small_unet(int dims, int depth) {
  models::UNetOptions o;
  o.dims = dims;
  o.in_channels = 2;
  o.out_channels = 3;
  o.depth = depth;
  o.base_channels = 4;
  o.norm_groups = 2;
  o.seed = 7;
  return o;
}

/// 2 -> 1 channels, width 4, 3 modes, 2 layers.
inline models::FNOOptions small_fno(int dims) {
  models::FNOOptions o;
  o.dims = dims;
  o.in_channels = 2;
  o.out_channels = 1;
  o.width = 4;
  o.modes = {3};
  o.layers = 2;
  o.projection_channels = 6;
  o.seed = 5;
  return o;
}

/// 3 -> 2 channels, 2x2 patches, 8-wide tokens, 2 blocks of 2 heads, a 3-token window.
inline models::ViTOptions small_vit(int dims, AttentionKind attention, PositionKind position,
                                    const std::vector<Index>& extents, bool input_skip = false) {
  models::ViTOptions o;
  o.dims = dims;
  o.in_channels = 3;
  o.out_channels = 2;
  o.patch = {2};
  o.embed_dim = 8;
  o.depth = 2;
  o.heads = 2;
  o.mlp_channels = 12;
  o.attention = attention;
  o.window = {3};
  o.position = position;
  o.extents = extents;
  o.input_skip = input_skip;
  o.final_norm = !input_skip;  // both ways
  o.seed = 7;
  return o;
}

}  // namespace shardtensor::test
