#!/usr/bin/env bash
# The GPU check of the convolution and attention work in one device call (about 6 minutes on
# an H100 or H200, after scripts/device/bundle.sh here), in the order of what it settles first:
#   1. the conv-family, model, ring attention, ViT and bf16 tests at 1 and 2 ranks on the default
#      cuDNN path (float: the graph API's engines timed beside the legacy algorithms, NCDHW)
#      (the GPU against the CPU within the tests' tolerances), the resampling, pooling and
#      normalization layers (their per-shape plans and reused scratch on the device) and the
#      launch and allocation budgets of a step, and the conv-family tests at 1
#      rank on the graph API with channels-last copies;
#   2. bench.sh conv: the default path and channels-last copies, TF32 off and on, beside
#      PyTorch (fp32, deterministic, TF32, channels-last, bf16 autocast);
#   3. bench.sh attention at ATTENTION_TOKENS (16384) on 1 and 2 ranks (ATTENTION_RANKS), TF32
#      off and on, beside SDPA;
#   4. bench.sh unet on UNET_APIS (graph: the default path), TF32 off and on, beside PyTorch.
# CONV_APIS (default "graph graph_cl") the conv benchmark's cuDNN paths.
# BENCH_PARTS (default conv,attention,unet) picks the benchmarks of steps 2-4 ("memops" adds
# bench.sh memops: the memory-bound layers at 128^3 beside PyTorch); with "profile"
# among them, a U-Net step also runs under the Kokkos kernel timer ($OUT/profile.txt).
# Everything lands in $OUT (tests*/summary.txt, tests*/log.txt, bench.log, bench.jsonl); the last
# lines printed are the tests that did not pass and one line per benchmark result.
#
#   scripts/device/check-gpu.sh            TESTS=REGEX overrides the tests of step 1, CL_TESTS
#                                          those on channels-last copies (empty: none)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
OUT="$out/tests" DEADLINE="${TEST_DEADLINE:-60}" JOBS=4 bash "$root/scripts/device/run.sh" \
  "${TESTS:-^test_(conv|conv_transpose|backend_layers|models|ring_attention|vit|bfloat16|resample|pooling|normalization|kernel_counts)_np[12]$}" \
  "${TEST_LIMIT_S:-90}" > /dev/null
grep -E 'FAIL|TIMEOUT|SKIPPED|passed' "$out/tests/summary.txt"
cl_tests="${CL_TESTS-^test_(conv|conv_transpose|backend_layers)_np1$}"
if [ -n "$cl_tests" ]; then
  SHARDTENSOR_CUDNN_API=graph SHARDTENSOR_CUDNN_LAYOUT=channels_last OUT="$out/tests_cl" \
    DEADLINE=30 JOBS=4 bash "$root/scripts/device/run.sh" "$cl_tests" 90 > /dev/null
  grep -E 'FAIL|TIMEOUT|SKIPPED|passed' "$out/tests_cl/summary.txt"
fi
parts=",${BENCH_PARTS:-conv,attention,unet},"
if [[ $parts == *,conv,* ]]; then
  CUDNN_APIS="${CONV_APIS:-graph graph_cl}" LIMIT_S=60 OUT="$out" \
    bash "$root/scripts/device/bench.sh" conv \
    > /dev/null
fi
if [[ $parts == *,attention,* ]]; then
  ATTENTION_TOKENS="${ATTENTION_TOKENS:-16384}" ATTENTION_RANKS="${ATTENTION_RANKS:-1 2}" \
    LIMIT_S=90 OUT="$out" \
    bash "$root/scripts/device/bench.sh" attention > /dev/null
fi
if [[ $parts == *,unet,* ]]; then
  CUDNN_APIS="${UNET_APIS:-graph}" LIMIT_S=60 OUT="$out" bash "$root/scripts/device/bench.sh" \
    unet > /dev/null
fi
if [[ $parts == *,profile,* ]]; then
  # Where the U-Net's step goes: Kokkos kernels timed with blocking launches (cuDNN's and
  # cuBLAS's kernels are not Kokkos kernels: the step's time less the table's is theirs).
  # shellcheck disable=SC1091
  source /tmp/shardtensor-device/env.sh
  CUDA_LAUNCH_BLOCKING=1 \
    KOKKOS_TOOLS_LIBS=/tmp/shardtensor-device/build/bench/libshardtensor_kernel_timer.so \
    timeout -k 5 120 mpiexec -x CUDA_LAUNCH_BLOCKING -x KOKKOS_TOOLS_LIBS -n 1 \
    /tmp/shardtensor-device/build/bench/bench_scaling --config "$root/bench/scaling_unet3d.yaml" \
    --channels-in 2 --channels-out 1 --size 128 --warmup 1 --iters 2 > "$out/profile.txt" 2>&1
  tail -40 "$out/profile.txt"
fi
if [[ $parts == *,memops,* ]]; then
  LIMIT_S=60 OUT="$out" bash "$root/scripts/device/bench.sh" memops > /dev/null
fi
grep '^exit' "$out/bench.log"
python3 "$root/scripts/device/summarize.py" "$out/bench.jsonl"
