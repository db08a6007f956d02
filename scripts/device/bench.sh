#!/usr/bin/env bash
# The GPU benchmarks of docs/performance.md ("Convolution on the GPU" and the H100 rows of "U-Net"), on a GPU machine, from the bundle
# that scripts/device/bundle.sh made: each ShardTensor benchmark and its PyTorch peer on the
# same GPU, fp32 with TF32 off and on, one JSON line each, into $OUT/bench.jsonl (and the full
# output into $OUT/bench.log). Run it after scripts/device/run.sh (which unpacks the bundle),
# or alone: then it unpacks the bundle first, running no test.
#
#   scripts/device/bench.sh [conv,unet,capacity,vit,attention,memops,halo]  (default: all, in order)
#
#   conv       bench_conv 32 -> 32, k3, 128^3, forward + backward (median of 7 after 3) and
#              tools/pytorch_gpu_conv.py
#   unet       bench_scaling on bench/scaling_unet3d.yaml at 128^3, training step and
#              inference (median of 7 after 3) and tools/pytorch_gpu_unet.py; then both in
#              bf16 (PyTorch: AMP on channels-last)
#   capacity   the same U-Net in float and bf16, each with and without recomputation, at
#              growing cubes until one does not fit in 90 % of the GPU's memory
#              (bench_scaling --budget-mib), and PyTorch's largest under the same budget
#              (float, AMP bf16 channels-last, each with and without checkpointing)
#   vit        bench_scaling on examples/02_train_config/heat2d_vit.yaml at 1024^2 and
#              tools/pytorch_gpu_vit.py (flex_attention, torch.compile)
#   attention  bench_attention at 16384 and 65536 tokens (TF32 off and on), and PyTorch's
#              scaled_dot_product_attention (tools/pytorch_gpu_attention.py: fp32, TF32, bf16)
#   memops     bench_memory_ops at 128^3 (pooling, upsampling, GroupNorm, GELU, concat, MSE:
#              GB/s against the GPU's copy ceiling) and tools/pytorch_memory_ops.py on the GPU
#   halo       bench_halo on device memory, float against the bfloat16 wire (its bf16 column):
#              one rank, periodic (the messages to itself), and two ranks sharing the GPU
#              (staged through host buffers); then ring attention's K/V on the bfloat16 wire
#              (bench_attention --bf16 on at 16384 tokens, one and two ranks)
#
# Each command runs with a time limit (LIMIT_S, 300 s); a run that fails or times out is
# logged and the next one starts. CUDNN_APIS (default "legacy graph graph_cl") names the cuDNN
# paths the conv and unet parts run, ATTENTION_TOKENS (default "16384 65536") the attention
# part's lengths and ATTENTION_RANKS (default 1; "1 2": also two ranks sharing the GPU, with
# the fraction of the step spent waiting for the ring's transfers) its rank counts. The last lines printed are one summary line per result
# (scripts/device/summarize.py).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$root/device-out}"
limit="${LIMIT_S:-300}"
parts=",${1:-conv,unet,capacity,vit,attention,memops,halo},"
unpacked=/tmp/shardtensor-device
mkdir -p "$out"
[ -f "$unpacked/env.sh" ] || bash "$root/scripts/device/run.sh" '^$' 1 > /dev/null
# shellcheck disable=SC1091
source "$unpacked/env.sh"
bin="$unpacked/build/bench"
log="$out/bench.log" jsonl="$out/bench.jsonl"

# One command: its output to the log, its JSON lines (lines that start with '{') to jsonl.
run() {
  echo "\$ $*" >> "$log"
  timeout -k 5 "$limit" "$@" > "$unpacked/bench.out" 2>&1 < /dev/null
  local rc=$?
  cat "$unpacked/bench.out" >> "$log"
  # Each line says which cuDNN path ran (the environment chooses it, the programs do not say).
  grep '^{' "$unpacked/bench.out" |
    sed "s/^{/{\"cudnn_api\":\"${SHARDTENSOR_CUDNN_API:-}\",\"cudnn_layout\":\"${SHARDTENSOR_CUDNN_LAYOUT:-}\",/" >> "$jsonl"
  [ $rc -eq 0 ] || echo "exit $rc: $*" | tee -a "$log"
  return 0
}

memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)" | tee -a "$log"
unet=(--config "$root/bench/scaling_unet3d.yaml" --channels-in 2 --channels-out 1)

