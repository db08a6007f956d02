#pragma once
// Which of a library's timed candidates runs (cuDNN's engines and algorithms for one
// convolution direction, kernels/backends/cuda/conv_cudnn.cpp): the one with the least
// workspace among those within 5 % of the fastest. Timing noise is about 1 %, and the memory
// is the field's: a candidate that saves a few percent but asks for hundreds of MiB more
// makes the largest field smaller.

#include <cstddef>
#include <vector>

namespace shardtensor::kernels {

/// A timed candidate: its milliseconds and workspace bytes.
struct TimedCandidate {
  float milliseconds = 0;
  std::size_t workspace = 0;
};

/// The index of the candidate to run (-1 where there is none): the least workspace among those
/// within 5 % of the fastest, the faster of equal workspaces.
inline int least_workspace_near_fastest(const std::vector<TimedCandidate>& timed) {
  float fastest_ms = -1;
  for (const TimedCandidate& t : timed)
    if (fastest_ms < 0 || t.milliseconds < fastest_ms) fastest_ms = t.milliseconds;
  int pick = -1;
  for (int i = 0; i < int(timed.size()); ++i) {
    if (timed[i].milliseconds > fastest_ms * 1.05f) continue;
    if (pick < 0 || timed[i].workspace < timed[pick].workspace ||
        (timed[i].workspace == timed[pick].workspace &&
         timed[i].milliseconds < timed[pick].milliseconds))
      pick = i;
  }
  return pick;
}

}  // namespace shardtensor::kernels
