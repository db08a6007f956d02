#!/usr/bin/python3
"""ctest scaling_smoke: runs tools/scaling.py at a small size on 1 and 2 ranks (strong and weak,
overlap on and off; then a capacity search under a small budget) and checks that what it writes
is well-formed: every JSON line parses and has the expected keys, the Markdown has one table
row per run, and the PNG exists when matplotlib is installed. Prints "scaling smoke test
passed" on success.

    /usr/bin/python3 bench/scaling_smoke.py --bench build/bench/bench_scaling --out /tmp/smoke
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH_KEYS = {"bench", "model", "ranks", "grid", "global", "cells", "cells_per_rank", "overlap",
              "train_step_s", "train_step_cpu_s", "infer_step_s", "infer_step_cpu_s",
              "train_halo_fraction", "train_collective_fraction", "infer_halo_fraction",
              "infer_collective_fraction", "peak_mib", "peak_rss_mib", "base_rss_mib", "fits",
              "size_multiple", "load_average", "mode"}
MEMORY_KEYS = {"total", "parameters", "optimizer_state", "activations", "workspaces",
               "comm_buffers", "other"}


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def drive(args, out, extra):
    if os.path.isdir(out):
        shutil.rmtree(out)
    command = [sys.executable, os.path.join(ROOT, "tools", "scaling.py"), "--bench", args.bench,
               "--config", os.path.join(HERE, "scaling_unet3d.yaml"), "--mpirun", args.mpirun,
               "--ranks", "1,2", "--out", out, "--timeout", "120"] + extra
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True)
    print(done.stdout)
    check(done.returncode == 0, "scaling.py exited %d" % done.returncode)
    records = []
    with open(os.path.join(out, "results.jsonl")) as f:
        for line in f:
            records.append(json.loads(line))  # raises (fails the test) on a malformed line
    with open(os.path.join(out, "scaling.md")) as f:
        markdown = f.read()
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    png = os.path.join(out, "scaling.png")
    if has_matplotlib:
        check(os.path.getsize(png) > 1000, "no PNG although matplotlib is installed")
    else:
        check("Plot skipped" in markdown, "the Markdown does not say the plot was skipped")
    return records, markdown


def table_rows(markdown, heading):
    """Data rows of the first table after `heading`."""
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table[2:]  # header and separator


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    records, markdown = drive(args, os.path.join(args.out, "both"), [
        "--mode", "both", "--size", "16", "--size-per-rank", "8x16x16", "--iters", "1",
        "--warmup", "0", "--overlap", "both"])
    check(len(records) == 8, "expected 8 runs (2 modes x 2 rank counts x 2 overlaps), got %d"
          % len(records))
    for r in records:
        missing = BENCH_KEYS - set(r)
        check(not missing, "JSON line lacks %s" % sorted(missing))
        check(MEMORY_KEYS <= set(r["peak_mib"]), "peak_mib lacks categories: %s" % r["peak_mib"])
        check(r["fits"] and r["train_step_s"] > 0 and r["infer_step_s"] > 0,
              "bad times in %s" % r)
        check(0 <= r["train_halo_fraction"] <= 1 and 0 <= r["train_collective_fraction"] <= 1,
              "communication fractions outside [0, 1]: %s" % r)
        check(r["peak_mib"]["activations"] > 0 and r["peak_mib"]["parameters"] > 0,
              "no activations or parameters tracked: %s" % r["peak_mib"])
        check("train_efficiency" in r, "no efficiency in %s" % r)
        if r["ranks"] == 2:
            check(r["train_halo_fraction"] > 0, "2 ranks but no halo time: %s" % r)
    strong = [r for r in records if r["mode"] == "strong"]
    weak = [r for r in records if r["mode"] == "weak"]
    check(all(r["global"] == [16, 16, 16] for r in strong), "strong: the field changed")
    check(sorted(r["global"][0] for r in weak) == [8, 8, 16, 16], "weak: the field did not grow")
    check(all(r["cells_per_rank"] == 8 * 16 * 16 for r in weak), "weak: cells per rank changed")
    # The input is drawn per global cell: the same field, hence the same loss (up to the
    # order of float sums), on any rank count and with the overlap on or off.
    losses = [r["loss"] for r in strong]
    check(max(losses) - min(losses) <= 1e-5 * abs(losses[0]), "strong: losses differ: %s" % losses)
    for heading, rows in (("## Strong scaling", 4), ("## Weak scaling", 4),
                          ("## Halo exchange overlapped", 4)):
        check(heading in markdown, "Markdown lacks '%s'" % heading)
        got = table_rows(markdown, heading)
        check(len(got) == rows, "'%s' has %d table rows, expected %d" % (heading, len(got), rows))

    # Capacity: a budget small enough that the search ends after a few small runs.
    records, markdown = drive(args, os.path.join(args.out, "capacity"), [
        "--mode", "capacity", "--budget-mib", "12", "--capacity-start", "16"])
    check(len(records) == 2, "expected 2 capacity results, got %d" % len(records))
    for r in records:
        check("error" not in r, "capacity search failed: %s" % r.get("error"))
        check(r["edge"] > 0 and r["edge"] % r["size_multiple"] == 0, "bad edge in %s" % r)
        check(r["peak_mib"]["total"] <= 12, "the largest cube is over the budget: %s" % r)
        first_over = r.get("first_failing_edge")
        check(first_over == r["edge"] + r["size_multiple"],
              "the search did not bracket the edge: %s .. %s" % (r["edge"], first_over))
    check(len(table_rows(markdown, "## Capacity")) == 2, "capacity table rows")
    print("scaling smoke test passed")


if __name__ == "__main__":
    main()
