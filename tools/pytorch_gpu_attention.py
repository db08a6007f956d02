#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention forward + backward: the peer of bench_attention.

Same problem as bench_attention: batch 1, H heads of D channels, T tokens, non-causal unless
--causal; one step = forward, then backward for Q, K and V. Prints one JSON line per setting
(fp32 with TF32 off, fp32 with TF32 on, bf16; on a CPU fp32 and bf16): median step time of --iters timed steps after
--warmup, TFLOP/s (4 T^2 D H forward, twice that backward) and PyTorch's peak memory. On the
GPU the fused kernels PyTorch picks (FlashAttention, memory-efficient, cuDNN) run; elsewhere
(a CPU, PyTorch before 2.0) plain softmax(Q K^T / sqrt(D)) V does, at small sizes, so that
the script can be checked anywhere. On a CPU the heap keeps freed memory, as bench_attention's
does (--heap, tools/glibc_heap.py).

    python3 tools/pytorch_gpu_attention.py --tokens 16384,65536
"""
import argparse
import json
import math
import statistics
import time

import torch

from glibc_heap import add_heap_option, keep_heap


def attention(q, k, v, causal):
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def step_seconds(device, run, iters, warmup):
    times = []
    for step in range(warmup + iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            begin = time.perf_counter()
            run()
            seconds = time.perf_counter() - begin
        if step >= warmup:
            times.append(seconds)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="16384,65536", help="comma-separated lengths")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", choices=["on", "off"], default="off")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_heap_option(parser)
    args = parser.parse_args()
    keep_heap(args, torch.device(args.device).type)
    device = torch.device(args.device)
    causal = args.causal == "on"
    # On a CPU TF32 means nothing; bf16 runs there as bf16 tensors (oneDNN's bf16 GEMMs, on
    # AMX tiles where the CPU has them).
    settings = [("float32", False), ("float32", True), ("bfloat16", False)]
    if device.type != "cuda":
        settings = [("float32", False), ("bfloat16", False)]
    for tokens in (int(t) for t in args.tokens.split(",")):
        for dtype_name, tf32 in settings:
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                torch.cuda.reset_peak_memory_stats()
            dtype = getattr(torch, dtype_name)
            shape = (1, args.heads, tokens, args.head_dim)
            q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(shape, device=device, dtype=dtype)

            def run():
                out = attention(q, k, v, causal)
                out.backward(grad)
                q.grad = k.grad = v.grad = None

            seconds = step_seconds(device, run, args.iters, args.warmup)
            flops = 3 * 4 * tokens * tokens * args.head_dim * args.heads / (2 if causal else 1)
            record = {"peer": "pytorch_sdpa", "device": torch.cuda.get_device_name()
                      if device.type == "cuda" else "cpu", "torch": torch.__version__,
                      "tokens": tokens, "heads": args.heads, "head_dim": args.head_dim,
                      "causal": causal, "dtype": dtype_name, "tf32": tf32,
                      "step_ms": round(seconds * 1e3, 3),
                      "tflops": round(flops / seconds / 1e12, 3)}
            if device.type == "cuda":
                record["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            print(json.dumps(record), flush=True)
            del q, k, v, grad


if __name__ == "__main__":
    main()
