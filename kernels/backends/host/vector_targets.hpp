#pragma once

// The instruction sets the host's Highway sources are compiled for (each includes this before
// Highway's foreach_target.h): targets with fused multiply-add vectors only, so that the paths sum
// alike. SSE4 and SSSE3 have none; SVE's sizeless vectors cannot be held in the register
// tiles' arrays (on the Arm servers out today, SVE is 128 or 256 bits wide, and NEON runs
// there).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS \
  (HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
