#!/usr/bin/python3
"""PyTorch interop: models built in PyTorch (tools/shardtensor_torch.py), exported with
tools/export_pytorch.py, give the same outputs in `shardtensor infer` on 1 and 2 ranks.

    /usr/bin/python3 tests/pytorch_equivalence.py --cli build/bin/shardtensor --source .

Each case: a run config, a seeded random model (norm affine parameters and BatchNorm running
statistics randomized too, evaluation mode), exported, a random input HDF5 file, `shardtensor
infer` on 1 and 2 ranks, and the relative L2 error against PyTorch's output (computed in
float64 with the same weights): <= 1e-5 for float, <= 1e-12 for double. Then checks that the
comparison can fail (a perturbed weight is detected) and that the exporter refuses bad
state_dicts and configs with messages naming the problem. Prints one line per result and
"pytorch equivalence test passed" at the end; any failure exits non-zero.
"""

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
import yaml

RESULTS = []


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


# ---------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------

CASES = [
    {
        "name": "unet2d_group_maxpool_transpose",
        "dims": 2, "in": 2, "out": 1, "extent": [32, 32], "samples": 2,
        "model": {"type": "unet", "depth": 2, "base_channels": 8, "norm": "group",
                  "norm_groups": 4, "activation": "relu", "down": "maxpool",
                  "up": "transpose", "padding": "zeros", "blocks": 2},
        "export": "cli",
    },
    {
        "name": "unet3d_batch_conv_linear_periodic_skip",
        "dims": 3, "in": 1, "out": 2, "extent": [16, 16, 16], "samples": 1,
        "model": {"type": "unet", "depth": 2, "base_channels": 4, "norm": "batch",
                  "activation": "gelu", "down": "conv", "up": "linear", "padding": "periodic",
                  "blocks": 1, "input_skip": True},
        "export": "module",  # a whole pickled module: the exporter also runs and compares it
        "grid2": [1, 2, 1],
    },
    {
        "name": "unet1d_layer_avgpool_nearest_reflect",
        "dims": 1, "in": 3, "out": 1, "extent": [64], "samples": 2,
        "model": {"type": "unet", "depth": 3, "base_channels": 4, "norm": "layer",
                  "activation": "silu", "down": "avgpool", "up": "nearest",
                  "padding": "reflect", "blocks": 2},
        "export": "function",
    },
    {
        "name": "unet2d_none_linear_replicate_double",
        "dims": 2, "in": 1, "out": 1, "extent": [16, 24], "samples": 1,
        "model": {"type": "unet", "depth": 2, "base_channels": 4, "norm": "none",
                  "activation": "leaky_relu", "down": "avgpool", "up": "linear",
                  "padding": "replicate", "blocks": 2},
        "precision": "double", "export": "cli", "grid2": [1, 2],
    },
    {
        "name": "sequential2d_residual_norms_pools",
        "dims": 2, "in": 2, "out": 1, "extent": [32, 32], "samples": 2,
        "input_name": "fields",
        "model": {"type": "sequential", "seed": 3, "layers": [
            {"type": "conv", "out_channels": 8, "kernel": 3, "padding": "same",
             "padding_mode": "periodic"},
            {"type": "group_norm", "groups": 4},
            {"type": "activation", "function": "gelu"},
            {"type": "residual", "layers": [
                {"type": "conv", "out_channels": 12, "kernel": 3, "padding": "same",
                 "padding_mode": "reflect"},
                {"type": "batch_norm"},
                {"type": "activation", "function": "silu"}]},
            {"type": "pool", "kind": "max", "kernel": 2},
            {"type": "conv", "kernel": 3, "dilation": 2, "padding": "same", "groups": 4,
             "padding_mode": "replicate", "bias": False},
            {"type": "layer_norm", "eps": 1.0e-4},
            {"type": "activation", "function": "leaky_relu", "slope": 0.2},
            {"type": "upsample", "scale": 2, "mode": "linear"},
            {"type": "conv", "out_channels": 8, "kernel": [3, 1], "padding": [1, 0]},
            {"type": "pool", "kind": "average", "kernel": 3, "stride": 1, "padding": 1},
            {"type": "dropout", "p": 0.3},
            {"type": "conv_transpose", "out_channels": 8, "kernel": 3, "padding": 1,
             "groups": 2},
            {"type": "activation", "function": "tanh"},
            {"type": "conv", "kernel": 1}]},
        "export": "cli",
    },
    {
        "name": "sequential3d_strided_periodic_pools",
        "dims": 3, "in": 1, "out": 1, "extent": [16, 16, 16], "samples": 1,
        "model": {"type": "sequential", "layers": [
            {"type": "conv", "out_channels": 4, "kernel": 3, "stride": 2, "padding": 1},
            {"type": "batch_norm", "affine": False, "momentum": 0.2},
            {"type": "activation", "function": "sigmoid"},
            {"type": "pool", "kind": "max", "kernel": 3, "stride": 1, "padding": 1,
             "padding_mode": "periodic"},
            {"type": "pool", "kind": "average", "kernel": 3, "stride": 1, "padding": 1,
             "padding_mode": "periodic"},
            {"type": "group_norm", "groups": 2, "affine": False},
            {"type": "conv_transpose", "out_channels": 4, "kernel": 2, "stride": 2},
            {"type": "upsample", "scale": [2, 1, 2], "mode": "nearest"},
            {"type": "conv", "out_channels": 4, "kernel": 3, "stride": [2, 1, 2], "padding": 1},
            {"type": "activation", "function": "relu"},
            {"type": "conv", "kernel": 1}]},
        "export": "function", "use_config_flag": True,
    },
]


