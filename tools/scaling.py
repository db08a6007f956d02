#!/usr/bin/python3
"""Strong and weak scaling, overlap on/off and memory capacity of a model, from bench_scaling.

    source scripts/env.sh
    /usr/bin/python3 tools/scaling.py --bench build/bench/bench_scaling \\
        --config bench/scaling_unet3d.yaml --ranks 1,2,4 --mode strong --size 64
    /usr/bin/python3 tools/scaling.py ... --mode weak --size-per-rank 32
    /usr/bin/python3 tools/scaling.py ... --mode both --size 64 --size-per-rank 32 --overlap both
    /usr/bin/python3 tools/scaling.py ... --mode capacity --budget-mib 256 --ranks 1,2,4,8

Runs `mpirun -n P bench_scaling ...` for each rank count P and collects the bench's JSON line.

- strong: the same global field (--size) on every P. speedup = T(P0) / T(P) and parallel
  efficiency = P0 T(P0) / (P T(P)), P0 the smallest rank count given (normally 1).
- weak: a fixed field per rank (--size-per-rank); the global field grows with P along one
  axis (--grow-axis, default 0: the first), so an automatic decomposition gives every rank the
  same block and the same halo. Efficiency = T(P0) / T(P).
- both: strong and weak, one after the other.
- capacity: for each P, the largest cube (edge a multiple of the model's size multiple,
  2^depth for a U-Net) whose training step stays under --budget-mib of tracked memory per
  rank, found by a search over the edge; reports its voxels and their ratio to P0's.
- --overlap on|off|both: Conv overlaps its halo exchange with interior compute (on), or not;
  "both" runs every point twice and adds an on/off table.

Writes into --out: results.jsonl (one JSON object per bench run, plus the derived figures),
scaling.md (Markdown tables) and scaling.png (time and efficiency against ranks, or voxels
against ranks for capacity; skipped, with a message, when python3-matplotlib is missing).
Exits 1 if any bench run failed (what ran is still written).
Standard library only, plus matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional

MODES = ("strong", "weak")


def load_average() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def busy_fraction(seconds: float = 1.0) -> float:
    """Fraction of all cores' time spent busy over the next `seconds` (/proc/stat): taken just
    before a run, it is the other jobs' share of the machine, which the load average (a
    minute-long mean that counts this study's own ranks too) does not isolate."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return float("nan")
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def parse_extents(text: str, dims: int) -> List[int]:
    parts = [int(p) for p in text.lower().split("x")]
    return parts * dims if len(parts) == 1 else parts


def extents_text(extents: List[int]) -> str:
    return "x".join(str(e) for e in extents)


def mpi_environment() -> Dict[str, str]:
    """This process's environment plus what scripts/env.sh sets, for a caller that did not
    source it: one BLAS thread per rank, yielding when oversubscribed, OpenMPI as root."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


class Runner:
    """Runs bench_scaling under mpirun and returns its JSON line as a dict."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.env = mpi_environment()
        self.failures: List[str] = []

    def run(self, ranks: int, extents: List[int], overlap: str, extra: List[str] = (),
            iters: Optional[int] = None, warmup: Optional[int] = None) -> Optional[dict]:
        a = self.args
        command = ([a.mpirun, "-n", str(ranks)] + shlex.split(a.mpirun_args) +
                   [a.bench, "--config", a.config, "--size", extents_text(extents),
                    "--dims", str(len(extents)), "--channels-in", str(a.channels_in),
                    "--channels-out", str(a.channels_out), "--batch", str(a.batch),
                    "--warmup", str(a.warmup if warmup is None else warmup),
                    "--iters", str(a.iters if iters is None else iters),
                    "--overlap", overlap] +
                   (["--precision", a.precision] if a.precision else []) + list(extra))
        print("+ " + " ".join(shlex.quote(c) for c in command), flush=True)
        busy = busy_fraction(a.idle_check) if a.idle_check > 0 else float("nan")
        try:
            done = subprocess.run(command, env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True,
                                  timeout=a.timeout)
        except subprocess.TimeoutExpired:
            self.failures.append("timed out after %d s: %s" % (a.timeout, " ".join(command)))
            print("  timed out", flush=True)
            return None
        record = None
        for line in done.stdout.splitlines():
            line = line.strip()
            if line.startswith("{") and '"bench":"scaling"' in line:
                record = json.loads(line)
                record["busy_before"] = busy
        if done.returncode != 0 or record is None:
            tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
            self.failures.append("exit %d: %s\n%s" % (done.returncode, " ".join(command), tail))
            print("  failed (exit %d): %s" % (done.returncode, tail), flush=True)
            return None
        if record.get("fits", True) and record.get("train_step_s") is not None:
            print("  train %.4g s, infer %s s, grid %s, peak %.1f MiB/rank" % (
                record["train_step_s"], record.get("infer_step_s"), record["grid"],
                record["peak_mib"]["total"]), flush=True)
        else:
            print("  does not fit: peak %.1f MiB/rank" % record["peak_mib"]["total"], flush=True)
        return record


