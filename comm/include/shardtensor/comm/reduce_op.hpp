#pragma once
// ReduceOp: the element-wise reduction of a collective (allreduce, reduce-scatter).

namespace shardtensor {

enum class ReduceOp { sum, max, min };

}  // namespace shardtensor
