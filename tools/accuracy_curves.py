#!/usr/bin/python3
"""Validation error curves of one training run on several rank counts: the same model, data
and config must reach the same validation error whatever the rank count.

    source scripts/env.sh
    /usr/bin/python3 tools/accuracy_curves.py --cli build/bin/shardtensor \\
        --config examples/02_train_config/heat2d.yaml --ranks 1,2,4 --out build/accuracy

In --out: generates the heat-equation data the config reads (`shardtensor generate heat`, as
examples/02_train_config/run.sh does; --samples, --size, --dims), trains with
`mpirun -n P shardtensor train --config ... --set run_dir=runs/np<P>` for each P (--epochs
overrides training.epochs), and reads each run's metrics.csv (the trainer writes one row per
step; the last step of an epoch that validated carries val_loss and val_rel_l2). Writes
accuracy.md (per epoch: val_rel_l2 and val_loss of every rank count, and their largest
relative spread), accuracy.jsonl (one object per run and epoch) and accuracy.png (val_rel_l2
against epoch, one curve per rank count; skipped, with a message, without python3-matplotlib).
Standard library only, plus matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional


def load_average() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def run(command: List[str], env: Dict[str, str], cwd: str) -> None:
    print("+ " + " ".join(shlex.quote(c) for c in command), flush=True)
    subprocess.run(command, env=env, cwd=cwd, check=True)


def epoch_metrics(path: str) -> List[dict]:
    """Rows of metrics.csv that carry validation figures: one per validated epoch."""
    rows = []
    with open(path) as f:
        for row in csv.DictReader(f):
            if row.get("val_rel_l2"):
                rows.append({"epoch": int(row["epoch"]) + 1, "step": int(row["step"]),
                             "loss": float(row["loss"]), "val_loss": float(row["val_loss"]),
                             "val_rel_l2": float(row["val_rel_l2"])})
    return rows


def spread(values: List[float]) -> float:
    """Largest relative difference between the rank counts' values."""
    return (max(values) - min(values)) / max(abs(min(values)), 1e-300)


def plot(path: str, curves: Dict[int, List[dict]]) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "python3-matplotlib is not installed (scripts/install-deps.sh installs it)"
    fig, ax = plt.subplots(figsize=(6, 4.2))
    styles = ["o-", "s--", "^:", "v-.", "d-"]
    for i, (ranks, rows) in enumerate(sorted(curves.items())):
        ax.plot([r["epoch"] for r in rows], [100 * r["val_rel_l2"] for r in rows],
                styles[i % len(styles)], label="%d rank%s" % (ranks, "s" if ranks > 1 else ""),
                markersize=5 - i)
    ax.set(xlabel="epoch", ylabel="validation relative L2 error %", yscale="log",
           title="Same training on different rank counts")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", required=True, help="the shardtensor executable")
    ap.add_argument("--config", required=True, help="run config (data.path is read in --out)")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--out", default="accuracy", help="working and output directory")
    ap.add_argument("--epochs", type=int, default=0, help="override training.epochs (0: keep)")
    ap.add_argument("--dims", type=int, default=2, help="generated data: spatial dims")
    ap.add_argument("--size", type=int, default=32, help="generated data: cells per dim")
    ap.add_argument("--samples", type=int, default=160, help="generated data: samples")
    ap.add_argument("--data", default="heat2d.h5", help="file name the config's data.path reads")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none")
    a = ap.parse_args(argv)
    ranks = [int(p) for p in a.ranks.split(",") if p.strip()]
    cli, config = os.path.abspath(a.cli), os.path.abspath(a.config)
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    mpirun = lambda p: [a.mpirun, "-n", str(p)] + shlex.split(a.mpirun_args) + [cli]

    load_start = load_average()
    run(mpirun(min(2, max(ranks))) + ["generate", "heat", "--dims", str(a.dims), "--size",
                                      str(a.size), "--samples", str(a.samples), "--seed", "1",
                                      "--output", a.data, "--overwrite"], env, a.out)
    curves: Dict[int, List[dict]] = {}
    seconds: Dict[int, float] = {}
    for p in ranks:
        run_dir = "runs/np%d" % p
        overrides = ["--set", "run_dir=" + run_dir]
        if a.epochs > 0:
            overrides += ["--set", "training.epochs=%d" % a.epochs]
        t0 = time.time()
        run(mpirun(p) + ["train", "--config", config] + overrides, env, a.out)
        seconds[p] = time.time() - t0
        curves[p] = epoch_metrics(os.path.join(a.out, run_dir, "metrics.csv"))
        if not curves[p]:
            print("no validation rows in %s/metrics.csv" % run_dir)
            return 1

    with open(os.path.join(a.out, "accuracy.jsonl"), "w") as f:
        for p, rows in sorted(curves.items()):
            for r in rows:
                f.write(json.dumps(dict(r, ranks=p)) + "\n")

    epochs = sorted({r["epoch"] for rows in curves.values() for r in rows})
    by_epoch = {p: {r["epoch"]: r for r in rows} for p, rows in curves.items()}
    header = " | ".join("val_rel_l2 %% (%d)" % p for p in ranks)
    md = ["# Validation error on %s rank(s): %s" % (", ".join(map(str, ranks)),
                                                    os.path.basename(config)), "",
          "`shardtensor train --config %s` on each rank count (%s); data: `shardtensor generate "
          "heat --dims %d --size %d --samples %d --seed 1`. Load average (1 min) %.2f at the "
          "start, %.2f at the end. Training time: %s." % (
              os.path.relpath(config), "epochs from the config" if a.epochs <= 0 else
              "--set training.epochs=%d" % a.epochs, a.dims, a.size, a.samples, load_start,
              load_average(), ", ".join("%d rank(s) %.0f s" % (p, seconds[p]) for p in ranks)),
          "", "| epoch | %s | spread of val_rel_l2 | val_loss spread |" % header,
          "|" + " --- |" * (len(ranks) + 3)]
    for e in epochs:
        rows = [by_epoch[p].get(e) for p in ranks]
        if any(r is None for r in rows):
            continue
        md.append("| %d | %s | %.2e | %.2e |" % (
            e, " | ".join("%.4f" % (100 * r["val_rel_l2"]) for r in rows),
            spread([r["val_rel_l2"] for r in rows]), spread([r["val_loss"] for r in rows])))
    skipped = plot(os.path.join(a.out, "accuracy.png"), curves)
    md += ["", "Plot: accuracy.png" if skipped is None else "Plot skipped: " + skipped, ""]
    with open(os.path.join(a.out, "accuracy.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