# --- strong and weak scaling ------------------------------------------------------------------

def scaling_runs(runner: Runner, mode: str, ranks: List[int], overlaps: List[str]) -> List[dict]:
    a = runner.args
    records = []
    for overlap in overlaps:
        for p in ranks:
            if mode == "strong":
                extents = parse_extents(a.size, a.dims)
            else:
                extents = parse_extents(a.size_per_rank, a.dims)
                extents[a.grow_axis] *= p
            r = runner.run(p, extents, overlap)
            if r is not None:
                r["mode"] = mode
                records.append(r)
        add_efficiency([r for r in records if r["overlap"] == overlap], mode)
    return records


def add_efficiency(records: List[dict], mode: str) -> None:
    """Speedup and efficiency against the smallest rank count, for training and inference, from
    wall time; and the same efficiency from CPU time (the largest over ranks), which other jobs
    on the cores inflate less: it says how evenly the work divides, not how fast it ran."""
    if not records:
        return
    base = min(records, key=lambda r: r["ranks"])
    for r in records:
        for step in ("train", "infer"):
            for clock, key in (("", "_step_s"), ("_cpu", "_step_cpu_s")):
                t0, t = base.get(step + key), r.get(step + key)
                if not t0 or not t:
                    continue
                speedup = t0 / t
                if not clock:
                    r[step + "_speedup"] = speedup
                r[step + clock + "_efficiency"] = \
                    speedup * base["ranks"] / r["ranks"] if mode == "strong" else speedup


# --- capacity ---------------------------------------------------------------------------------

