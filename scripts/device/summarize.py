#!/usr/bin/env python3
"""One short line per JSON line of scripts/device/bench.sh's bench.jsonl: which program and
path, the step (and forward or inference) time, the rate and the peak memory, so the device
tool's reply (the end of the output) carries the figures.

    python3 scripts/device/summarize.py OUT/bench.jsonl
"""
import json
import sys


def line(r):
    path = r.get("cudnn_api") or "default"
    if r.get("cudnn_layout") == "channels_last":
        path += "_cl"
    if "ops" in r:  # bench_memory_ops and its peer: GB/s per op, forward / backward
        ops = " ".join("%s %.0f/%.0f" % (o["op"].split()[0], o["forward_gbytes_per_s"],
                                         o["backward_gbytes_per_s"]) for o in r["ops"])
        ceiling = " ceiling %.0f" % r["copy_gbytes_per_s"] if "copy_gbytes_per_s" in r else ""
        return "%-22s GB/s%s %s" % (r.get("peer", "bench_memory_ops"), ceiling, ops)
    if "peer" in r:
        keys = [k for k in ("tf32", "deterministic", "channels_last", "bf16_autocast",
                            "recompute") if r.get(k)]
        if r.get("precision", "float") != "float":
            keys.append(r["precision"])
        if r.get("dtype") and r["dtype"] != "float32":
            keys.append(r["dtype"])
        if "tokens" in r:
            keys.append("%s tokens" % r["tokens"])
        if r.get("mode") == "capacity":
            figures = "largest edge %s (%s MiB of %s)" % (r["edge"], r["peak_mib"], r["budget_mib"])
        elif "step_ms" in r:
            figures = "step %s ms %s GFLOP/s" % (r["step_ms"], r.get("gflops"))
        else:
            figures = "step %.2f ms infer %.2f ms" % (r.get("train_step_s", 0) * 1e3,
                                                      r.get("infer_step_s", 0) * 1e3)
        return "%-22s %-28s %s peak %s MiB" % (r["peer"], ",".join(keys) or "fp32", figures,
                                                r.get("peak_mib"))
    if r.get("bench") == "conv3d":
        return "%-22s %-28s step %.2f ms fwd %.2f ms %.0f GFLOP/s peak %s MiB" % (
            "bench_conv", path + " tf32 " + r.get("tf32", "?"), r["step_median_s"] * 1e3,
            r["forward_s"] * 1e3, r["gflops_per_core"], r.get("step_peak_mib", "?"))
    if r.get("bench") == "attention":
        return ("%-22s %-28s fwd %.1f ms fwd+bwd %.1f ms wait %.1f %% check %.2g step %s MiB "
                "ring %s MiB") % (
            "bench_attention", "%s tokens %s rk tf32 %s bf16 %s" % (
                r["tokens"], r.get("ranks", 1), r.get("tf32"), r.get("bf16", False)),
            r["ms_forward"], r["ms_forward_backward"], 100 * r.get("wait_fraction", 0),
            r["check_error"], r["tracked_step_mib"], r.get("ring_mib", "?"))
    if r.get("bench") == "halo":
        return "%-22s %-28s %s" % ("bench_halo", "%s rk %s periodic %s" % (
            r["ranks"], r["grid"], r["periodic"]), "; ".join(
                "width %s: %.1f us float, %.1f us bf16 (x%.2f), %.2f GB/s" % (
                    w["width"], w["halo_s"] * 1e6, w.get("bf16_s", 0) * 1e6,
                    w.get("bf16_speedup") or 0, w["gbytes_per_s"]) for w in r["per_width"]))
    if r.get("bench") == "scaling":
        peak = r.get("peak_mib", {})
        return "%-22s %-28s size %s step %.2f ms infer %.2f ms peak %.0f MiB fits %s" % (
            "bench_scaling", "%s %s tf32 %s" % (path, r.get("precision"), r.get("tf32")),
            r.get("global", ["?"])[0], r["train_step_s"] * 1e3, r.get("infer_step_s", 0) * 1e3,
            peak.get("total", 0) if isinstance(peak, dict) else peak, r.get("fits"))
    return json.dumps(r)[:200]


for text in open(sys.argv[1]):
    try:
        print(line(json.loads(text)))
    except (ValueError, KeyError, TypeError) as error:
        print("unreadable (%s): %s" % (error, text[:160].strip()))