# cuDNN's legacy calls, its graph API (SHARDTENSOR_CUDNN_API=graph) and the graph API on
# channels-last copies (graph_cl: SHARDTENSOR_CUDNN_LAYOUT=channels_last), each with TF32 off
# and on.
apis="${CUDNN_APIS:-legacy graph graph_cl}"
layout_of() { [ "$1" = graph_cl ] && echo channels_last || echo ncdhw; }
api_of() { [ "$1" = legacy ] && echo legacy || echo graph; }
if [[ $parts == *,conv,* ]]; then
  for api in $apis; do
    for tf32 in off on; do
      SHARDTENSOR_CUDNN_API=$(api_of $api) SHARDTENSOR_CUDNN_LAYOUT=$(layout_of $api) \
        run mpiexec -x SHARDTENSOR_CUDNN_API -x SHARDTENSOR_CUDNN_LAYOUT -n 1 "$bin/bench_conv" \
        --size 128 --channels 32 --warmup 3 --iters 7 --tf32 $tf32
    done
  done
  run python3 "$root/tools/pytorch_gpu_conv.py" --size 128 --channels 32
fi
if [[ $parts == *,unet,* ]]; then
  for api in $apis; do
    for tf32 in off on; do
      SHARDTENSOR_CUDNN_API=$(api_of $api) SHARDTENSOR_CUDNN_LAYOUT=$(layout_of $api) \
        run mpiexec -x SHARDTENSOR_CUDNN_API -x SHARDTENSOR_CUDNN_LAYOUT -n 1 \
        "$bin/bench_scaling" "${unet[@]}" --warmup 3 --iters 7 --size 128 --tf32 $tf32
    done
  done
  run python3 "$root/tools/pytorch_gpu_unet.py" --size 128
  # bf16 (training.precision: bf16, the default cuDNN path) beside PyTorch's AMP bf16 on
  # channels-last tensors.
  run mpiexec -n 1 "$bin/bench_scaling" "${unet[@]}" --warmup 3 --iters 7 --size 128 \
    --precision bf16
  run python3 "$root/tools/pytorch_gpu_unet.py" --size 128 --precision bf16 --channels-last
fi
if [[ $parts == *,capacity,* ]]; then
  # float and bf16, each without and with recomputation, against PyTorch's float, AMP bf16
  # (channels-last) and torch.utils.checkpoint per level, under the same budget.
  budget=$((memory_mib * 9 / 10))
  for recompute in "" _recompute; do
    for precision in float bf16; do
      for size in 192 256 320 384 448 512 576; do
        run mpiexec -n 1 "$bin/bench_scaling" "${unet[@]/scaling_unet3d.yaml/scaling_unet3d$recompute.yaml}" \
          --precision $precision --warmup 1 --iters 1 --infer-iters 0 --size $size --budget-mib $budget
        grep -q '"fits":true' "$unpacked/bench.out" || break
      done
      run python3 "$root/tools/pytorch_gpu_unet.py" --size 128 --capacity-mib $budget \
        --precision $precision ${recompute:+--recompute} \
        $([ $precision = bf16 ] && echo --channels-last)
    done
  done
fi
if [[ $parts == *,vit,* ]]; then
  for tf32 in off on; do
    run mpiexec -n 1 "$bin/bench_scaling" --config "$root/examples/02_train_config/heat2d_vit.yaml" \
      --dims 2 --size 1024 --warmup 3 --iters 7 --tf32 $tf32
  done
  # The PyTorch peer (flex_attention, torch.compile): one command per setting, each compiles.
  for tf32 in off on; do
    run python3 "$root/tools/pytorch_gpu_vit.py" \
      --config "$root/examples/02_train_config/heat2d_vit.yaml" --size 1024 --warmup 3 --iters 7 \
      --tf32 $tf32
  done
fi
if [[ $parts == *,attention,* ]]; then
  for tokens in ${ATTENTION_TOKENS:-16384 65536}; do
    for tf32 in off on; do
      for ranks in ${ATTENTION_RANKS:-1}; do
        run mpiexec -n $ranks "$bin/bench_attention" --tokens $tokens --iters 5 --warmup 1 \
          --tf32 $tf32
      done
    done
  done
  tokens="${ATTENTION_TOKENS:-16384 65536}"
  run python3 "$root/tools/pytorch_gpu_attention.py" --tokens "${tokens// /,}" --iters 5 --warmup 2
fi
if [[ $parts == *,memops,* ]]; then
  run mpiexec -n 1 "$bin/bench_memory_ops" --size 128 --iters 5 --warmup 2
  run python3 "$root/tools/pytorch_memory_ops.py" --size 128 --iters 5 --warmup 2 --device cuda
fi
if [[ $parts == *,halo,* ]]; then
  run mpiexec -n 1 "$bin/bench_halo" --periodic --reps 5
  run mpiexec -n 2 "$bin/bench_halo" --reps 5
  for ranks in 1 2; do
    run mpiexec -n $ranks "$bin/bench_attention" --tokens 16384 --iters 3 --warmup 1 --bf16 on
  done
fi
echo "bench: $(wc -l < "$jsonl") JSON lines in $jsonl"
python3 "$root/scripts/device/summarize.py" "$jsonl"
