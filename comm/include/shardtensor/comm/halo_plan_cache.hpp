#pragma once
// HaloPlanCache<T>: the one cache of HaloExchange plans. A model calls its ops with the same
// layouts every step, so a plan (its boxes, buffers and tags) is built once per layout and
// reused. Used by HaloPadding (one cache per layer) and by ops without a module to hold it
// (neighbourhood attention: the cache shared per communicator).
//
// Plans are built collectively: every rank makes the same calls in the same order, so every
// rank builds (and, when the cache is full, drops) the same plans at the same time.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {

template <class T>
class HaloPlanCache {
 public:
  /// Plans kept at most; a full cache starts over (layouts that change every call would
  /// otherwise grow it without bound).
  static constexpr std::size_t max_plans = 32;

  explicit HaloPlanCache(Communicator comm) : comm_(std::move(comm)) {}

  /// The plan for fields laid out like `like` (decomposition, batch, channels, ghost widths),
  /// built on first use; errors while building are prefixed with `where`. Collective on
  /// first use of a layout.
  std::shared_ptr<HaloExchange<T>> plan(const ShardTensor<T>& like, const std::string& where) {
    std::vector<long long> key = impl::signature(like.decomposition());
    key.push_back(like.batch());
    key.push_back(like.channels());
    for (int a = 0; a < max_spatial_dims; ++a) {
      key.push_back(like.ghosts().lower[a]);
      key.push_back(like.ghosts().upper[a]);
    }
    const auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    if (plans_.size() >= max_plans) plans_.clear();
    std::shared_ptr<HaloExchange<T>> plan;
    try {
      plan = std::make_shared<HaloExchange<T>>(comm_, like);
    } catch (const Error& e) {  // name the caller: "Conv3d 'conv1': HaloExchange: halo width ..."
      throw Error(where + ": " + e.what());
    }
    plans_.emplace(std::move(key), plan);
    return plan;
  }

  /// The cache shared by every caller on `comm` (for ops that have no module to hold one).
  /// Emptied when Kokkos finalizes (plans hold Views). The entry holds a copy of the
  /// communicator, which keeps its id (the key) from being reused meanwhile.
  static HaloPlanCache& shared(const Communicator& comm) {
    static std::map<std::uintptr_t, HaloPlanCache> caches;
    static bool release_hooked = false;
    if (!release_hooked) {
      Kokkos::push_finalize_hook([] {
        caches.clear();
        release_hooked = false;
      });
      release_hooked = true;
    }
    return caches.try_emplace(comm.id(), comm).first->second;
  }

 private:
  Communicator comm_;
  std::map<std::vector<long long>, std::shared_ptr<HaloExchange<T>>> plans_;
};

}  // namespace shardtensor
