#!/usr/bin/python3
"""Convert a PyTorch state_dict into a ShardTensor checkpoint.

    /usr/bin/python3 tools/export_pytorch.py --config run.yaml --state-dict model.pt \\
        --output checkpoint.h5 [--input-channels N --output-channels M --dims D] \\
        [--precision float|double]
    mpirun -n 4 shardtensor infer --checkpoint checkpoint.h5 --input in.h5 --output out.h5

The model is described by the YAML `model` section ShardTensor builds (`type: unet` or
`type: sequential`, docs/models.md); the state_dict's keys must be ShardTensor's parameter
and buffer names (tools/shardtensor_torch.py builds PyTorch modules whose state_dict keys
are exactly these). Every parameter's shape is checked against the model the config builds;
a missing, extra or misshapen tensor stops the export with its name. The checkpoint holds
what `shardtensor infer` and `load_checkpoint` read (train/src/checkpoint.cpp): parameters,
buffers, normalization statistics (identity unless given), epoch/step 0, and a run config
(so `shardtensor infer --checkpoint` works without --config). See docs/pytorch.md.

Importable: `export_checkpoint(config, state_dict, output, ...)`.
Needs python3-torch, python3-h5py, python3-yaml (Debian: run with /usr/bin/python3).
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import sys
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import shardtensor_torch as st  # noqa: E402

FORMAT = "shardtensor-checkpoint-1"


class ExportError(ValueError):
    """The state_dict does not fit the model the config builds, or bad arguments."""


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------

def _load_state_dict(source) -> "tuple[Dict[str, torch.Tensor], Optional[nn.Module]]":
    """(state_dict, module or None) from a path, a module or a mapping."""
    module = None
    obj = source
    if isinstance(source, (str, os.PathLike)):
        obj = torch.load(source, map_location="cpu")
    if isinstance(obj, nn.Module):
        module = obj
        obj = obj.state_dict()
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping) and not torch.is_tensor(obj[key]):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping):
        raise ExportError(f"{source}: expected a state_dict (a mapping of names to tensors) or "
                          f"an nn.Module, got {type(obj).__name__}")
    out = collections.OrderedDict()
    for name, value in obj.items():
        if not torch.is_tensor(value):
            raise ExportError(f"state_dict entry '{name}' is a {type(value).__name__}, not a "
                              "tensor")
        out[str(name)] = value.detach().cpu()
    return out, module


def _load_config(config):
    """(model section, run config dict or None, text or None, source name)."""
    if isinstance(config, (str, os.PathLike)):
        model, run, text = st.load_config(str(config))
        return model, run, text, str(config)
    if isinstance(config, Mapping):
        config = dict(config)
        model = st.model_section(config, "config")
        return model, (config if "model" in config else None), None, "config"
    raise ExportError(f"config: expected a YAML path or a dict, got {type(config).__name__}")


def _statistics(values, channels, what, fill):
    if values is None:
        return np.full(channels, fill, dtype=np.float64)
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size != channels:
        raise ExportError(f"{what}: {array.size} values given, the model has {channels} "
                          "channels")
    if what.endswith("std") and np.any(array <= 0):
        raise ExportError(f"{what}: standard deviations must be positive, got {array.tolist()}")
    return array


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------

def _hint(name, got, expected):
    if len(got) == len(expected) >= 3 and got[0] == expected[1] and got[1] == expected[0]:
        return (" (the first two axes are swapped: Conv weights are (out, in/groups, k...), "
                "ConvTranspose weights (in, out/groups, k...), as in PyTorch)")
    if name.endswith((".weight", ".bias")) and len(expected) == 1 and len(got) > 1:
        return (" (ShardTensor's LayerNorm/GroupNorm affine is per channel, shape (C): use "
                "nn.GroupNorm(1, C), not nn.LayerNorm((C, ...)))")
    if len(got) == len(expected) and len(got) >= 3 and got[2:] != expected[2:]:
        return " (kernel sizes differ: check the config's kernel and dims)"
    return ""


def check_state_dict(state_dict: Mapping[str, torch.Tensor], params: Mapping[str, tuple],
                     buffers: Mapping[str, tuple], model_description: str):
    """Raises ExportError listing every missing, extra or misshapen tensor."""
    problems = []
    expected = collections.OrderedDict(list(params.items()) + list(buffers.items()))
    for name, shape in expected.items():
        if name not in state_dict:
            hint = ""
            if name.endswith(("running_mean", "running_var")):
                hint = (" (BatchNorm in evaluation uses its running statistics: build it with "
                        "track_running_stats=True)")
            elif name.endswith((".weight", ".bias")) and name in params and len(shape) == 1:
                hint = " (is the norm layer affine in both models?)"
            problems.append(f"missing: '{name}' {shape}{hint}")
        elif tuple(state_dict[name].shape) != tuple(shape):
            got = tuple(state_dict[name].shape)
            problems.append(f"wrong shape: '{name}' is {got}, the model expects {shape}"
                            + _hint(name, got, shape))
    for name in state_dict:
        if name not in expected:
            problems.append(f"extra: '{name}' {tuple(state_dict[name].shape)} is not a "
                            f"parameter or buffer of the model")
    if problems:
        raise ExportError(f"the state_dict does not match {model_description}:\n  "
                          + "\n  ".join(problems)
                          + "\n(ShardTensor's names: docs/pytorch.md; "
                            "tools/shardtensor_torch.py builds the matching PyTorch model)")


# ---------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------

def _run_config_text(model, run, text, precision, source):
    """The config stored in the checkpoint: the run config as written when it fits, else a
    run config holding the model section."""
    yaml = st._yaml()
    if run is not None:
        training = run.get("training") or {}
        data = run.get("data") or {}
        if training.get("precision", "float") == precision and data.get("path") and text:
            return text
        config = copy.deepcopy(run)
        config.setdefault("training", {})
        if config["training"] is None:
            config["training"] = {}
        config["training"]["precision"] = precision
        if config.get("data") is None:
            config["data"] = {}
        config["data"].setdefault("path", "data.h5")
        return (f"# Exported by tools/export_pytorch.py from {source} (precision {precision})\n"
                + yaml.safe_dump(config, sort_keys=False))
    body = {
        "data": {"path": "data.h5", "input": "input", "target": "target"},
        "model": model,
        "training": {"precision": precision},
    }
    return ("# Exported by tools/export_pytorch.py from the model in " + source + ".\n"
            "# data.path is not read by `shardtensor infer` (it reads --input).\n"
            + yaml.safe_dump(body, sort_keys=False))


def _string_attribute(h5, name, value):
    # Fixed-length ASCII, NUL-terminated, as ShardTensor writes its own string attributes.
    data = value.encode("utf-8")
    import h5py
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(data) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    h5.attrs.create(name, np.array(data + b"\0", dtype=f"S{len(data) + 1}"),
                    dtype=h5py.Datatype(tid))


def _checksum(values):
    """FNV-1a 64 over the values as little-endian float64: ShardTensor's per-dataset checksum
    (train/src/checkpoint.cpp), which load_checkpoint verifies."""
    h = 1469598103934665603
    for byte in np.ascontiguousarray(values, dtype="<f8").tobytes():
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def _text_checksum(text):
    """FNV-1a 64 over the text's UTF-8 bytes: the stored config's checksum."""
    h = 1469598103934665603
    for byte in text.encode():
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def _checked_dataset(h5, name, data):
    """A dataset and its checksum attribute."""
    h5.create_dataset(name, data=data)
    h5[name].attrs.create("checksum", np.array([_checksum(data)], dtype=np.uint64))


def write_checkpoint(path, params, buffers, precision, config_text, input_statistics,
                     target_statistics):
    """Writes the checkpoint atomically (temporary name, then rename)."""
    import h5py
    dtype = np.float32 if precision == "float" else np.float64
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with h5py.File(temporary, "w") as h5:
            for name, tensor in params.items():
                _checked_dataset(h5, "parameters/" + name,
                                 tensor.detach().cpu().numpy().astype(dtype))
            for name, tensor in buffers.items():  # 1-D, as save_checkpoint writes buffers
                _checked_dataset(h5, "buffers/" + name,
                                 tensor.detach().cpu().numpy().astype(dtype).reshape(-1))
            for prefix, (mean, std) in (("input", input_statistics),
                                        ("target", target_statistics)):
                _checked_dataset(h5, f"normalization/{prefix}_mean", mean.astype(np.float64))
                _checked_dataset(h5, f"normalization/{prefix}_std", std.astype(np.float64))
            _string_attribute(h5, "format", FORMAT)
            _string_attribute(h5, "checksums", "fnv1a64 of the values as float64")
            _string_attribute(h5, "precision", precision)
            h5.attrs.create("epoch", np.int64(0), dtype="<i8")
            h5.attrs.create("step", np.int64(0), dtype="<i8")
            h5.attrs.create("rng", np.zeros(3, dtype=np.uint64), dtype="<u8")
            _string_attribute(h5, "config", config_text)
            h5.attrs.create("config_checksum",
                            np.array([_text_checksum(config_text)], dtype=np.uint64))
            _string_attribute(h5, "exported_by", "tools/export_pytorch.py (PyTorch "
                              + torch.__version__ + ")")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def export_checkpoint(config: Union[str, Mapping], state_dict, output: str, *,
                      dims: Optional[int] = None, in_channels: Optional[int] = None,
                      out_channels: Optional[int] = None, precision: Optional[str] = None,
                      input_mean: Optional[Sequence[float]] = None,
                      input_std: Optional[Sequence[float]] = None,
                      target_mean: Optional[Sequence[float]] = None,
                      target_std: Optional[Sequence[float]] = None,
                      strip_prefix: Optional[str] = None,
                      rename: Optional[Callable[[str], Optional[str]]] = None,
                      verify: bool = True, verify_extent: int = 16) -> dict:
    """Writes `output`, a ShardTensor checkpoint of the model `config` describes with the
    weights of `state_dict` (a path to a torch.save file, a mapping, or an nn.Module).

    config: a run-config or model YAML path, or a dict (run config or model section).
    dims / in_channels / out_channels: the data's; read from the state_dict when omitted.
    precision: 'float' or 'double' (default: the run config's training.precision, or float).
    input_* / target_*: per-channel normalization statistics (default mean 0, std 1: the
      model sees the data as given).
    strip_prefix: removed from every key that starts with it (e.g. 'module.').
    rename: maps a state_dict key to ShardTensor's name (None drops the entry).
    verify: if the state_dict came from an nn.Module, run it and the mirror on a random
      input and require equal outputs (catches layers that differ beyond their weights).
    Returns a summary dict (names, shapes, dims, channels, precision, output)."""
    model, run, text, source = _load_config(config)
    sd, module = _load_state_dict(state_dict)
    if strip_prefix:
        sd = collections.OrderedDict(
            (k[len(strip_prefix):] if k.startswith(strip_prefix) else k, v) for k, v in sd.items())
    if rename is not None:
        renamed = collections.OrderedDict()
        for k, v in sd.items():
            new = rename(k)
            if new is not None:
                renamed[new] = v
        sd = renamed
    # ShardTensor keeps no batch counter (momentum is fixed).
    sd = collections.OrderedDict((k, v) for k, v in sd.items()
                                 if not k.endswith("num_batches_tracked"))

    if not isinstance(model, Mapping) or model.get("type") not in ("unet", "sequential"):
        try:  # refuses with the builder's message (missing or unknown type)
            st.build_model(model, 2, 1, 1)
        except st.ConfigError as e:
            raise ExportError(f"{source}: {e}") from None
    guessed = st.infer_shape(model, sd)
    shape = {"dims": dims, "in_channels": in_channels, "out_channels": out_channels}
    for key, flag in (("dims", "--dims"), ("in_channels", "--input-channels"),
                      ("out_channels", "--output-channels")):
        if shape[key] is None:
            if key not in guessed:
                keys = list(sd)[:3]
                prefixes = {k.split(".", 1)[0] for k in sd if "." in k}
                hint = ""
                if len(prefixes) == 1 and len(sd) > 1 and not next(iter(prefixes)).isdigit():
                    hint = (f" (every key starts with '{next(iter(prefixes))}.': pass "
                            f"--strip-prefix {next(iter(prefixes))}. ?)")
                raise ExportError(f"cannot tell {key} from the state_dict (first keys: {keys})"
                                  f"{hint}; pass {flag}")
            shape[key] = guessed[key]

    if precision is None:
        precision = ((run or {}).get("training") or {}).get("precision", "float")
    if precision not in ("float", "double"):
        raise ExportError(f"precision: expected 'float' or 'double', got {precision!r}")

    try:
        mirror = st.build_model(model, shape["dims"], shape["in_channels"],
                                shape["out_channels"])
    except st.ConfigError as e:
        raise ExportError(f"{source}: {e}") from None
    params, buffers = st.shardtensor_names(mirror)
    description = (f"the {model.get('type')} model of {source} (dims {shape['dims']}, "
                   f"in_channels {shape['in_channels']}, out_channels {shape['out_channels']})")
    check_state_dict(sd, params, buffers, description)

    if verify and module is not None:
        _verify_module(module, mirror, sd, shape, verify_extent, model)

    config_text = _run_config_text(model, run, text, precision, source)
    write_checkpoint(
        output,
        collections.OrderedDict((n, sd[n]) for n in params),
        collections.OrderedDict((n, sd[n]) for n in buffers),
        precision, config_text,
        (_statistics(input_mean, shape["in_channels"], "input mean", 0.0),
         _statistics(input_std, shape["in_channels"], "input std", 1.0)),
        (_statistics(target_mean, shape["out_channels"], "target mean", 0.0),
         _statistics(target_std, shape["out_channels"], "target std", 1.0)))
    return {"output": output, "precision": precision, "parameters": params, "buffers": buffers,
            **shape}


def _verify_module(module, mirror, sd, shape, extent, model):
    """The user's module and the mirror give the same output on a random input."""
    if model.get("type") == "unet":
        extent = max(extent, 2 ** (int(model.get("depth", 4)) + 1))
    mirror.load_state_dict(sd, strict=False)
    module, mirror = module.double().eval(), mirror.double().eval()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, shape["in_channels"], *([extent] * shape["dims"]), generator=generator,
                    dtype=torch.float64)
    with torch.no_grad():
        try:
            expected = module(x)
        except Exception as e:  # noqa: BLE001 - the user's module may want other input
            print(f"export_pytorch: note: could not run the given module for verification "
                  f"({e}); the weights were checked by name and shape only", file=sys.stderr)
            return
        got = mirror(x)
    if tuple(expected.shape) != tuple(got.shape):
        raise ExportError(f"the given module maps {tuple(x.shape)} to {tuple(expected.shape)}, "
                          f"the ShardTensor model to {tuple(got.shape)}")
    error = float((expected - got).norm() / max(float(expected.norm()), 1e-300))
    if error > 1e-10:
        raise ExportError(f"the given module and the ShardTensor model compute different "
                          f"outputs with the same weights (relative L2 difference {error:.3g}): "
                          "a layer differs beyond its weights (padding mode, concatenation "
                          "order, upsampling mode, norm kind, activation, ...)")


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

