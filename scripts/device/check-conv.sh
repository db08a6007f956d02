#!/usr/bin/env bash
# The GPU convolution check in one device call (about 6 minutes on an H100, after
# scripts/device/bundle.sh here): the conv-family tests at one rank on cuDNN's graph API, on
# NCDHW and on channels-last copies (CPU against GPU within the tests' tolerances), then
# bench.sh's conv and U-Net figures for the legacy calls, the graph API and channels-last, with
# TF32 off and on, and PyTorch's in the same call. Everything lands in $OUT.
#
#   scripts/device/check-conv.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
for layout in ncdhw channels_last; do
  SHARDTENSOR_CUDNN_API=graph SHARDTENSOR_CUDNN_LAYOUT=$layout OUT="$out/tests-$layout" \
    DEADLINE=75 JOBS=2 bash "$root/scripts/device/run.sh" \
    'test_(conv|conv_transpose|backend_layers|models)_np1' 90
done
LIMIT_S=60 OUT="$out" bash "$root/scripts/device/bench.sh" conv,unet
