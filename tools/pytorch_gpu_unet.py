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

With --device cpu (the peer of a Serial or OpenMP build, on --threads threads): wall-clock
medians (the heap keeping freed memory as ShardTensor's benchmarks do: --heap,
tools/glibc_heap.py), and the peaks of what PyTorch's allocator held during one training step and during
one inference, above what was allocated before it (the parameters, the optimizer state and
the input; from the profiler's allocation events, so exact, unlike the resident set): compare
bench_scaling's "peak_mib" less its parameters, optimizer_state and other.

    python3 tools/pytorch_gpu_unet.py --size 128
    python3 tools/pytorch_gpu_unet.py --size 128,256,320     # one line per size and setting
    /usr/bin/python3 tools/pytorch_gpu_unet.py --device cpu --size 64 --warmup 1 --iters 2

The GPU machines have PyTorch but maybe not PyYAML: without it, the config is read by a small
reader of block maps and scalars, which is all the bench configs use.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shardtensor_torch as st  # noqa: E402
from glibc_heap import add_heap_option, keep_heap  # noqa: E402


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


def timed(step, warmup, iters, device):
    """Median seconds of `iters` calls of step() after `warmup` (CUDA events around each on a
    GPU, the wall clock on the CPU)."""
    times = []
    for i in range(warmup + iters):
        if device.type == "cpu":
            start = time.perf_counter()
            step()
            if i >= warmup:
                times.append(time.perf_counter() - start)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def allocation_peak_mib(step):
    """Peak bytes PyTorch's CPU allocator held during step(), above what it held before."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        step()
    events = sorted((e.start_us(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return round(peak / 2**20, 1)


def make_steps(model_cfg, run_cfg, size, dims, device, precision="float", channels_last=False):
    """bench_scaling's training step and inference on random fields: (train, infer, model).
    precision bf16: the forward and the loss under torch.autocast(bfloat16) (AMP: float
    parameters, gradients and optimizer state). channels_last: model and input in
    channels-last memory format (tensor cores' layout on a GPU)."""
    optimizer_cfg = run_cfg.get("optimizer") or {}
    training_cfg = run_cfg.get("training") or {}
    net = st.build_model(model_cfg, dims=dims, in_channels=2, out_channels=1).to(device)
    layout = {2: torch.channels_last, 3: torch.channels_last_3d}.get(dims)
    if channels_last and layout is not None:
        net = net.to(memory_format=layout)
    opt = torch.optim.AdamW(net.parameters(), lr=float(optimizer_cfg.get("lr", 1e-3)),
                            weight_decay=float(optimizer_cfg.get("weight_decay", 0.0)))
    clip = float(training_cfg.get("clip_grad_norm", 0.0))
    field = [size] * dims
    x = torch.rand(1, 2, *field, device=device)
    target = torch.rand(1, 1, *field, device=device)
    if channels_last and layout is not None:
        x = x.contiguous(memory_format=layout)
        target = target.contiguous(memory_format=layout)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    if precision == "bf16" and device.type == "cpu":
        st.group_norm_in_float_under_cpu_autocast(net)

    def train_step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.mse_loss(net(x).float(), target)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()

    def infer_step():
        with torch.no_grad(), autocast:
            net(x)

    return train_step, infer_step, net


def run(args, model_cfg, run_cfg, size, tf32):
    device = torch.device(args.device)
    torch.manual_seed(1)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    record = {"peer": "pytorch_unet", "device": name, "torch": torch.__version__,
              "config": args.config, "dims": args.dims, "size": size,
              "precision": args.precision, "recompute": bool(model_cfg.get("recompute")),
              "channels_last": args.channels_last}
    if device.type == "cpu":
        return run_on_cpu(args, record, model_cfg, run_cfg, size)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    record["tf32"] = tf32
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        train_step, infer_step, net = make_steps(model_cfg, run_cfg, size, args.dims, device,
                                                 args.precision, args.channels_last)
        record["parameters"] = sum(p.numel() for p in net.parameters())
        net.train()
        record["train_step_s"] = timed(train_step, args.warmup, args.iters, device)
        net.eval()
        record["infer_step_s"] = timed(infer_step, args.warmup, args.iters, device)
        record["fits"] = True
    except torch.cuda.OutOfMemoryError:
        record["fits"] = False
    record["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(record), flush=True)


def run_on_cpu(args, record, model_cfg, run_cfg, size):
    """The same steps on the CPU: times, and the allocation peaks of one step of each."""
    torch.set_num_threads(args.threads)
    record["threads"] = args.threads
    train_step, infer_step, net = make_steps(model_cfg, run_cfg, size, args.dims,
                                             torch.device("cpu"), args.precision,
                                             args.channels_last)
    record["parameters"] = sum(p.numel() for p in net.parameters())
    net.train()
    record["train_step_s"] = timed(train_step, args.warmup, args.iters, torch.device("cpu"))
    record["train_peak_mib"] = allocation_peak_mib(train_step)
    net.eval()
    record["infer_step_s"] = timed(infer_step, args.warmup, args.iters, torch.device("cpu"))
    record["infer_peak_mib"] = allocation_peak_mib(infer_step)
    print(json.dumps(record), flush=True)


def held_before_step_mib(net, size, dims):
    """What a training step starts from: parameters, gradients, AdamW's two moments, input
    (2 channels) and target (1), float (bench_scaling's parameters + optimizer_state + other)."""
    parameters = sum(p.numel() for p in net.parameters())
    return (4 * parameters + 3 * size ** dims) * 4 / 2**20


def train_peak_total_mib(args, model_cfg, run_cfg, size):
    """The whole of what one steady training step holds at its peak (MiB), or None if the step
    runs out of memory."""
    device = torch.device(args.device)
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            train_step, _, net = make_steps(model_cfg, run_cfg, size, args.dims, device,
                                            args.precision, args.channels_last)
            train_step()  # the optimizer's state exists from here on
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            train_step()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        train_step, _, net = make_steps(model_cfg, run_cfg, size, args.dims, device,
                                        args.precision, args.channels_last)
        train_step()
        return held_before_step_mib(net, size, args.dims) + allocation_peak_mib(train_step)
    except (torch.cuda.OutOfMemoryError, MemoryError, RuntimeError) as error:
        if "out of memory" not in str(error).lower() and not isinstance(error, MemoryError):
            raise
        return None


def capacity(args, model_cfg, run_cfg):
    """The largest cube edge (a multiple of 2^depth) whose training step fits --capacity-mib
    (or, on a GPU with --capacity-mib 0, the device): doubling from --size, then bisection."""
    multiple = 2 ** int(model_cfg.get("depth", 4))
    fits = {}

    def probe(edge):
        if edge not in fits:
            peak = train_peak_total_mib(args, model_cfg, run_cfg, edge)
            fits[edge] = peak if peak is not None and (
                args.capacity_mib <= 0 or peak <= args.capacity_mib) else None
            print(f"  edge {edge}: " + (f"{peak:.1f} MiB" if peak is not None else "out of memory"),
                  file=sys.stderr, flush=True)
        return fits[edge] is not None

    lo, hi = 0, None
    edge = max(multiple, int(args.size.split(",")[0]) // multiple * multiple)
    while hi is None:
        if probe(edge):
            lo, edge = edge, edge * 2
        else:
            hi = edge
    while hi - lo > multiple:
        mid = (lo + hi) // 2 // multiple * multiple
        if mid <= lo:
            break
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    record = {"peer": "pytorch_unet", "mode": "capacity", "device": args.device,
              "torch": torch.__version__, "config": args.config, "dims": args.dims,
              "precision": args.precision, "recompute": bool(model_cfg.get("recompute")),
              "channels_last": args.channels_last, "budget_mib": args.capacity_mib,
              "edge": lo, "voxels": lo ** args.dims,
              "peak_mib": round(fits[lo], 1) if lo else None}
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
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (--device cpu)")
    parser.add_argument("--precision", choices=("float", "bf16"), default="float",
                        help="bf16: torch.autocast(bfloat16), AMP")
    parser.add_argument("--recompute", action="store_true",
                        help="torch.utils.checkpoint per U-Net level (model.recompute)")
    parser.add_argument("--channels-last", action="store_true",
                        help="channels-last memory format for the model and input")
    parser.add_argument("--capacity-mib", type=float, default=None,
                        help="print the largest cube whose training step holds at most this "
                             "much (0 on a GPU: what fits the device), starting from --size")
    add_heap_option(parser)
    args = parser.parse_args()
    keep_heap(args, args.device)
    torch.backends.cudnn.benchmark = True
    model_cfg, run_cfg = load_run_config(args.config)
    if args.recompute:
        model_cfg = dict(model_cfg, recompute=True)
    if args.capacity_mib is not None:
        torch.set_num_threads(args.threads)
        return capacity(args, model_cfg, run_cfg or {})
    for size in (int(s) for s in args.size.split(",")):
        for tf32 in (False, True) if args.device == "cuda" else (False,):
            run(args, model_cfg, run_cfg or {}, size, tf32)


if __name__ == "__main__":
    main()
