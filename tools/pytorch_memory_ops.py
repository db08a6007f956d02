#!/usr/bin/env python3
"""PyTorch's memory-bound layers of a U-Net step: the peer of bench_memory_ops.

The same ops on the same shapes (1 x C x N^3 float, random values): max pooling 2, nearest
upsampling 2 (of the N/2 field), GroupNorm of 4 groups (affine), GELU (exact, erf), the
concatenation of two fields along channels and the MSE loss; forward, then backward from a
random output gradient (the loss: from 1). The heap keeps freed memory, as bench_memory_ops's
does (--heap keep, tools/glibc_heap.py; --heap release: glibc's defaults, so that every op's
outputs are mapped and faulted in afresh, as before 2026-12-06). Time: the best of --iters after --warmup, each
direction on its own, on --threads threads or (--device cuda) on the GPU, synchronised before
each clock read. Bytes: bench_memory_ops's count (each op's values
read and written once), so GB/s compare directly. Prints a table and, last, one JSON line.

    /usr/bin/python3 tools/pytorch_memory_ops.py --size 64
    /usr/bin/python3 tools/pytorch_memory_ops.py --size 64 --threads 2
    python3 tools/pytorch_memory_ops.py --size 128 --device cuda      (a GPU machine)
"""
import argparse
import json
import time

import torch

from glibc_heap import add_heap_option, keep_heap


def timed(make_output, iters, warmup, sync):
    """(forward s, backward s), each the best over the timed runs, measured apart."""
    forward = backward = float("inf")
    for it in range(warmup + iters):
        sync()
        start = time.perf_counter()
        out = make_output()
        sync()
        forward_s = time.perf_counter() - start
        gradient = torch.rand_like(out) if out.dim() > 0 else None
        sync()
        start = time.perf_counter()
        out.backward(gradient)
        sync()
        backward_s = time.perf_counter() - start
        if it >= warmup:
            forward, backward = min(forward, forward_s), min(backward, backward_s)
    return forward, backward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_heap_option(parser)
    args = parser.parse_args()
    keep_heap(args, args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    n, c = args.size, args.channels
    x = torch.rand(1, c, n, n, n, device=device)
    x2 = torch.rand(1, c, n, n, n, device=device)
    small = torch.rand(1, c, n // 2, n // 2, n // 2, device=device)
    norm = torch.nn.GroupNorm(4, c, eps=1e-5, affine=True).to(device)
    field = x.numel() * 4.0
    eighth = small.numel() * 4.0

    def leaf(t):
        return t.detach().requires_grad_(True)

    ops = [
        ("maxpool 2", field + eighth, eighth + field,
         lambda: torch.nn.functional.max_pool3d(leaf(x), 2)),
        ("upsample nearest 2", eighth + field, field + eighth,
         lambda: torch.nn.functional.interpolate(leaf(small), scale_factor=2, mode="nearest")),
        ("group norm", 2 * field, 3 * field, lambda: norm(leaf(x))),
        ("gelu", 2 * field, 3 * field, lambda: torch.nn.functional.gelu(leaf(x))),
        ("concat 2", 4 * field, 4 * field, lambda: torch.cat([leaf(x), leaf(x2)], dim=1)),
        ("mse loss", 2 * field, 3 * field,
         lambda: torch.nn.functional.mse_loss(leaf(x), x2)),
    ]
    records = []
    where = (torch.cuda.get_device_name() if args.device == "cuda"
             else f"{args.threads} thread(s)")
    print(f"pytorch_memory_ops: {n}^3 cells, C = {c}, batch 1, float, {where}, "
          f"PyTorch {torch.__version__}, heap: {args.heap}")
    print(f"  {'op':<22} {'fwd ms':>9} {'GB/s':>8} {'bwd ms':>9} {'GB/s':>8}")
    for name, forward_bytes, backward_bytes, make in ops:
        forward_s, backward_s = timed(make, args.iters, args.warmup, sync)
        records.append({"op": name, "forward_s": forward_s,
                        "forward_gbytes_per_s": forward_bytes / forward_s / 1e9,
                        "backward_s": backward_s,
                        "backward_gbytes_per_s": backward_bytes / backward_s / 1e9})
        print(f"  {name:<22} {forward_s * 1e3:9.3f} {forward_bytes / forward_s / 1e9:8.2f} "
              f"{backward_s * 1e3:9.3f} {backward_bytes / backward_s / 1e9:8.2f}")
    print(json.dumps({"peer": "pytorch_memory_ops", "torch": torch.__version__, "size": n,
                      "channels": c, "threads": args.threads, "device": args.device, "heap": args.heap,
                      "ops": records}))


if __name__ == "__main__":
    main()
