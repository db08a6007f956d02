#!/usr/bin/env bash
# The GPU attention check in one device call (under 8 minutes on an H100, after
# scripts/device/bundle.sh here): the ring and neighbourhood attention tests and the ViT's at
# 1 and 2 ranks, the ViT peer's self-check (flex_attention against a loop of ShardTensor's key
# ranges), then bench.sh's attention (bench_attention at 16k and 64k tokens beside
# scaled_dot_product_attention) and vit (1024^2 beside tools/pytorch_gpu_vit.py) parts.
#
#   scripts/device/check-attention.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
OUT="$out/tests" DEADLINE=90 JOBS=2 bash "$root/scripts/device/run.sh" \
  'test_(ring_attention|neighborhood_attention|vit)_np[12]' 90
python3 "$root/tools/pytorch_gpu_vit.py" --self-check > "$out/vit_peer_check.log" 2>&1
tail -1 "$out/vit_peer_check.log"
LIMIT_S=100 OUT="$out" bash "$root/scripts/device/bench.sh" attention,vit
