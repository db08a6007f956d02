#!/usr/bin/env python3
"""PyTorch's Conv3d (cuDNN) forward + backward on the GPU: the peer of bench_conv on a CUDA build.

Same problem as bench_conv: batch 1, C -> C channels, kernel 3, padding 1, float, a field of
N^3, one step = forward, then backward for the input and weight gradients. Prints one JSON
line per setting (fp32, fp32 with cudnn.deterministic, TF32, TF32 on channels_last_3d, bf16
autocast on channels_last_3d): median step time of --iters timed steps after --warmup, GFLOP/s
and the peak memory PyTorch allocated.

    python3 tools/pytorch_gpu_conv.py --size 128 --channels 32
"""
import argparse
import json
import statistics

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    n, c = args.size, args.channels
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    settings = [  # (tf32, deterministic, channels_last, bf16 autocast)
        (False, False, False, False), (False, True, False, False), (True, False, False, False),
        (True, False, True, False), (False, False, True, True)]
    for tf32, deterministic, channels_last, bf16 in settings:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.deterministic = deterministic
        layout = torch.channels_last_3d if channels_last else torch.contiguous_format
        conv = torch.nn.Conv3d(c, c, 3, padding=1, bias=False).to(device, memory_format=layout)
        x = torch.randn(1, c, n, n, n, device=device).to(memory_format=layout).requires_grad_()
        g = torch.randn(1, c, n, n, n, device=device).to(memory_format=layout)
        torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(args.warmup + args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                y = conv(x)
            y.backward(g)
            end.record()
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(start.elapsed_time(end) / 1e3)
            x.grad = None
            conv.weight.grad = None
        step_s = statistics.median(times)
        flops = 3 * 2 * c * c * 27 * n**3  # forward, input gradient, weight gradient
        print(json.dumps({"peer": "pytorch_conv3d", "device": torch.cuda.get_device_name(),
                          "torch": torch.__version__, "size": n, "channels": c, "tf32": tf32,
                          "deterministic": deterministic, "channels_last": channels_last,
                          "bf16_autocast": bf16,
                          "step_ms": round(step_s * 1e3, 3),
                          "gflops": round(flops / step_s / 1e9, 1),
                          "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)}))


if __name__ == "__main__":
    main()
