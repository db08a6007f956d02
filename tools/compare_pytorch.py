#!/usr/bin/python3
"""ShardTensor against PyTorch on the same CPU: the conv layer, the U-Net step, and memory.

    source scripts/env.sh
    /usr/bin/python3 tools/compare_pytorch.py --build build --ranks 1,2 --out build/pytorch

For each P in --ranks, ShardTensor runs on P MPI ranks (one thread each) and PyTorch in one
process with P threads (torch.set_num_threads(P), one inter-op thread): the same cores.

- conv: Conv3d (or Conv2d with --dims 2) C -> C channels, kernel 3, padding 1, bias, batch
  1, float, on an N^dims field (--conv-size, --channels), forward + backward (input and weight
  gradients) of sum(y): `bench/bench_conv` against torch.nn.Conv3d / Conv2d. Time: the best
  of --iters steps after one warm-up (bench_conv's rule); GFLOP/s per core = 3 passes x
  2 C^2 3^dims N^dims / time / P.
- unet: the training step (forward, MSE, backward, gradient-norm clipping, AdamW) and the
  eval-mode forward of the model in --config (default bench/scaling_unet3d.yaml) on an
  N^dims field (--unet-size, --dims) with --batch samples, 2 -> 1 channels (the main job's
  model: --dims 2 --unet-size 32 --batch 4 --config examples/02_train_config/heat2d.yaml):
  `bench/bench_scaling` against the same model built by
  tools/shardtensor_torch.py (same layers, same parameter count, checked). Time: the median of
  --iters steps after one warm-up (bench_scaling's rule).
- --precision bf16: ShardTensor's layers compute in bf16 (bench_conv / bench_scaling
  --precision bf16), PyTorch's forward runs under torch.autocast("cpu", torch.bfloat16) (AMP:
  oneDNN's bf16 kernels, AMX tiles where the CPU has them).
- memory: the peak resident set of the process (getrusage) less its resident set before the
  model or layer and the input were created: what the step itself needed, without the process
  base (MPI and Kokkos, or the PyTorch libraries), per rank for ShardTensor (the largest over
  ranks) and for the one PyTorch process. ShardTensor's tracked peak (all live Kokkos
  allocations, memory_tracker.hpp) is shown next to it.

- heap (--heap keep, the default): both sides keep large freed blocks in the C heap for
  reuse, so that a step does not fault its buffers' pages in again: ShardTensor's benchmarks
  call keep_freed_memory() (core/allocation_cache.hpp), the PyTorch worker sets the same two
  glibc mallopt values before it imports torch. With glibc's defaults (--heap release, how
  the columns before 2026-12-06 were measured) every PyTorch step maps its large buffers
  afresh, and on a VM whose page faults are slow (first touch at 0.28 GB/s on one EPYC VM)
  that cost, not the kernels, decides PyTorch's times.

Every measurement runs --repeats times (3), each in a fresh process (PyTorch: this script
with --worker), so each peak belongs to that measurement alone, ShardTensor's runs and
PyTorch's in turn (so that both sample the same minutes of a machine whose speed drifts);
the tables show the run with the median step time and the range over the runs. Writes
--out/results.jsonl and --out/comparison.md, and
exits 1 if a run failed or a record is malformed (missing or non-positive times, different
parameter counts), 77 without PyTorch, so it doubles as a smoke test
(`ctest -R pytorch_compare`).
Needs python3-torch and python3-yaml (Debian: run with /usr/bin/python3).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from glibc_heap import add_heap_option, keep_heap  # noqa: E402
from scaling import busy_fraction, fmt, load_average, mpi_environment  # noqa: E402


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


# --- the PyTorch side (runs in its own process: --worker) -------------------------------------

def torch_with_threads(a: argparse.Namespace):
    """Imports torch with a.threads intra-op threads and one inter-op thread, the heap as
    a.heap asks (keep_heap)."""
    keep_heap(a)
    threads = a.threads
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    if torch.get_num_threads() != threads:
        raise RuntimeError("torch runs %d threads, asked for %d" % (torch.get_num_threads(),
                                                                   threads))
    return torch


def torch_conv(a: argparse.Namespace) -> dict:
    torch = torch_with_threads(a)
    torch.manual_seed(1)
    base = peak_rss_mib()
    n, c, dims = a.size, a.channels, a.dims
    conv = (torch.nn.Conv3d if dims == 3 else torch.nn.Conv2d)(c, c, 3, padding=1, bias=True)
    x = torch.rand(1, c, *([n] * dims), requires_grad=True)
    best = forward_best = math.inf
    bf16 = a.precision == "bf16"
    for step in range(a.warmup + a.iters):
        conv.zero_grad(set_to_none=True)
        x.grad = None
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = conv(x)
        t1 = time.perf_counter()
        y.float().sum().backward()
        t2 = time.perf_counter()
        del y
        if step >= a.warmup:
            best, forward_best = min(best, t2 - t0), min(forward_best, t1 - t0)
    flops = 3 * 2.0 * c * c * 3 ** dims * n ** dims
    peak = peak_rss_mib()
    return {"framework": "pytorch", "bench": "conv%dd" % dims, "threads": a.threads, "size": n,
            "channels": c, "precision": a.precision, "step_s": best, "forward_s": forward_best,
            "gflops_per_core": flops / best / 1e9 / a.threads, "peak_rss_mib": peak,
            "base_rss_mib": base, "step_rss_mib": peak - base,
            "mkldnn": bool(torch.backends.mkldnn.is_available()), "heap": a.heap,
            "torch": torch.__version__}


def torch_unet(a: argparse.Namespace) -> dict:
    torch = torch_with_threads(a)
    import shardtensor_torch as st
    import statistics
    model_cfg, run_cfg, _ = st.load_config(a.config)
    run_cfg = run_cfg or {}
    optimizer_cfg = run_cfg.get("optimizer") or {}
    training_cfg = run_cfg.get("training") or {}
    if optimizer_cfg.get("type", "adamw") != "adamw" or training_cfg.get("loss", "mse") != "mse":
        raise RuntimeError("the PyTorch mirror times AdamW with the MSE loss only; %s asks for "
                           "optimizer %r, loss %r" % (a.config, optimizer_cfg.get("type"),
                                                      training_cfg.get("loss")))
    if training_cfg.get("precision", "float") != "float":
        raise RuntimeError("precision %r: only float is compared" % training_cfg["precision"])
    torch.manual_seed(1)
    base = peak_rss_mib()
    net = st.build_model(model_cfg, dims=a.dims, in_channels=2, out_channels=1)
    parameters = sum(p.numel() for p in net.parameters())
    opt = torch.optim.AdamW(net.parameters(), lr=float(optimizer_cfg.get("lr", 1e-3)),
                            weight_decay=float(optimizer_cfg.get("weight_decay", 0.0)))
    clip = float(training_cfg.get("clip_grad_norm", 0.0))
    n = a.size
    field = [n] * a.dims
    x, target = torch.rand(a.batch, 2, *field), torch.rand(a.batch, 1, *field)
    train, infer, loss = [], [], math.nan
    bf16 = a.precision == "bf16"
    if bf16:
        st.group_norm_in_float_under_cpu_autocast(net)
    net.train()
    for step in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = net(x)
        value = torch.nn.functional.mse_loss(out.float(), target)
        value.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        loss = float(value)
        del out, value
        if step >= a.warmup:
            train.append(time.perf_counter() - t0)
    net.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for step in range(a.warmup + a.iters):
            t0 = time.perf_counter()
            out = net(x)
            del out
            if step >= a.warmup:
                infer.append(time.perf_counter() - t0)
    peak = peak_rss_mib()
    return {"framework": "pytorch", "bench": "unet", "threads": a.threads, "size": n,
            "parameters": parameters, "precision": a.precision,
            "train_step_s": statistics.median(train),
            "infer_step_s": statistics.median(infer), "loss": loss, "peak_rss_mib": peak,
            "dims": a.dims, "batch": a.batch, "heap": a.heap,
            "base_rss_mib": base, "step_rss_mib": peak - base, "torch": torch.__version__}


# --- the driver ---------------------------------------------------------------------------------

class Runner:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.env = mpi_environment()
        self.failures: List[str] = []

    def json_line(self, command: List[str], marker: str) -> Optional[dict]:
        """Runs `command`; its last stdout line holding `marker`, parsed, or None (failure)."""
        print("+ " + " ".join(shlex.quote(c) for c in command), flush=True)
        busy = busy_fraction(self.a.idle_check) if self.a.idle_check > 0 else math.nan
        try:
            done = subprocess.run(command, env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True,
                                  timeout=self.a.timeout)
        except subprocess.TimeoutExpired:
            self.failures.append("timed out: " + " ".join(command))
            return None
        record = None
        for line in done.stdout.splitlines():
            if line.startswith("{") and marker in line:
                record = json.loads(line)
        if done.returncode != 0 or record is None:
            tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
            self.failures.append("exit %d: %s\n%s" % (done.returncode, " ".join(command), tail))
            print("  failed: " + tail, flush=True)
            return None
        record["busy_before"] = busy
        return record

    def mpirun(self, ranks: int, command: List[str]) -> List[str]:
        return [self.a.mpirun, "-n", str(ranks)] + shlex.split(self.a.mpirun_args) + command

    def worker(self, kind: str, threads: int, size: int) -> List[str]:
        return [sys.executable, os.path.abspath(__file__), "--worker", kind, "--threads",
                str(threads), "--size", str(size), "--channels", str(self.a.channels),
                "--iters", str(self.a.iters), "--warmup", "1", "--config", self.a.config,
                "--dims", str(self.a.dims), "--batch", str(self.a.batch), "--precision",
                self.a.precision, "--heap", self.a.heap]

    def median_record(self, records: List[Optional[dict]], key: str) -> Optional[dict]:
        """The record whose `key` is the median, with every run's `key` in `<key>_runs`, or
        None if a run failed."""
        if not records or not all(records):
            return None
        records = sorted(records, key=lambda r: r[key])
        median = dict(records[(len(records) - 1) // 2])  # the lower median of an even count
        median[key + "_runs"] = [r[key] for r in records]
        return median

    def alternated(self, ours: List[str], our_marker: str, theirs: List[str],
                   their_marker: str, key: str) -> Dict[str, Optional[dict]]:
        """Runs ShardTensor's command and PyTorch's in turn, --repeats times each, each run in
        a fresh process: ours, theirs, ours, theirs, ... so that both sides sample the same
        minutes of a machine whose speed drifts (a shared VM's moved by a third within
        minutes); the median record of each side (median_record)."""
        our_runs, their_runs = [], []
        for _ in range(self.a.repeats):
            our_runs.append(self.json_line(ours, our_marker))
            their_runs.append(self.json_line(theirs, their_marker))
        return {"shardtensor": self.median_record(our_runs, key),
                "pytorch": self.median_record(their_runs, key)}

    def conv(self, p: int) -> Dict[str, Optional[dict]]:
        a = self.a
        pair = self.alternated(
            self.mpirun(p, [os.path.join(a.build, "bench", "bench_conv"), "--dims", str(a.dims),
                            "--size", str(a.conv_size), "--channels", str(a.channels),
                            "--iters", str(a.iters), "--warmup", "1", "--precision",
                            a.precision]), '"bench":"conv%dd"' % a.dims,
            self.worker("conv", p, a.conv_size), '"bench": "conv%dd"' % a.dims, "step_s")
        ours = pair["shardtensor"]
        if ours:  # bench_conv's names for the peak resident set and the step's share of it
            ours["peak_rss_mib"] = ours["peak_mib_per_rank"]
            ours["base_rss_mib"] = ours["peak_mib_per_rank"] - ours["step_mib_per_rank"]
        return pair

    def unet(self, p: int) -> Dict[str, Optional[dict]]:
        a = self.a
        return self.alternated(
            self.mpirun(p, [os.path.join(a.build, "bench", "bench_scaling"), "--config",
                            a.config, "--size", str(a.unet_size), "--dims", str(a.dims),
                            "--batch", str(a.batch), "--iters", str(a.iters), "--warmup", "1",
                            "--precision", a.precision]), '"bench":"scaling"',
            self.worker("unet", p, a.unet_size), '"bench": "unet"', "train_step_s")


def check(kind: str, p: int, pair: Dict[str, Optional[dict]]) -> List[str]:
    """What is wrong with one comparison's records (empty: well-formed)."""
    problems = []
    times = {"conv": ("step_s", "forward_s"), "unet": ("train_step_s", "infer_step_s")}[kind]
    for side, record in pair.items():
        if record is None:
            problems.append("%s %s at %d: no record" % (kind, side, p))
            continue
        for key in times + ("peak_rss_mib", "base_rss_mib"):
            v = record.get(key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                problems.append("%s %s at %d: %s = %r" % (kind, side, p, key, v))
    if kind == "unet" and all(pair.values()):
        if pair["shardtensor"]["parameters"] != pair["pytorch"]["parameters"]:
            problems.append("unet at %d: %d parameters in ShardTensor, %d in PyTorch" % (
                p, pair["shardtensor"]["parameters"], pair["pytorch"]["parameters"]))
    tolerance = 1e-2 if pair["shardtensor"] and pair["shardtensor"].get("precision") == "bf16" \
        else 1e-5  # bench_conv's own bound
    if kind == "conv" and pair["shardtensor"] and \
            pair["shardtensor"].get("check_error", 1) > tolerance:
        problems.append("conv at %d: bench_conv's check failed" % p)
    return problems


def ratio(theirs: Optional[float], ours: Optional[float]) -> str:
    if not theirs or not ours:
        return "—"
    return "%.2f" % (theirs / ours)


def with_range(record: dict, key: str) -> str:
    """`key` in ms, with the range over the repeated runs: "320.7 (318.2–325.0)"."""
    runs = record.get(key + "_runs", [])
    text = fmt(record[key], 1e3)
    return text if len(runs) < 2 else "%s (%s–%s)" % (text, fmt(min(runs), 1e3),
                                                      fmt(max(runs), 1e3))


def step_rss(record: dict) -> float:
    return record["peak_rss_mib"] - record["base_rss_mib"]


# The two tables' columns: (header, cell from the ShardTensor and PyTorch records).
CONV_COLUMNS = [
    ("ShardTensor ms", lambda o, t: with_range(o, "step_s")),
    ("PyTorch ms", lambda o, t: with_range(t, "step_s")),
    ("PyTorch / ShardTensor", lambda o, t: ratio(t["step_s"], o["step_s"])),
    ("ShardTensor GFLOP/s per core", lambda o, t: fmt(o["gflops_per_core"])),
    ("PyTorch GFLOP/s per core", lambda o, t: fmt(t["gflops_per_core"])),
    ("ShardTensor forward ms", lambda o, t: fmt(o["forward_s"], 1e3)),
    ("PyTorch forward ms", lambda o, t: fmt(t["forward_s"], 1e3)),
    ("ShardTensor step MiB (RSS)", lambda o, t: fmt(step_rss(o))),
    ("ShardTensor step MiB (tracked)", lambda o, t: fmt(o.get("step_peak_mib"))),
    ("PyTorch step MiB (RSS)", lambda o, t: fmt(step_rss(t))),
]
UNET_COLUMNS = [
    ("field", lambda o, t: "%d%s" % (t["size"], "³" if t.get("dims", 3) == 3 else "²")),
    ("ShardTensor train ms", lambda o, t: with_range(o, "train_step_s")),
    ("PyTorch train ms", lambda o, t: with_range(t, "train_step_s")),
    ("PyTorch / ShardTensor", lambda o, t: ratio(t["train_step_s"], o["train_step_s"])),
    ("ShardTensor infer ms", lambda o, t: fmt(o["infer_step_s"], 1e3)),
    ("PyTorch infer ms", lambda o, t: fmt(t["infer_step_s"], 1e3)),
    ("PyTorch / ShardTensor", lambda o, t: ratio(t["infer_step_s"], o["infer_step_s"])),
    ("ShardTensor MiB (RSS)", lambda o, t: fmt(step_rss(o))),
    ("ShardTensor MiB (tracked)", lambda o, t: fmt(o["peak_mib"]["total"])),
    ("PyTorch MiB (RSS)", lambda o, t: fmt(step_rss(t))),
    ("PyTorch / ShardTensor", lambda o, t: ratio(step_rss(t), step_rss(o))),
]


def table(results: Dict[int, dict], kind: str, columns) -> List[str]:
    """A Markdown table: one row per rank count whose two records exist."""
    rows = ["| ranks = threads | " + " | ".join(h for h, _ in columns) + " |",
            "| --- |" + " --- |" * len(columns)]
    for p, r in results.items():
        ours, theirs = r[kind]["shardtensor"], r[kind]["pytorch"]
        if ours and theirs:
            rows.append("| %d | " % p + " | ".join(cell(ours, theirs) for _, cell in columns)
                        + " |")
    return rows


def tables(results: Dict[int, dict], dims: int, precision: str = "float") -> List[str]:
    suffix = "" if precision == "float" else ", bf16 (PyTorch: CPU autocast)"
    return (["## Conv%dd layer, forward + backward%s" % (dims, suffix), "",
             "Step times: the median run (range over the runs); the other columns are the "
             "median run's.", ""] + table(results, "conv", CONV_COLUMNS) +
            ["", "## U-Net training step and inference%s" % suffix, ""] +
            table(results, "unet", UNET_COLUMNS))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="build directory with bench/bench_conv "
                    "and bench/bench_scaling")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(HERE), "bench",
                                                     "scaling_unet3d.yaml"))
    ap.add_argument("--ranks", default="1,2", help="rank counts = PyTorch thread counts")
    ap.add_argument("--conv-size", type=int, default=64)
    ap.add_argument("--channels", type=int, default=32, help="conv channels")
    ap.add_argument("--unet-size", type=int, default=64)
    ap.add_argument("--dims", type=int, choices=(2, 3), default=3,
                    help="2: Conv2d and the U-Net on a 2-D field")
    ap.add_argument("--batch", type=int, default=1, help="U-Net samples per step")
    ap.add_argument("--precision", choices=("float", "bf16"), default="float",
                    help="bf16: ShardTensor in bf16, PyTorch under CPU autocast (AMP)")
    ap.add_argument("--iters", type=int, default=5, help="timed steps per run")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per measurement, each a fresh process; the median is reported")
    add_heap_option(ap)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument("--idle-check", type=float, default=1.0,
                    help="seconds of /proc/stat sampling before each run (0: none)")
    ap.add_argument("--out", default="pytorch")
    ap.add_argument("--worker", choices=("conv", "unet"), help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps((torch_conv if a.worker == "conv" else torch_unet)(a)), flush=True)
        return 0

    ranks = [int(p) for p in a.ranks.split(",") if p.strip()]
    if not ranks or min(ranks) < 1:
        ap.error("--ranks needs positive rank counts, got %r" % a.ranks)
    if a.conv_size < 4 or a.unet_size < 4 or a.channels < 1 or a.iters < 1 or a.repeats < 1:
        ap.error("--conv-size and --unet-size must be at least 4, --channels, --iters and "
                 "--repeats at least 1")
    for target in ("bench_conv", "bench_scaling"):
        if not os.access(os.path.join(a.build, "bench", target), os.X_OK):
            ap.error("%s/bench/%s is missing: build it first (cmake --build %s --target %s)"
                     % (a.build, target, a.build, target))
    try:
        importlib.import_module("torch")  # the workers import it: fail early, clearly, here
    except ImportError as e:
        print("compare_pytorch: PyTorch is not importable (%s); Debian: apt-get install "
              "python3-torch, then run with /usr/bin/python3" % e)
        return 77  # ctest's "skipped"
    a.config = os.path.abspath(a.config)
    os.makedirs(a.out, exist_ok=True)

    runner = Runner(a)
    load_start, started = load_average(), time.time()
    results = {p: {"conv": runner.conv(p), "unet": runner.unet(p)} for p in ranks}
    load_end = load_average()
    problems = [msg for p, r in results.items() for kind, pair in r.items()
                for msg in check(kind, p, pair)]

    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        for p, r in results.items():
            for kind, pair in r.items():
                for side, record in pair.items():
                    if record:
                        f.write(json.dumps(dict(record, ranks_or_threads=p, side=side,
                                                comparison=kind), sort_keys=True) + "\n")
    torch_version = next((pair["pytorch"].get("torch") for r in results.values()
                          for pair in r.values() if pair["pytorch"]), "?")
    power = "³" if a.dims == 3 else "²"
    md = ["# ShardTensor against PyTorch %s on the same CPU" % torch_version, "",
          "ShardTensor on P MPI ranks of one thread, PyTorch in one process of P threads. "
          "Conv%dd %d→%d, kernel 3, on %d%s; U-Net `%s` on %d%s, batch %d, 2 → 1 channels. "
          "Machine: %d cores; load average %.2f at the start, %.2f at the end (%.0f s). "
          "PyTorch's heap: %s." % (
              a.dims, a.channels, a.channels, a.conv_size, power, os.path.relpath(a.config),
              a.unet_size, power, a.batch, os.cpu_count() or 0, load_start, load_end,
              time.time() - started,
              "freed blocks kept, as ShardTensor's" if a.heap == "keep" else "glibc's defaults"),
          "Step MiB: peak resident set less the resident set before the layer or model and "
          "the input existed (per rank for ShardTensor, the largest over ranks).", ""]
    md += tables(results, a.dims, a.precision) + [""]
    if problems or runner.failures:
        md += ["## Problems", ""] + ["- " + m.splitlines()[0] for m in problems + runner.failures]
    with open(os.path.join(a.out, "comparison.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    if problems or runner.failures:
        return 1
    print("pytorch comparison complete: %d rank counts, records well-formed" % len(ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
