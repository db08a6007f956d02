#pragma once
// Spectral: the distributed FFT of sharded fields and the FNO spectral convolution.

#include "shardtensor/spectral/distributed_fft.hpp"
#include "shardtensor/spectral/spectral_conv.hpp"
