#pragma once
// Compatibility: the layer library's folder was nn/ and its umbrella header shardtensor/nn.hpp
// until 2026-12; it is layers/ (shardtensor/layers.hpp, shardtensor/layers/...) now. This
// header stays for one release so that programs including it still build.

#include "shardtensor/layers.hpp"