def _floats(text):
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert a PyTorch state_dict into a ShardTensor checkpoint "
                    "(see docs/pytorch.md).")
    parser.add_argument("--config", required=True,
                        help="run config or model YAML (type: unet | sequential)")
    parser.add_argument("--state-dict", required=True,
                        help="torch.save file: a state_dict, {'state_dict': ...}, or a module")
    parser.add_argument("--output", required=True, help="checkpoint file to write (.h5)")
    parser.add_argument("--input-channels", type=int, help="default: from the state_dict")
    parser.add_argument("--output-channels", type=int, help="default: from the state_dict")
    parser.add_argument("--dims", type=int, choices=(1, 2, 3),
                        help="spatial dims; default: from the state_dict")
    parser.add_argument("--precision", choices=("float", "double"),
                        help="default: the run config's training.precision, or float")
    parser.add_argument("--input-mean", type=_floats, help="per-channel, comma-separated")
    parser.add_argument("--input-std", type=_floats)
    parser.add_argument("--target-mean", type=_floats)
    parser.add_argument("--target-std", type=_floats)
    parser.add_argument("--strip-prefix", help="remove this prefix from keys (e.g. module.)")
    parser.add_argument("--no-verify", action="store_true",
                        help="if the file holds a whole module, do not compare it with the "
                             "ShardTensor model on a random input")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        summary = export_checkpoint(
            args.config, args.state_dict, args.output, dims=args.dims,
            in_channels=args.input_channels, out_channels=args.output_channels,
            precision=args.precision, input_mean=args.input_mean, input_std=args.input_std,
            target_mean=args.target_mean, target_std=args.target_std,
            strip_prefix=args.strip_prefix, verify=not args.no_verify)
    except (ExportError, st.ConfigError, OSError) as e:
        print(f"export_pytorch: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        count = sum(int(np.prod(s)) for s in summary["parameters"].values())
        print(f"export_pytorch: {len(summary['parameters'])} parameters ({count} values), "
              f"{len(summary['buffers'])} buffers, dims {summary['dims']}, channels "
              f"{summary['in_channels']} -> {summary['out_channels']}, precision "
              f"{summary['precision']} -> {summary['output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
