#!/usr/bin/env bash
# The GPU check of the convolution and attention work in one device call (about 6 minutes on
# an H100 or H200, after scripts/device/bundle.sh here), in the order of what it settles first:
#   1. the conv-family, model, ring attention and ViT tests at 1 and 2 ranks on cuDNN's graph
#      API with channels-last copies (the GPU against the CPU within the tests' tolerances),
#      and the conv-family tests at 1 rank on the graph API without them (NCDHW);
#   2. bench.sh conv: the graph API on NCDHW and on channels-last copies, TF32 off and on,
#      beside PyTorch (fp32, deterministic, TF32, channels-last, bf16 autocast);
#   3. bench.sh attention at ATTENTION_TOKENS (16384), TF32 off and on, beside SDPA;
#   4. bench.sh unet on channels-last copies (UNET_APIS: graph_cl), TF32 off and on, beside
#      PyTorch.
# Everything lands in $OUT (tests*/summary.txt, tests*/log.txt, bench.log, bench.jsonl); the last
# lines printed are the tests that did not pass and one line per benchmark result.
#
#   scripts/device/check-gpu.sh            TESTS=REGEX overrides the tests of step 1
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
SHARDTENSOR_CUDNN_API=graph SHARDTENSOR_CUDNN_LAYOUT=channels_last OUT="$out/tests" \
  DEADLINE="${TEST_DEADLINE:-60}" JOBS=4 bash "$root/scripts/device/run.sh" \
  "${TESTS:-^test_(conv|conv_transpose|backend_layers|models|ring_attention|vit)_np[12]$}" 90 \
  > /dev/null
grep -E 'FAIL|TIMEOUT|SKIPPED|passed' "$out/tests/summary.txt"
SHARDTENSOR_CUDNN_API=graph OUT="$out/tests_ncdhw" DEADLINE=30 JOBS=4 \
  bash "$root/scripts/device/run.sh" "^test_(conv|conv_transpose|backend_layers)_np1$" 90 > /dev/null
grep -E 'FAIL|TIMEOUT|SKIPPED|passed' "$out/tests_ncdhw/summary.txt"
CUDNN_APIS="graph graph_cl" LIMIT_S=60 OUT="$out" bash "$root/scripts/device/bench.sh" conv \
  > /dev/null
ATTENTION_TOKENS="${ATTENTION_TOKENS:-16384}" LIMIT_S=90 OUT="$out" \
  bash "$root/scripts/device/bench.sh" attention > /dev/null
CUDNN_APIS="${UNET_APIS:-graph_cl}" LIMIT_S=60 OUT="$out" bash "$root/scripts/device/bench.sh" unet \
  > /dev/null
grep '^exit' "$out/bench.log"
python3 "$root/scripts/device/summarize.py" "$out/bench.jsonl"