def round_down(value: float, multiple: int) -> int:
    return int(value // multiple) * multiple


def predict_edge(points: List[tuple], budget_mib: float, dims: int) -> Optional[float]:
    """Edge whose tracked peak would equal the budget, with peak = a + b * edge^dims fitted to
    the two largest fitting runs (one run: b alone, which underestimates the edge)."""
    points = sorted(points)[-2:]
    if len(points) == 1:
        e, m = points[0]
        return e * (budget_mib / m) ** (1.0 / dims) if m > 0 else None
    (e1, m1), (e2, m2) = points
    b = (m2 - m1) / (e2 ** dims - e1 ** dims)
    a = m1 - b * e1 ** dims
    if b <= 0 or budget_mib <= a:
        return None
    return ((budget_mib - a) / b) ** (1.0 / dims)


def capacity_run(runner: Runner, p: int) -> dict:
    """The largest cube edge that trains on p ranks under the budget. The next edge comes from
    the tracked peaks of the runs that fit (predict_edge), rounded down to the model's size
    multiple, until a prediction fails to fit; then from bisection. Without a failing edge
    known, blind growth is by at most 2^(1/dims) (about twice the voxels), so a probe that does
    not fit allocates at most about twice the budget before the budget check stops it."""
    a = runner.args
    dims = a.dims
    # Two training steps: the second is the steady state, with the optimizer's state allocated
    # for the whole step.
    extra = ["--budget-mib", str(a.budget_mib), "--infer-iters", "0"]
    lo = hi = None  # largest edge known to fit, smallest known not to
    best, points, probes = None, [], 0
    predicting, predicted = True, False  # predicted: `edge` came from predict_edge
    edge = a.capacity_start  # a multiple of the model's size multiple (the bench says if not)
    while True:
        record = runner.run(p, [edge] * dims, "on", extra, iters=1, warmup=1)
        probes += 1
        if record is None:
            return {"ranks": p, "error": runner.failures[-1], "probes": probes}
        multiple = int(record.get("size_multiple", 1))
        if record["fits"]:
            lo, best = edge, record
            points.append((edge, record["peak_mib"]["total"]))
        else:
            hi = edge
            if predicted:  # the prediction was wrong: bisect from now on
                predicting = False
        if lo is None:
            if edge <= multiple:
                return {"ranks": p, "edge": 0, "voxels": 0, "probes": probes,
                        "grid": record["grid"], "peak_mib": record["peak_mib"]}
            edge, predicted = max(multiple, round_down(edge // 2, multiple)), False
            continue
        if hi is not None and hi - lo <= multiple:
            break
        lower = lo + multiple
        upper = hi - multiple if hi is not None else \
            max(lower, round_down(lo * 2 ** (1.0 / dims), multiple))
        guess = predict_edge(points, a.budget_mib, dims) if predicting else None
        predicted = guess is not None
        if guess is not None:
            edge = min(max(round_down(guess, multiple), lower),
                       hi - multiple if hi is not None else max(upper, round_down(guess, multiple)))
        else:
            edge = upper if hi is None else max(lower, round_down((lo + hi) / 2, multiple))
    best = dict(best)
    best.update({"mode": "capacity", "edge": lo, "voxels": lo ** dims, "probes": probes,
                 "first_failing_edge": hi})
    return best


# --- output -----------------------------------------------------------------------------------

def fmt(value, scale=1.0, digits=1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return "%.*f" % (digits, value * scale)


def global_text(r: dict) -> str:
    return "×".join(str(e) for e in r["global"])


def scaling_table(records: List[dict], mode: str) -> List[str]:
    """One row per run. Strong: speedup and efficiency; weak: efficiency only."""
    gains = ["speedup", "efficiency"] if mode == "strong" else ["efficiency"]
    header = (["ranks", "grid", "global field", "cells / rank", "overlap", "train ms",
               "train CPU ms"] + gains + ["train CPU efficiency", "infer ms"] +
              ["infer " + g for g in gains] +
              ["train halo %", "train collectives %", "peak MiB / rank", "activations MiB", "peak RSS MiB",
               "loss", "busy before", "load"])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in records:
        def gain(step):
            cells = [fmt(r.get(step + "_speedup"), digits=2)] if mode == "strong" else []
            return cells + [fmt(r.get(step + "_efficiency"), 100, 0) + " %"]
        loss = "%.7g" % r["loss"] if r.get("loss") is not None else "—"
        row = ([str(r["ranks"]), r["grid"], global_text(r), str(r["cells_per_rank"]),
                r["overlap"], fmt(r.get("train_step_s"), 1e3), fmt(r.get("train_step_cpu_s"), 1e3)]
               + gain("train") + [fmt(r.get("train_cpu_efficiency"), 100, 0) + " %",
                                  fmt(r.get("infer_step_s"), 1e3)] + gain("infer") +
               [fmt(r.get("train_halo_fraction"), 100), fmt(r.get("train_collective_fraction"), 100),
                fmt(r["peak_mib"]["total"]), fmt(r["peak_mib"]["activations"]),
                fmt(r.get("peak_rss_mib")), loss, fmt(r.get("busy_before"), 100, 0) + " %",
                fmt(r.get("load_average"))])
        lines.append("| " + " | ".join(row) + " |")
    return lines


def overlap_table(records: List[dict]) -> List[str]:
    """Training and inference step with the overlap on against off, at each point run both."""
    header = ["mode", "ranks", "global field", "train ms on", "train ms off", "off / on",
              "train CPU ms on", "train CPU ms off", "infer ms on", "infer ms off", "off / on"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    pairs: Dict[tuple, Dict[str, dict]] = {}
    for r in records:
        pairs.setdefault((r["mode"], r["ranks"], tuple(r["global"])), {})[r["overlap"]] = r
    for (mode, ranks, _), pair in pairs.items():
        if "on" not in pair or "off" not in pair:
            continue
        on, off = pair["on"], pair["off"]

        def ratio(key):
            return fmt(off[key] / on[key], digits=3) if on.get(key) and off.get(key) else "—"
        row = [mode, str(ranks), global_text(on)]
        row += [fmt(on.get("train_step_s"), 1e3), fmt(off.get("train_step_s"), 1e3),
                ratio("train_step_s"), fmt(on.get("train_step_cpu_s"), 1e3),
                fmt(off.get("train_step_cpu_s"), 1e3), fmt(on.get("infer_step_s"), 1e3),
                fmt(off.get("infer_step_s"), 1e3), ratio("infer_step_s")]
        lines.append("| " + " | ".join(row) + " |")
    return lines if len(lines) > 2 else []


def capacity_table(records: List[dict], budget_mib: float) -> List[str]:
    """One row per rank count: the largest cube, its voxels against the smallest rank count's,
    and how much of the budget it uses (the edge moves in steps of the size multiple, so a
    cube can fall well short of the budget)."""
    base_ranks = min(r["ranks"] for r in records)
    header = ["ranks", "grid", "largest cube", "voxels", "ratio to %d rank(s)" % base_ranks,
              "ideal", "peak MiB / rank", "budget used", "first cube over budget", "probes"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    fitted = [r for r in records if r.get("voxels")]
    base = min(fitted, key=lambda r: r["ranks"]) if fitted else None
    for r in records:
        if "error" in r:
            cells = ["error: " + r["error"].splitlines()[0][:120]] + [""] * (len(header) - 2)
            lines.append("| %d | %s |" % (r["ranks"], " | ".join(cells)))
            continue
        dims = len(r.get("global", [0, 0, 0]))
        cube = lambda edge: "%d^%d" % (edge, dims) if edge else "—"
        peak = r["peak_mib"]["total"] if r.get("edge") else None
        row = [str(r["ranks"]), r.get("grid", "—"), cube(r.get("edge")), str(r.get("voxels", 0)),
               fmt(r["voxels"] / base["voxels"] if base and r.get("voxels") else None, digits=2),
               "%g" % (r["ranks"] / base["ranks"]) if base else "—", fmt(peak),
               fmt(peak / budget_mib if peak else None, 100, 0) + " %",
               cube(r.get("first_failing_edge")), str(r.get("probes", 0))]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def plot(path: str, by_mode: Dict[str, List[dict]]) -> Optional[str]:
    """One column per mode: step time (log-log, with the ideal) above, efficiency below; for
    capacity, voxels against ranks with the linear ideal. Returns why it was skipped, or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "python3-matplotlib is not installed (scripts/install-deps.sh installs it)"
    modes = [m for m in by_mode if by_mode[m]]
    if not modes:
        return "no results to plot"
    rows = 1 if modes == ["capacity"] else 2
    fig, axes = plt.subplots(rows, len(modes), figsize=(5.5 * len(modes), 4.2 * rows),
                             squeeze=False)
    for column, mode in enumerate(modes):
        records = by_mode[mode]
        if mode == "capacity":
            fitted = sorted((r for r in records if r.get("voxels")), key=lambda r: r["ranks"])
            ax = axes[0][column]
            if fitted:
                ranks = [r["ranks"] for r in fitted]
                ax.plot(ranks, [r["voxels"] for r in fitted], "o-", label="largest cube")
                ax.plot(ranks, [fitted[0]["voxels"] * p / ranks[0] for p in ranks], "k--",
                        label="linear")
            ax.set(xlabel="ranks", ylabel="voxels", title="capacity under the memory budget")
            ax.legend()
            if rows == 2:
                axes[1][column].axis("off")
            continue
        for overlap in [o for o in ("on", "off") if any(r["overlap"] == o for r in records)]:
            subset = sorted((r for r in records if r["overlap"] == overlap),
                            key=lambda r: r["ranks"])
            ranks = [r["ranks"] for r in subset]
            for step, marker, color in (("train", "o", "C0"), ("infer", "s", "C1")):
                times = [r.get(step + "_step_s") for r in subset]
                if not any(times):
                    continue
                label = "%s (overlap %s)" % (step, overlap)
                style = marker + ("-" if overlap == "on" else "--")
                axes[0][column].plot(ranks, [t * 1e3 if t else float("nan") for t in times],
                                     style, color=color, label=label)
                axes[1][column].plot(ranks, [100 * (r.get(step + "_efficiency") or float("nan"))
                                             for r in subset], style, color=color, label=label)
                if step == "train" and overlap == "on":  # how evenly the work divides
                    axes[1][column].plot(
                        ranks, [100 * (r.get("train_cpu_efficiency") or float("nan"))
                                for r in subset], "x:", color="C2", label="train, from CPU time")
                if overlap == "on" and times[0]:
                    ideal = [times[0] * 1e3 * (ranks[0] / p if mode == "strong" else 1)
                             for p in ranks]
                    axes[0][column].plot(ranks, ideal, "k:", linewidth=1,
                                         label="ideal" if step == "train" else None)
        top, bottom = axes[0][column], axes[1][column]
        top.set_yscale("log")
        top.set(ylabel="ms per step", title="%s scaling" % mode)
        bottom.set(ylabel="parallel efficiency %", ylim=(0, 110))
        bottom.axhline(100, color="k", linestyle=":", linewidth=1)
        all_ranks = sorted({r["ranks"] for r in records})
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_ranks)
            ax.set_xticklabels([str(p) for p in all_ranks])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xlabel("ranks")
            ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="the bench_scaling executable")
    ap.add_argument("--config", required=True, help="run config with a model: section")
    ap.add_argument("--ranks", default="1,2", help="rank counts, e.g. 1,2,4")
    ap.add_argument("--mode", default="strong", choices=("strong", "weak", "both", "capacity"))
    ap.add_argument("--size", default="32", help="strong: global field, N or AxBxC")
    ap.add_argument("--size-per-rank", default="16", help="weak: field per rank, N or AxBxC")
    ap.add_argument("--grow-axis", type=int, default=0, help="weak: the axis that grows with P")
    ap.add_argument("--dims", type=int, default=3)
    ap.add_argument("--channels-in", type=int, default=2)
    ap.add_argument("--channels-out", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--overlap", default="on", choices=("on", "off", "both"))
    ap.add_argument("--precision", default="", choices=("", "float", "double", "bf16"),
                    help="training.precision for bench_scaling (default: the config's)")
    ap.add_argument("--budget-mib", type=float, default=0, help="capacity: per-rank budget")
    ap.add_argument("--capacity-start", type=int, default=32, help="capacity: first cube edge")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per bench run")
    ap.add_argument("--idle-check", type=float, default=1.0,
                    help="seconds of /proc/stat sampling before each run (0: none)")
    ap.add_argument("--out", default="scaling", help="output directory")
    a = ap.parse_args(argv)
    ranks = [int(p) for p in a.ranks.split(",") if p.strip()]
    if not ranks or min(ranks) < 1:
        ap.error("--ranks needs positive rank counts")
    if a.mode == "capacity" and a.budget_mib <= 0:
        ap.error("--mode capacity needs --budget-mib")
    if a.mode != "capacity" and a.dims not in (1, 2, 3):
        ap.error("--dims must be 1, 2 or 3")
    a.bench = os.path.abspath(a.bench)
    a.config = os.path.abspath(a.config)
    os.makedirs(a.out, exist_ok=True)

    runner = Runner(a)
    load_start, started = load_average(), time.time()
    by_mode: Dict[str, List[dict]] = {}
    overlaps = ["on", "off"] if a.overlap == "both" else [a.overlap]
    if a.mode == "capacity":
        by_mode["capacity"] = [capacity_run(runner, p) for p in ranks]
        fitted = [r for r in by_mode["capacity"] if r.get("voxels")]
        if fitted:
            base = min(fitted, key=lambda r: r["ranks"])
            for r in fitted:
                r["voxel_ratio"] = r["voxels"] / base["voxels"]
    else:
        for mode in (MODES if a.mode == "both" else (a.mode,)):
            by_mode[mode] = scaling_runs(runner, mode, ranks, overlaps)
    load_end = load_average()

    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        for records in by_mode.values():
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")

    first = next((r for rs in by_mode.values() for r in rs if "model" in r), {})
    md = ["# Scaling: %s" % os.path.basename(a.config), "",
          "Model `%s` (%s parameters, %s) from `%s`; %d input and %d output channel(s), batch %d."
          % (first.get("model", "?"), first.get("parameters", "?"), first.get("precision", "?"),
             os.path.relpath(a.config), a.channels_in, a.channels_out, a.batch),
          "Machine: %d cores; load average (1 min) %.2f at the start, %.2f at the end (%.0f s)."
          % (os.cpu_count() or 0, load_start, load_end, time.time() - started),
          "A cube fits if two training steps keep every rank's tracked memory under the budget."
          if a.mode == "capacity" else
          "Times: median of %d timed steps after %d warm-up, the slowest rank's." % (a.iters,
                                                                                     a.warmup),
          ""]
    for mode, records in by_mode.items():
        if mode == "capacity":
            md += ["## Capacity under %g MiB of tracked memory per rank" % a.budget_mib, ""]
            md += capacity_table(records, a.budget_mib) + [""]
            continue
        md += ["## %s scaling" % mode.capitalize(), ""]
        md += (["Global field %s on every rank count." % "×".join(
                    map(str, parse_extents(a.size, a.dims)))] if mode == "strong" else
               ["%s cells per rank; the global field grows along axis %d." %
                ("×".join(map(str, parse_extents(a.size_per_rank, a.dims))), a.grow_axis)]) + [""]
        md += scaling_table(records, mode) + [""]
    overlap_lines = overlap_table([r for m in MODES for r in by_mode.get(m, [])])
    if overlap_lines:
        md += ["## Halo exchange overlapped with interior compute: on against off", ""]
        md += overlap_lines + [""]
    png = os.path.join(a.out, "scaling.png")
    skipped = plot(png, by_mode)
    md += ["Plot: scaling.png" if skipped is None else "Plot skipped: %s" % skipped, ""]
    if runner.failures:
        md += ["## Failed runs", ""] + ["    " + f.splitlines()[0] for f in runner.failures]
    with open(os.path.join(a.out, "scaling.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    print("wrote %s/results.jsonl, %s/scaling.md%s" % (
        a.out, a.out, "" if skipped else ", " + png))
    if skipped:
        print("PNG skipped: " + skipped)
    return 1 if runner.failures else 0


if __name__ == "__main__":
    sys.exit(main())