def run_config(case):
    precision = case.get("precision", "float")
    config = {
        "run_dir": "runs/" + case["name"],
        "data": {"path": "unused.h5", "input": case.get("input_name", "input"),
                 "target": "target", "periodic": False},
        "model": case["model"],
        "training": {"precision": precision},
    }
    return config


def randomize(net, seed):
    """Seeded random weights; norm affine parameters and BatchNorm running stats too."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, (torch.nn.modules.conv._ConvNd,)):
                fan_in = module.weight[0].numel() if not isinstance(
                    module, torch.nn.modules.conv._ConvTransposeNd) else \
                    module.weight.shape[0] * int(np.prod(module.weight.shape[2:])) // \
                    module.groups
                module.weight.uniform_(-1, 1).mul_(np.sqrt(3.0 / fan_in))
                if module.bias is not None:
                    module.bias.normal_(0, 0.3)
            elif isinstance(module, (torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm)):
                if module.weight is not None:
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(0, 0.3)
                if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                    module.running_mean.normal_(0, 0.3)
                    module.running_var.uniform_(0.5, 1.5)
                    module.num_batches_tracked.fill_(7)
    net.eval()
    return net


def relative_l2(got, reference):
    return float(np.linalg.norm((got - reference).ravel()) /
                 max(np.linalg.norm(reference.ravel()), 1e-300))


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------

def sh(command, log, expect_fail=False, env=None):
    start = time.time()
    with open(log, "w") as out:
        rc = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if (rc != 0) != expect_fail:
        with open(log) as f:
            text = f.read()
        fail(f"{' '.join(command)} exited with {rc}:\n{text}")
    return time.time() - start


def infer(args, work, checkpoint, input_path, output_path, ranks, extra=()):
    command = args.mpirun + ["-n", str(ranks), "--oversubscribe", "--bind-to", "none",
                             args.cli, "infer", "--checkpoint", checkpoint, "--input",
                             input_path, "--output", output_path] + list(extra)
    sh(command, output_path + ".log")
    with h5py.File(output_path, "r") as f:
        return f["prediction"][...]


def run_case(args, work, st, exporter, case):
    name = case["name"]
    precision = case.get("precision", "float")
    dtype = np.float32 if precision == "float" else np.float64
    tolerance = 1e-5 if precision == "float" else 1e-12
    config = run_config(case)
    config_path = os.path.join(work, name + ".yaml")
    with open(config_path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)

    net = st.build_model(case["model"], case["dims"], case["in"], case["out"])
    randomize(net, seed=1000 + CASES.index(case))
    if precision == "double":
        net = net.double()
    state_path = os.path.join(work, name + ".pt")
    checkpoint = os.path.join(work, name + ".h5")
    mode = case["export"]
    torch.save(net if mode == "module" else net.state_dict(), state_path)
    if mode == "cli":
        sh([sys.executable, os.path.join(args.source, "tools", "export_pytorch.py"), "--config",
            config_path, "--state-dict", state_path, "--output", checkpoint],
           checkpoint + ".log")
    else:  # importable function; shape read from the state_dict
        exporter.export_checkpoint(config_path, state_path, checkpoint)
    with h5py.File(checkpoint, "r") as f:
        if f.attrs["precision"].decode() != precision:
            fail(f"{name}: checkpoint precision {f.attrs['precision']!r}")

    # Input in [samples, channels, spatial...], float32 (float64 for double).
    rng = np.random.default_rng(2000 + CASES.index(case))
    x = rng.standard_normal((case["samples"], case["in"], *case["extent"])).astype(dtype)
    input_path = os.path.join(work, name + "_input.h5")
    with h5py.File(input_path, "w") as f:
        f.create_dataset(config["data"]["input"], data=x)

    # Reference: PyTorch in float64 with the same weights on the same (stored) input.
    reference_net = copy.deepcopy(net).double().eval()
    with torch.no_grad():
        reference = reference_net(torch.from_numpy(x.astype(np.float64))).numpy()
        native = net(torch.from_numpy(x)).numpy()
    torch_error = relative_l2(native.astype(np.float64), reference)

    for ranks in (1, 2):
        extra = []
        if case.get("use_config_flag"):
            extra += ["--config", config_path]
        if ranks == 2 and case.get("grid2"):
            extra += ["--set", "parallel.grid=" + str(case["grid2"]).replace(" ", "")]
        output = infer(args, work, checkpoint, input_path,
                       os.path.join(work, f"{name}_out{ranks}.h5"), ranks, extra)
        if output.shape != reference.shape:
            fail(f"{name}: shardtensor output shape {output.shape}, PyTorch {reference.shape}")
        errors = [relative_l2(output[s].astype(np.float64), reference[s])
                  for s in range(output.shape[0])]
        error = max(errors)
        RESULTS.append((name, precision, ranks, error, torch_error))
        status = "ok" if error <= tolerance else "FAIL"
        print(f"{status}: {name} ({precision}) on {ranks} rank(s): max relative L2 error "
              f"{error:.3e} (PyTorch {precision} itself: {torch_error:.3e}; tolerance "
              f"{tolerance:g})", flush=True)
        if error > tolerance:
            fail(f"{name} on {ranks} ranks differs from PyTorch")
    return checkpoint, input_path, reference


def perturbation_check(args, work, exporter, checkpoint, input_path, reference):
    """The comparison can fail: one weight changed by 1e-3 is detected, first by the
    checkpoint's checksum (infer refuses the file), then, with the checksum updated to
    match, by the comparison itself."""
    perturbed = os.path.join(work, "perturbed.h5")
    shutil.copy(checkpoint, perturbed)
    with h5py.File(perturbed, "r+") as f:
        w = f["parameters/head.weight"]
        values = w[...]
        values.flat[0] += 1e-3
        w[...] = values
    log = os.path.join(work, "perturbed_refused.log")
    command = args.mpirun + ["-n", "1", "--oversubscribe", "--bind-to", "none", args.cli, "infer",
                             "--checkpoint", perturbed, "--input", input_path, "--output",
                             os.path.join(work, "never.h5")]
    sh(command, log, expect_fail=True)
    with open(log) as f:
        if "'parameters/head.weight' does not match its checksum" not in f.read():
            fail(f"infer of a checkpoint with a changed weight did not name the checksum: {log}")
    print("ok: a changed weight fails the checkpoint's checksum", flush=True)
    with h5py.File(perturbed, "r+") as f:
        f["parameters/head.weight"].attrs["checksum"] = np.array([exporter._checksum(values)],
                                                                  dtype=np.uint64)
    output = infer(args, work, perturbed, input_path, os.path.join(work, "perturbed_out.h5"), 1)
    error = max(relative_l2(output[s].astype(np.float64), reference[s])
                for s in range(output.shape[0]))
    if not error > 1e-5:
        fail(f"a perturbed weight (head.weight[0] + 1e-3) went unnoticed: relative error "
             f"{error:.3e}")
    print(f"ok: perturbed head.weight[0] by 1e-3 is detected: relative L2 error {error:.3e} "
          f"> 1e-5", flush=True)


def refusal_checks(args, work, st, exporter):
    """The exporter refuses mismatched state_dicts and configs, naming the problem."""
    model = CASES[0]["model"]
    net = randomize(st.build_model(model, 2, 2, 1), 5)
    config = os.path.join(work, CASES[0]["name"] + ".yaml")
    out = os.path.join(work, "refused.h5")

    def expect_error(what, *fragments, state=None, cfg=None, **kwargs):
        try:
            exporter.export_checkpoint(cfg or config, state if state is not None else
                                       net.state_dict(), out, **kwargs)
        except (exporter.ExportError, st.ConfigError) as e:
            message = str(e)
            for fragment in fragments:
                if fragment not in message:
                    fail(f"refusal '{what}': message lacks {fragment!r}:\n{message}")
            if os.path.exists(out):
                fail(f"refusal '{what}' left {out} behind")
            print(f"ok: refused {what}: {message.splitlines()[0]}"
                  + (f" | {message.splitlines()[1].strip()}" if len(message.splitlines()) > 1
                     else ""), flush=True)
            return
        fail(f"the exporter accepted {what}")

    sd = net.state_dict()
    missing = {k: v for k, v in sd.items() if k != "up0.norm1.bias"}
    expect_error("a missing parameter", "missing: 'up0.norm1.bias'", state=missing)
    extra = dict(sd)
    extra["head.scale"] = torch.ones(1)
    expect_error("an extra tensor", "extra: 'head.scale'", state=extra)
    swapped = dict(sd)
    swapped["down1.conv0.weight"] = sd["down1.conv0.weight"].transpose(0, 1).contiguous()
    expect_error("a transposed conv weight", "wrong shape: 'down1.conv0.weight'",
                 "swapped", state=swapped)
    layer_norm = dict(sd)
    layer_norm["down0.norm0.weight"] = torch.ones(8, 32, 32)
    expect_error("an nn.LayerNorm-style affine", "wrong shape: 'down0.norm0.weight'",
                 "nn.GroupNorm(1, C)", state=layer_norm)
    expect_error("a wrong channel count", "wrong shape: 'head.weight'", out_channels=3)
    expect_error("an unsupported model type", "'fno'", "unet' and 'sequential'",
                 cfg={"model": {"type": "fno"}})
    expect_error("an unknown config key", "unknown key 'base_chanels'",
                 cfg={"model": {"type": "unet", "base_chanels": 8}})
    expect_error("an unknown option value", "model.up", "'bicubic'",
                 cfg={"model": dict(model, up="bicubic")})
    # A whole module whose weights fit but whose layers differ (nearest instead of transpose
    # is a different parameter set; linear vs nearest has the same parameters).
    linear = dict(model, up="linear")
    a = randomize(st.build_model(dict(model, up="nearest"), 2, 2, 1), 6)
    expect_error("a module that computes something else", "compute different outputs",
                 state=a, cfg={"model": linear})
    # The CLI: non-zero exit and the message.
    state_path = os.path.join(work, "missing.pt")
    torch.save(missing, state_path)
    log = os.path.join(work, "refused_cli.log")
    sh([sys.executable, os.path.join(args.source, "tools", "export_pytorch.py"), "--config",
        config, "--state-dict", state_path, "--output", out], log, expect_fail=True)
    with open(log) as f:
        text = f.read()
    if "export_pytorch: error:" not in text or "up0.norm1.bias" not in text:
        fail(f"the CLI's refusal does not name the parameter:\n{text}")
    print("ok: the CLI exits non-zero on a missing parameter and names it", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="the shardtensor executable")
    parser.add_argument("--source", required=True, help="the repository root")
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    args.mpirun = args.mpirun.split()
    args.cli = os.path.abspath(args.cli)
    sys.path.insert(0, os.path.join(args.source, "tools"))
    import shardtensor_torch as st  # noqa: E402
    import export_pytorch as exporter  # noqa: E402

    start = time.time()
    work = tempfile.mkdtemp(prefix="shardtensor_torch_")
    try:
        first = None
        for case in CASES:
            result = run_case(args, work, st, exporter, case)
            first = first or result
        perturbation_check(args, work, exporter, *first)
        refusal_checks(args, work, st, exporter)
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\nsummary: max relative L2 error of shardtensor infer vs PyTorch (float64 "
          "reference)")
    for name, precision, ranks, error, torch_error in RESULTS:
        print(f"  {name:45s} {precision:6s} ranks {ranks}: {error:.3e}")
    print(f"pytorch equivalence test passed ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main()
