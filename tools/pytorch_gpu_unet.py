#!/usr/bin/env python3
"""PyTorch's U-Net training step and inference on the GPU: the peer of bench_scaling on a CUDA build.

The model of --config (default bench/scaling_unet3d.yaml) as tools/shardtensor_torch.py builds
it (the same layers, names and parameter count as ShardTensor's builder), 2 -> 1 channels,
batch 1, float, on an N^dims field of random values. The training step is bench_scaling's:
forward, MSE loss, backward, gradient-norm clipping (training.clip_grad_norm), AdamW; then the
eval-mode forward without gradients. Prints one JSON line per TF32 setting (off, then on;
cuDNN with benchmark = True, PyTorch eager): the median of --iters timed steps after --warmup
(CUDA events around each step), and the peak memory PyTorch allocated
(torch.cuda.max_memory_allocated) over training and inference. A size that does not fit
prints "fits": false instead of times.

    python3 tools/pytorch_gpu_unet.py --size 128
    python3 tools/pytorch_gpu_unet.py --size 128,256,320     # one line per size and setting

The GPU machines have PyTorch but maybe not PyYAML: without it, the config is read by a small
reader of block maps and scalars, which is all the bench configs use.
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shardtensor_torch as st  # noqa: E402


def scalar(text):
    """A YAML scalar of the bench configs: bool, int, float or string."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


def read_block_maps(text):
    """Nested `key: value` block maps (indentation, # comments), the bench configs' YAML."""
    root = {}
    stack = [(-1, root)]
    for line in text.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= indent:
            stack.pop()
        if value.strip():
            stack[-1][1][key] = scalar(value.strip())
        else:
            stack[-1][1][key] = {}
            stack.append((indent, stack[-1][1][key]))
    return root


def load_run_config(path):
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        import yaml
        config = yaml.safe_load(text)
    except ImportError:
        config = read_block_maps(text)
    return st.model_section(config, path), config


def timed(step, warmup, iters):
    """Median seconds of `iters` calls of step() after `warmup`, CUDA events around each."""
    times = []
    for i in range(warmup + iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def run(args, model_cfg, run_cfg, size, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    device = torch.device("cuda")
    optimizer_cfg = run_cfg.get("optimizer") or {}
    training_cfg = run_cfg.get("training") or {}
    record = {"peer": "pytorch_unet", "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "config": args.config, "dims": args.dims,
              "size": size, "tf32": tf32}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        net = st.build_model(model_cfg, dims=args.dims, in_channels=2, out_channels=1).to(device)
        record["parameters"] = sum(p.numel() for p in net.parameters())
        opt = torch.optim.AdamW(net.parameters(), lr=float(optimizer_cfg.get("lr", 1e-3)),
                                weight_decay=float(optimizer_cfg.get("weight_decay", 0.0)))
        clip = float(training_cfg.get("clip_grad_norm", 0.0))
        field = [size] * args.dims
        x = torch.rand(1, 2, *field, device=device)
        target = torch.rand(1, 1, *field, device=device)

        def train_step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(net(x), target)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()

        def infer_step():
            with torch.no_grad():
                net(x)

        net.train()
        record["train_step_s"] = timed(train_step, args.warmup, args.iters)
        net.eval()
        record["infer_step_s"] = timed(infer_step, args.warmup, args.iters)
        record["fits"] = True
    except torch.cuda.OutOfMemoryError:
        record["fits"] = False
    record["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(record), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--config", default=os.path.join(here, "..", "bench",
                                                          "scaling_unet3d.yaml"))
    parser.add_argument("--size", default="128", help="N or a list N1,N2,...")
    parser.add_argument("--dims", type=int, default=3)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    model_cfg, run_cfg = load_run_config(args.config)
    for size in (int(s) for s in args.size.split(",")):
        for tf32 in (False, True):
            run(args, model_cfg, run_cfg or {}, size, tf32)


if __name__ == "__main__":
    main()
