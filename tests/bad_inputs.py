#!/usr/bin/env python3
"""A catalogue of bad inputs, one table row each: configs, data files, checkpoints, run dirs,
command lines, C API misuse and signals.

Every case runs in a fresh copy of a small, valid workspace (data, a config, a trained run)
that the case then breaks. Each case asserts:
  - a non-zero exit status (the C API driver exits with the error code it got),
  - a message that names the problem (a regular expression over the output),
  - no hang (a timeout; the whole process group is killed past it),
  - every file that was there before is byte-identical afterwards (and still there).
C API cases also assert that every rank returned the error with the same message.

  python3 tests/bad_inputs.py --bin build/bin/shardtensor --capi build/tests/capi_misuse \
      --ranks 3 [--only NAME_PART] [--list]
"""
import argparse
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

TIMEOUT_S = 90

# The workspace every case starts from (built once per run, then copied).
CONFIG = """\
run_dir: run
data: {path: data.h5, validation_samples: 2, periodic: true}
model: {type: unet, depth: 1, base_channels: 4, norm: none, seed: 3}
optimizer: {type: adam, lr: 1.0e-3}
training: {epochs: 1, batch_size: 2, seed: 5}
"""


class Case:
    def __init__(self, name, argv, expect, setup=None, last_rank_argv=None, capi=False,
                 signal_after_steps=None, min_ranks=1, may_change=(), succeeds=False,
                 signal_when_file=None):
        self.name, self.argv, self.expect = name, argv, expect
        self.setup = setup  # callable(workspace dir) that breaks something
        self.last_rank_argv = last_rank_argv  # the last rank runs these arguments instead
        self.capi = capi  # argv are the C API driver's
        self.signal_after_steps = signal_after_steps  # (signal, steps): signal the ranks then
        self.min_ranks = min_ranks
        self.may_change = may_change  # files the command may rewrite (named, with the reason)
        self.succeeds = succeeds  # a notice, not an error: exit status 0 expected
        # (signal, name part): signal the ranks once a file whose name holds the part appears
        self.signal_when_file = signal_when_file


# ---- helpers that break a workspace ----------------------------------------------------

def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)


def config_with(*replace, append=""):
    """The workspace config with (old, new) text replacements and extra lines."""
    text = CONFIG.replace("run_dir: run", "run_dir: new_run")  # not the workspace's run
    replace = [(old.replace("run_dir: run", "run_dir: new_run"), new) for old, new in replace]
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new)
    return lambda d: write(os.path.join(d, "bad.yaml"), text + append)


def h5_data(path, input_array=None, target_array=None, **datasets):
    """A data file with the given arrays."""
    with h5py.File(path, "w") as f:
        if input_array is not None:
            f["input"] = input_array
        if target_array is not None:
            f["target"] = target_array
        for name, value in datasets.items():
            f[name] = value


def random_field(shape, dtype="f8"):
    return np.random.default_rng(7).standard_normal(shape).astype(dtype)


def data_file(**kwargs):
    return lambda d: h5_data(os.path.join(d, "bad.h5"), **kwargs)


def copy_data_with(change):
    """bad.h5: a copy of data.h5 whose arrays `change(f)` edits in place."""
    def setup(d):
        shutil.copy(os.path.join(d, "data.h5"), os.path.join(d, "bad.h5"))
        with h5py.File(os.path.join(d, "bad.h5"), "r+") as f:
            change(f)
    return setup


def set_value(dataset, index, value):
    def change(f):
        a = f[dataset][...]
        a[index] = value
        f[dataset][...] = a
    return change


def replace_dataset(dataset, value):
    def change(f):
        del f[dataset]
        f[dataset] = value
    return change


def huge_declared_dataset(d):
    """2 KB on disk, declaring a [1e6, 2, 1e5, 1e5] input (chunked, never written)."""
    with h5py.File(os.path.join(d, "bad.h5"), "w") as f:
        f.create_dataset("input", shape=(10**6, 2, 10**5, 10**5), dtype="f8",
                         chunks=(1, 1, 64, 64))
        f.create_dataset("target", shape=(10**6, 1, 10**5, 10**5), dtype="f8",
                         chunks=(1, 1, 64, 64))


def truncate(name, keep_fraction):
    def setup(d):
        path = os.path.join(d, name)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(int(size * keep_fraction))
    return setup


def copy(src, dst):
    return lambda d: shutil.copy(os.path.join(d, src), os.path.join(d, dst))


def checkpoint_copy(d):
    """ck_bad.h5, a copy of the workspace checkpoint to break; its path."""
    path = os.path.join(d, "ck_bad.h5")
    shutil.copy(os.path.join(d, "ck.h5"), path)
    return path


def first_dataset(f, pattern):
    """The name of the first dataset of h5py file `f` matching `pattern`."""
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return [n for n in names if re.search(pattern, n)][0]


def flip_checkpoint_value(pattern):
    """ck_bad.h5 with one value of a dataset changed (the file stays valid HDF5; only the
    checksum can tell)."""
    def setup(d):
        with h5py.File(checkpoint_copy(d), "r+") as f:
            name = first_dataset(f, pattern)
            a = f[name][...]
            a.flat[0] = a.flat[0] + 0.5
            f[name][...] = a
    return setup


def delete_from_checkpoint(pattern):
    def setup(d):
        with h5py.File(checkpoint_copy(d), "r+") as f:
            del f[first_dataset(f, pattern)]
    return setup


def damage_dataset_bytes(pattern):
    """ck_bad.h5 with the stored bytes of a dataset overwritten (a damaged disk block under
    the data; HDF5 cannot tell)."""
    def setup(d):
        path = checkpoint_copy(d)
        with h5py.File(path, "r") as f:
            dataset = f[first_dataset(f, pattern)]
            offset, size = dataset.id.get_offset(), dataset.id.get_storage_size()
        with open(path, "r+b") as out:
            out.seek(offset)
            out.write(bytes((i * 37 + 11) % 256 for i in range(size)))
    return setup


def huge_checkpoint_dataset(pattern):
    """ck_bad.h5 with a dataset replaced by one declaring 10^12 values (chunked, never
    written), its checksum attribute kept."""
    def setup(d):
        with h5py.File(checkpoint_copy(d), "r+") as f:
            name = first_dataset(f, pattern)
            attributes, dtype = dict(f[name].attrs), f[name].dtype
            del f[name]
            f.create_dataset(name, shape=(10**12,), dtype=dtype, chunks=(1024,))
            for key, value in attributes.items():
                f[name].attrs[key] = value
    return setup


def steps(*fns):
    def setup(d):
        for fn in fns:
            fn(d)
    return setup


def symlink(target, name):
    return lambda d: os.symlink(target, os.path.join(d, name))


def mkdir(name):
    return lambda d: os.makedirs(os.path.join(d, name), exist_ok=True)


def fifo(name):
    """A named pipe: opening it for reading waits for a writer that never comes."""
    return lambda d: os.mkfifo(os.path.join(d, name))


def symlink_loop(name):
    """name -> name.loop -> name."""
    def setup(d):
        os.symlink(name + ".loop", os.path.join(d, name))
        os.symlink(name, os.path.join(d, name + ".loop"))
    return setup


# ---- the catalogue ------------------------------------------------------------------------

def onnx_model(name, make_nodes, in_channels=2, out_channels=1, external=None):
    """A setup writing NAME, made with onnx.helper (no PyTorch needed): a graph from input
    [N, in_channels, 12, 12] to output [N, out_channels, 12, 12] of the nodes
    make_nodes(onnx.helper) returns, with a 3x3 conv weight 'w' (in_channels -> 1) whose data
    lies in the file `external` beside the model when given (not written)."""
    def setup(d):
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", in_channels, 12, 12])
        y = helper.make_tensor_value_info("prediction", TensorProto.FLOAT,
                                          ["N", out_channels, 12, 12])
        values = np.linspace(-1, 1, in_channels * 9).astype(np.float32)
        w = helper.make_tensor("w", TensorProto.FLOAT, [1, in_channels, 3, 3], values)
        if external:
            w.ClearField("float_data")
            w.data_location = TensorProto.EXTERNAL
            entry = w.external_data.add()
            entry.key, entry.value = "location", external
        graph = helper.make_graph(make_nodes(helper), "bad", [x], [y], [w])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        with open(os.path.join(d, name), "wb") as f:
            f.write(model.SerializeToString())
    return setup


def onnx_conv(output="prediction"):
    from onnx import helper
    return helper.make_node("Conv", ["input", "w"], [output], name="conv", pads=[1, 1, 1, 1])


T = ["train", "--config"]
TB = ["train", "--config", "bad.yaml"]
I = ["infer", "--checkpoint", "ck.h5", "--input", "data.h5"]


def cases():
    c = []
    add = lambda *a, **k: c.append(Case(*a, **k))

    # Config files.
    add("config missing", T + ["nothing.yaml"], r"cannot open config file 'nothing\.yaml'")
    add("config is a directory", T + ["run"], r"config file 'run' is a directory")
    add("config is a named pipe", TB, r"config file 'bad\.yaml' is a named pipe \(FIFO\), not a regular file",
        setup=fifo("bad.yaml"))
    add("config is a symlink loop", T + ["loop.yaml"],
        r"cannot open config file 'loop\.yaml': Too many levels of symbolic links",
        setup=symlink_loop("loop.yaml"))
    add("config empty", TB, r"config file 'bad\.yaml' is empty", setup=lambda d: write(
        os.path.join(d, "bad.yaml"), ""))
    add("config YAML syntax error", TB, r"bad\.yaml \(line 7\): YAML syntax error",
        setup=lambda d: write(os.path.join(d, "bad.yaml"), CONFIG + "model: {type: [unet\n"))
    add("config nested aliases (billion laughs)", TB,
        r"more than 100000 YAML nodes once its aliases are expanded \(nested aliases\?\)",
        setup=lambda d: write(os.path.join(d, "bad.yaml"), CONFIG + "".join(
            "l%d: &l%d [%s]\n" % (i, i, ", ".join(["*l%d" % (i - 1) if i else "lol"] * 10))
            for i in range(9))))
    add("config of two YAML documents", TB,
        r"bad\.yaml: 2 YAML documents \(separated by '---'\); a config is one",
        setup=lambda d: write(os.path.join(d, "bad.yaml"), CONFIG + "---\ntraining: {epochs: 5}\n"))
    add("config a 10 MB file that is not YAML", TB,
        r"top level must be a map of keys, got 'x{100}\.\.\. \(10485760 characters\)'",
        setup=lambda d: write(os.path.join(d, "bad.yaml"), "x" * 10485760))
    add("config negative validation_samples", TB,
        r"data\.validation_samples \(line 2\): must be at least 0, got -5",
        setup=config_with(("validation_samples: 2", "validation_samples: -5")))
    add("config not a map", TB, r"top level must be a map of keys",
        setup=lambda d: write(os.path.join(d, "bad.yaml"), "- just\n- a list\n"))
    add("config unknown key, did you mean", TB, r"epoch.*did you mean 'epochs'",
        setup=config_with(("epochs: 1", "epoch: 1")))
    add("config unknown section", TB, r"unknown.*'trainig'",
        setup=config_with(append="trainig: {epochs: 2}\n"))
    add("config duplicate key", TB, r"bad\.yaml \(line 6\): duplicate key 'run_dir' \(first on line 1\)",
        setup=config_with(append="run_dir: other\n"))
    add("config epochs not a number", TB, r"training\.epochs.*got 'many'",
        setup=config_with(("epochs: 1", "epochs: many")))
    add("config negative epochs", TB, r"training\.epochs.*-3",
        setup=config_with(("epochs: 1", "epochs: -3")))
    add("config zero batch size", TB, r"training\.batch_size.*must be at least 1, got 0",
        setup=config_with(("batch_size: 2", "batch_size: 0")))
    add("config negative learning rate", TB, r"optimizer.*'lr'.*-0\.1",
        setup=config_with(("lr: 1.0e-3", "lr: -0.1")))
    add("config NaN learning rate", TB, r"optimizer.*'lr' must be a finite number.*got nan",
        setup=config_with(("lr: 1.0e-3", "lr: .nan")))
    add("config unknown model type", TB, r"model\.type.*'resnet'",
        setup=config_with(("type: unet", "type: resnet")))
    add("config unknown optimizer", TB, r"optimizer\.type.*'adamm'",
        setup=config_with(("type: adam,", "type: adamm,")))
    add("config unknown loss", TB, r"training\.loss.*'mae'",
        setup=config_with(("epochs: 1,", "epochs: 1, loss: mae,")))
    add("config unknown precision", TB, r"training\.precision.*'half'",
        setup=config_with(("epochs: 1,", "epochs: 1, precision: half,")))
    add("config validation fraction 1", TB,
        r"data\.validation_fraction.*must lie in \[0, 1\), got 1",
        setup=config_with(("validation_samples: 2", "validation_fraction: 1.0")))
    add("config more validation samples than samples", TB,
        r"50 validation samples leave none of the 8 samples",
        setup=config_with(("validation_samples: 2", "validation_samples: 50")))
    add("config data_groups not dividing ranks", TB, r"7 data groups do not divide \d ranks",
        setup=config_with(append="parallel: {data_groups: 7}\n"))
    add("config grid product not the rank count", TB, r"parallel\.grid: covers 5 ranks",
        setup=config_with(append="parallel: {grid: [5, 1]}\n"))
    add("config negative memory budget", TB, r"memory\.budget_mib.*-5",
        setup=config_with(append="memory: {budget_mib: -5}\n"))
    add("config tiny memory budget", TB, r"needs at least .* MiB per rank.*more than memory\.budget_mib",
        setup=config_with(append="memory: {budget_mib: 0.001}\n"))
    add("config model larger than the memory budget", TB,
        r"parameters need at least \d+ MiB per rank .*x4 for gradients and adam state\), more "
        r"than memory\.budget_mib \(16 MiB\)",
        setup=config_with(("base_channels: 4", "base_channels: 512"),
                          append="memory: {budget_mib: 16}\n"))
    add("config model larger than the node's memory", TB,
        r"parameters need at least \d+ MiB per rank .*more than the free memory of this node",
        setup=config_with(("base_channels: 4", "base_channels: 300000")))  # 13 TB
    add("config negative keep_checkpoints", TB, r"keep_checkpoints.*-1",
        setup=config_with(("seed: 5", "seed: 5, keep_checkpoints: -1")))
    add("config unknown schedule", TB, r"schedule\.type.*'linear'",
        setup=config_with(append="schedule: {type: linear}\n"))
    add("config model depth too deep for the field", TB,
        r"field extent 12 along dim 0 is not divisible by 2\^depth = 64",
        setup=config_with(("depth: 1", "depth: 6")))
    add("--set without '='", T + ["run.yaml", "--set", "training.epochs"],
        r"--set: expected key=value, got 'training\.epochs'")
    add("--set unknown key", T + ["run.yaml", "--set", "training.epohcs=3"],
        r"epohcs.*did you mean 'epochs'")

    # Data files.
    add("data file missing", TB, r"nothing\.h5",
        setup=config_with(("path: data.h5", "path: nothing.h5")))
    add("data file not HDF5", TB, r"'bad\.h5' is not an HDF5 file", setup=steps(
        lambda d: write(os.path.join(d, "bad.h5"), "step,loss\n1,0.5\n"),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data file empty", TB, r"'bad\.h5' is empty \(0 bytes\)", setup=steps(
        lambda d: write(os.path.join(d, "bad.h5"), ""),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data file truncated", TB, r"bad\.h5.*damaged", setup=steps(
        copy("data.h5", "bad.h5"), truncate("bad.h5", 0.6),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data path is a directory", TB, r"'run' is a directory, not an HDF5 file",
        setup=config_with(("path: data.h5", "path: run")))
    add("data file is a named pipe", TB, r"file 'bad\.h5' is a named pipe \(FIFO\), not a regular file",
        setup=steps(fifo("bad.h5"), config_with(("path: data.h5", "path: bad.h5"))))
    add("data file is a symlink loop", TB,
        r"cannot open file 'loop\.h5': Too many levels of symbolic links",
        setup=steps(symlink_loop("loop.h5"), config_with(("path: data.h5", "path: loop.h5"))))
    add("infer checkpoint is a named pipe",
        ["infer", "--checkpoint", "pipe.h5", "--input", "data.h5", "--output", "out.h5"],
        r"file 'pipe\.h5' is a named pipe", setup=fifo("pipe.h5"))
    add("infer input is a named pipe",
        ["infer", "--checkpoint", "ck.h5", "--input", "pipe.h5", "--output", "out.h5"],
        r"file 'pipe\.h5' is a named pipe", setup=fifo("pipe.h5"))
    add("data without the input dataset", TB, r"no dataset 'input' in 'bad\.h5'", setup=steps(
        data_file(target_array=random_field((8, 1, 12, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data input of rank 2", TB, r"dataset 'input' has 2 dims; expected \[samples, channels", setup=steps(
        data_file(input_array=random_field((8, 12)), target_array=random_field((8, 1, 12, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data input of integers", TB, r"'input'.*(integer|type|float)", setup=steps(
        data_file(input_array=np.ones((8, 2, 12, 12), dtype="i4"),
                  target_array=random_field((8, 1, 12, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data input of strings", TB, r"'input'.*(string|type|float)", setup=steps(
        data_file(input_array=np.full((8, 2, 12, 12), b"abc", dtype="S3"),
                  target_array=random_field((8, 1, 12, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data sample counts differ", TB, r"target 'target' \[6, 1, 12, 12\] must have the samples.*\[8, 2, 12, 12\]", setup=steps(
        data_file(input_array=random_field((8, 2, 12, 12)),
                  target_array=random_field((6, 1, 12, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data field sizes differ", TB, r"'target'.*dim 2 \(spatial x\) is 10, expected 12", setup=steps(
        data_file(input_array=random_field((8, 2, 12, 12)),
                  target_array=random_field((8, 1, 10, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data with no samples", TB, r"none of the 0 samples in bad\.h5", setup=steps(
        data_file(input_array=random_field((0, 2, 12, 12)),
                  target_array=random_field((0, 1, 12, 12))),
        config_with(("path: data.h5", "path: bad.h5"))))
    add("data NaN in an input sample", TB,
        r"bad\.h5.*'input'.*sample 3.*non-finite", setup=steps(
            copy_data_with(set_value("input", (3, 1, 4, 5), np.nan)),
            config_with(("path: data.h5", "path: bad.h5"))))
    add("data Inf in a target sample", TB,
        r"bad\.h5.*'target'.*sample 1.*non-finite", setup=steps(
            copy_data_with(set_value("target", (1, 0, 7, 2), np.inf)),
            config_with(("path: data.h5", "path: bad.h5"))))
    add("data declares a huge field in 2 KB", TB,
        r"one batch of bad\.h5 needs at least \d+ MiB per rank", setup=steps(
        huge_declared_dataset, config_with(("path: data.h5", "path: bad.h5"))))
    add("data field smaller than the ranks", TB, r"cannot split a 2x1 field over 3 ranks",
        setup=steps(data_file(input_array=random_field((8, 2, 2, 1)),
                              target_array=random_field((8, 1, 2, 1))),
                    config_with(("path: data.h5", "path: bad.h5"), ("depth: 1", "depth: 1"))),
        min_ranks=3)
    add("data channels differ from the checkpoint's model",
        ["infer", "--checkpoint", "ck.h5", "--input", "bad.h5", "--output", "out.h5",
         "--dataset", "three"],
        r"3.*channel|channel.*3",
        setup=copy_data_with(lambda f: f.create_dataset("three",
                                                        data=random_field((8, 3, 12, 12)))))
    add("validation_path missing", TB, r"val\.h5",
        setup=config_with(("validation_samples: 2", "validation_path: val.h5")))

    # Checkpoints and infer.
    add("infer checkpoint missing", ["infer", "--checkpoint", "none.h5", "--input", "data.h5",
                                     "--output", "out.h5"], r"none\.h5")
    add("infer checkpoint dir without checkpoints",
        ["infer", "--checkpoint", "empty", "--input", "data.h5", "--output", "out.h5"],
        r"no checkpoint files in directory 'empty'", setup=mkdir("empty"))
    add("infer checkpoint with a changed value", ["infer", "--checkpoint", "ck_bad.h5",
                                                  "--input", "data.h5", "--output", "out.h5"],
        r"ck_bad\.h5.*does not match its checksum", setup=flip_checkpoint_value("parameters/"))
    add("infer checkpoint with damaged bytes", ["infer", "--checkpoint", "ck_bad.h5",
                                                "--input", "data.h5", "--output", "out.h5"],
        r"ck_bad\.h5.*dataset 'parameters/.*does not match its checksum",
        setup=damage_dataset_bytes("parameters/"))
    add("infer checkpoint declaring a huge parameter", ["infer", "--checkpoint", "ck_bad.h5",
                                                        "--input", "data.h5", "--output",
                                                        "out.h5"],
        r"ck_bad\.h5: parameter 'parameters/.*' has 1000000000000 values \[1000000000000\], "
        r"the model expects \d+", setup=huge_checkpoint_dataset("parameters/"))
    add("infer checkpoint declaring huge statistics", ["infer", "--checkpoint", "ck_bad.h5",
                                                       "--input", "data.h5", "--output",
                                                       "out.h5"],
        r"'normalization/input_mean' in 'ck_bad\.h5' declares \[1000000000000\] values "
        r"\(7629394 MiB\), more than this node has free",
        setup=huge_checkpoint_dataset("normalization/input_mean"))
    add("infer checkpoint with an altered stored config", ["infer", "--checkpoint",
                                                           "ck_bad.h5", "--input", "data.h5",
                                                           "--output", "out.h5"],
        r"ck_bad\.h5: the stored config does not match its checksum",
        setup=alter_stored_config)
    add("infer checkpoint truncated", ["infer", "--checkpoint", "ck_bad.h5", "--input",
                                       "data.h5", "--output", "out.h5"],
        r"ck_bad\.h5.*damaged", setup=steps(copy("ck.h5", "ck_bad.h5"),
                                             truncate("ck_bad.h5", 0.5)))
    add("infer checkpoint not HDF5", ["infer", "--checkpoint", "run.yaml", "--input", "data.h5",
                                      "--output", "out.h5"], r"'run\.yaml' is not an HDF5 file")
    add("infer checkpoint missing a parameter", ["infer", "--checkpoint", "ck_bad.h5",
                                                 "--input", "data.h5", "--output", "out.h5"],
        r"ck_bad\.h5.*parameters/", setup=delete_from_checkpoint("parameters/"))
    add("infer checkpoint of another model", ["infer", "--checkpoint", "ck.h5", "--config",
                                              "bad.yaml", "--input", "data.h5", "--output",
                                              "out.h5"],
        r"ck\.h5: parameter 'parameters/.*' has \d+ values",
        setup=config_with(("base_channels: 4", "base_channels: 6")))
    add("infer output is the input", I + ["--output", "data.h5"],
        r"output 'data\.h5'.*input")
    add("infer output is the input through a link", I + ["--output", "link.h5"],
        r"link\.h5.*input", setup=symlink("data.h5", "link.h5"))
    add("infer output is the checkpoint", I + ["--output", "ck.h5"], r"ck\.h5.*checkpoint")
    add("infer output is the config", ["infer", "--config", "run.yaml", "--checkpoint", "ck.h5",
                                       "--input", "data.h5", "--output", "run.yaml"],
        r"infer: --output 'run\.yaml' is the --config \('run\.yaml'\), which this command reads")
    add("infer output named .xdmf", I + ["--output", "out.xdmf"], r"sidecar of --output 'out\.xdmf' is also the --output")
    add("infer output's sidecar is the input", ["infer", "--checkpoint", "ck.h5", "--input",
                                                "data.xdmf", "--output", "data.h5"],
        r"data\.xdmf")
    add("infer output into a missing directory", I + ["--output", "no/such/dir/out.h5"],
        r"cannot write 'no/such/dir/out\.h5': directory 'no/such/dir': No such file or directory")
    add("infer unknown input dataset", I + ["--output", "out.h5", "--dataset", "inptu"],
        r"'inptu'")
    add("infer unknown target dataset", I + ["--output", "out.h5", "--target", "tagret"],
        r"'tagret'")

    # Run directories and resume.
    add("train into a run dir that holds a run", T + ["run.yaml"],
        r"run_dir 'run' already holds a run.*--resume latest.*--overwrite")
    add("--resume latest with --overwrite", T + ["run.yaml", "--resume", "latest",
                                                 "--overwrite"], r"--overwrite.*--resume|--resume.*--overwrite")
    add("--resume latest without checkpoints", T + ["bad.yaml", "--resume", "latest"],
        r"no checkpoint in fresh/checkpoints", setup=config_with(("run_dir: run", "run_dir: fresh")))
    add("--resume a missing file", T + ["run.yaml", "--resume", "gone.h5"], r"gone\.h5")
    add("--resume a damaged checkpoint", T + ["run.yaml", "--resume", "ck_bad.h5"],
        r"ck_bad\.h5.*checksum", setup=flip_checkpoint_value("optimizer|parameters/"))
    add("--resume a checkpoint with damaged optimizer state", T + ["run.yaml", "--resume",
                                                                   "ck_bad.h5"],
        r"ck_bad\.h5.*dataset 'optimizer/.*does not match its checksum",
        setup=damage_dataset_bytes("optimizer/"))
    add("--resume an older checkpoint than the run's newest", T + ["run.yaml", "--resume", "old.h5"],
        r"old\.h5 is at step 3, but run/checkpoints holds later checkpoints",
        setup=older_checkpoint)
    add("run_dir is a file", TB, r"'plain/checkpoints': Not a directory", setup=steps(
        lambda d: write(os.path.join(d, "plain"), "x"),
        config_with(("run_dir: run", "run_dir: plain"))))
    add("run_dir below a file", TB, r"plain/run.*(Not a directory|not a directory)",
        setup=steps(lambda d: write(os.path.join(d, "plain"), "x"),
                    config_with(("run_dir: run", "run_dir: plain/run"))))
    add("metrics.csv on a full disk", TB + ["--resume", "latest"], r"metrics\.csv.*No space left on device",
        setup=steps(lambda d: shutil.copytree(os.path.join(d, "run"), os.path.join(d, "full")),
                    lambda d: os.remove(os.path.join(d, "full", "metrics.csv")),
                    symlink("/dev/full", "full/metrics.csv"),
                    config_with(("run_dir: run", "run_dir: full"),
                                ("epochs: 1", "epochs: 3"))),
        may_change=["full/config.yaml"])  # a resume records the config it continues with
    add("--resume with a hand-edited line in metrics.csv", TB + ["--resume", "latest"],
        r"cannot resume with edited/metrics\.csv: line \d+ does not start with a step number: "
        r"'my note,0\.5' \(a hand-edited line\? remove it\)",
        setup=steps(lambda d: shutil.copytree(os.path.join(d, "run"), os.path.join(d, "edited")),
                    lambda d: write(os.path.join(d, "edited", "metrics.csv"), "my note,0.5\n", "a"),
                    config_with(("run_dir: run", "run_dir: edited"), ("epochs: 1", "epochs: 3"))),
        may_change=["edited/config.yaml"])  # a resume records the config it continues with
    add("--resume with data of other channel counts", TB + ["--resume", "latest"],
        r"train --resume: bad\.h5 has 3 input channel\(s\), other/checkpoints/\S+ was trained "
        r"with 2",
        setup=steps(lambda d: shutil.copytree(os.path.join(d, "run"), os.path.join(d, "other")),
                    data_file(input_array=random_field((8, 3, 12, 12)),
                              target_array=random_field((8, 1, 12, 12))),
                    config_with(("run_dir: run", "run_dir: other"), ("path: data.h5", "path: bad.h5"),
                                ("epochs: 1", "epochs: 3"))),
        may_change=["other/config.yaml"])
    add("infer a 3-D input with a 2-D model",
        ["infer", "--checkpoint", "ck.h5", "--input", "bad.h5", "--output", "out.h5"],
        r"infer: bad\.h5 dataset 'input' holds 3-D fields, ck\.h5 was trained on 2-D fields",
        setup=data_file(input_array=random_field((2, 2, 12, 12, 12))))
    add("train into a run dir another train holds", T + ["run.yaml", "--resume", "latest"],
        r"train: run_dir 'run' is in use by another train \(host \S+, PID 1, since "
        r"2026-11-27T00:00:00Z; lock file run\.lock\): wait for it to end",
        setup=lambda d: write(os.path.join(d, "run.lock"),
                              socket.gethostname() + " 1 2026-11-27T00:00:00Z\n"))
    add("--resume a run with nothing left to train",
        T + ["run.yaml", "--resume", "latest", "--set", "training.epochs=2"],
        r"train: nothing left to train: the run is at step \d+, its 2 epoch\(s\) done "
        r"\(training\.epochs 2\); raise training\.epochs", succeeds=True,
        may_change=["run/config.yaml", "run/metrics.csv"])  # rewritten as they were
    add("config.yaml in the run dir is a directory", TB, r"config\.yaml",
        setup=steps(mkdir("fresh/config.yaml"), config_with(("run_dir: run", "run_dir: fresh"))))

    # Command lines.
    add("unknown command", ["trian"], r"unknown command 'trian'; did you mean 'train'")
    add("unknown flag", T + ["run.yaml", "--epochs", "3"], r"not expected: 3 --epochs")
    add("flag without its value", ["train", "--config"], r"--config: 1 required TEXT missing")
    add("train without --config", ["train"], r"--config.*required")
    add("generate with a negative size", ["generate", "heat", "--size", "-4", "--output",
                                          "g.h5"], r"size -4 must be at least 4")
    add("generate 4-D", ["generate", "heat", "--dims", "4", "--output", "g.h5"], r"dims 4 must be 2 or 3")
    add("generate beside someone else's sidecar", ["generate", "heat", "--size", "12", "--output",
                                                  "notes.h5"],
        r"'notes\.xdmf' exists \(the XDMF sidecar of --output\): pass --overwrite",
        setup=lambda d: write(os.path.join(d, "notes.xdmf"), "<my notes/>\n"))
    add("generate over the input data", ["generate", "heat", "--size", "12", "--output",
                                         "data.h5"],
        r"'data\.h5' exists: pass --overwrite")
    add("ranks given different configs", T + ["run.yaml"], r"command line.*differs between ranks.*bad\.yaml",
        last_rank_argv=T + ["bad.yaml"], setup=config_with(("lr: 1.0e-3", "lr: 2.0e-3"),
                                                          ("run_dir: run", "run_dir: other")),
        min_ranks=2)
    add("ranks given different commands", T + ["run.yaml"],
        r"command line.*differs between ranks.*'infer'",
        last_rank_argv=I + ["--output", "out.h5"], min_ranks=2)

    # ONNX models (infer --model): files crafted with onnx.helper.
    IM = ["infer", "--model", "m.onnx", "--input", "data.h5", "--output", "out.h5"]
    add("ONNX: an operator with no sharded equivalent", IM,
        r"node 'soft' \(Softsign\): the operator is not supported",
        setup=onnx_model("m.onnx", lambda h: [
            onnx_conv("h"), h.make_node("Softsign", ["h"], ["prediction"], name="soft")]))
    add("ONNX: external data missing", IM, r"weights\.bin",
        setup=onnx_model("m.onnx", lambda h: [onnx_conv()], external="weights.bin"))
    add("ONNX: input channels other than the data's", IM,
        r"takes 3 input channel\(s\); the data has 2",
        setup=onnx_model("m.onnx", lambda h: [onnx_conv()], in_channels=3))
    add("ONNX: an output size baked into the graph", IM,
        r"node 'resize' \(Resize\): resizes 12 cells to 18 along spatial axis 0 \(a size fixed at export",
        setup=onnx_model("m.onnx", lambda h: [
            onnx_conv("h"),
            h.make_node("Constant", [], ["sizes"], name="sizes",
                        value=h.make_tensor("v", 7, [4], [1, 1, 18, 18])),
            h.make_node("Resize", ["h", "", "", "sizes"], ["prediction"], name="resize",
                        mode="nearest", coordinate_transformation_mode="asymmetric",
                        nearest_mode="floor")]))
    add("ONNX: a truncated file", IM, r"'m\.onnx' \(\d+ bytes\) is not an ONNX model",
        setup=steps(onnx_model("m.onnx", lambda h: [onnx_conv()]), truncate("m.onnx", 0.5)))
    add("ONNX: --model with --checkpoint", IM + ["--checkpoint", "ck.h5"],
        r"--model excludes --checkpoint|--checkpoint excludes --model",
        setup=onnx_model("m.onnx", lambda h: [onnx_conv()]))

    # C API misuse (tests/capi_misuse.c; every rank must return the error).
    for name, expect in [  # (the case, in capi_misuse.c; the message)
        ("null-options", r"options is NULL"),
        ("config-missing", r"missing\.yaml"),
        ("config-missing-on-last-rank", r"missing\.yaml"),
        ("seed-differs", r"differs between ranks"),
        ("lr-differs", r"differs between ranks"),
        ("patch-overlap", r"patches of ranks 0 and 1 overlap"),
        ("patch-ndims-0", r"patch->ndims is 0"),
        ("patch-negative-extent", r"extent -12 along axis 1"),
        ("null-input-array", r"inputs\[0\] is NULL"),
        ("too-many-inputs", r"ninputs is 3, the session's model has 2 input channel"),
        ("bad-array-order", r"array_order is 7"),
        ("negative-ghost-width", r"ghost_width -1 is negative"),
        ("ghost-width-past-open-edge", r"ghost_width 1 on a field whose axis 0 is not periodic: say how many ghost cells"),
        ("ghost-width-beyond-neighbour", r"ghost width 7 along axis 0 exceeds the extent \d of the patch it faces"),
        ("per-side-widths-partial", r"ghost_lower and ghost_upper give 3 of the 4 widths"),
        ("null-override", r"options->overrides\[1\] is NULL"),
        ("interleaved-without-components", r"inputs arrays 0 and 1 overlap.*need components set"),
        ("nan-in-inference-input", r"inputs array 0 holds a non-finite value \(inf\).*the prediction was not made"),
        ("huge-ghost-width", r"ghost_width 1099511627776 exceeds the field's largest extent 12"),
        ("huge-channel-count", r"input_channels 4611686018427387904 .*at most"),
        ("config-file-and-text", r"a config file \('model\.yaml'\) and config text: give one"),
        ("checkpoint-damaged", r"ck_bad\.h5.*checksum"),
        ("checkpoint-path-differs", r"differs between ranks"),
        ("save-into-missing-dir", r"cannot write 'no/such/dir/ck\.h5': directory 'no/such/dir': No such"),
        ("save-over-config", r"'model\.yaml' exists and is not a ShardTensor checkpoint"),
        ("model-too-large", r"parameters need at least \d+ MiB per rank"),
        ("nan-in-training-input", r"inputs array 1 holds a non-finite value \(nan\).*the step was not taken"),
    ]:
        add("C API: " + name, [name], expect, capi=True,
            setup=flip_checkpoint_value("parameters/") if name == "checkpoint-damaged" else None,
            min_ranks=2 if ("differs" in name or "last-rank" in name or "overlap" in name
                            or "neighbour" in name) else 1)

    # Signals: a message, a resumable checkpoint, exit 128 + signal.
    add("SIGTERM during generate", ["generate", "heat", "--dims", "3", "--size", "48",
                                    "--samples", "64", "--steps", "40", "--output", "big.h5"],
        r"signal 15|Terminated", signal_when_file=("TERM", ".tmp-"))
    add("SIGTERM during training", TB + ["--set", "training.epochs=100000"],
        r"stopped by SIGTERM after step.*--resume latest", signal_after_steps=("TERM", 2),
        setup=config_with(("run_dir: run", "run_dir: sig")))
    add("SIGINT during training", TB + ["--set", "training.epochs=100000"],
        r"stopped by SIGINT after step.*--resume latest", signal_after_steps=("INT", 2),
        setup=config_with(("run_dir: run", "run_dir: sig")))
    return c


def alter_stored_config(d):
    """ck_bad.h5 whose stored config says another seed (a damaged or edited attribute)."""
    with h5py.File(checkpoint_copy(d), "r+") as f:
        text = f.attrs["config"]
        text = text.decode() if isinstance(text, bytes) else str(text)
        assert "seed: 3" in text, text
        f.attrs["config"] = np.bytes_(text.replace("seed: 3", "seed: 4"))


def older_checkpoint(d):
    """old.h5: a copy of the run's first checkpoint; the run has newer ones."""
    cks = sorted(os.listdir(os.path.join(d, "run", "checkpoints")))
    shutil.copy(os.path.join(d, "run", "checkpoints", cks[0]), os.path.join(d, "old.h5"))


# ---- running ------------------------------------------------------------------------------

def snapshot(root):
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.islink(p) or not os.path.isfile(p):
                files[os.path.relpath(p, root)] = "link:" + os.readlink(p) if os.path.islink(
                    p) else "special"
                continue
            with open(p, "rb") as f:
                files[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return files


def mpirun(ranks, graceful_stop=True):
    # Once a rank exits with an error, mpirun tears the job down with SIGTERM, waits
    # odls_base_sigkill_timeout (1 s) and sends SIGKILL: 1-2 s of nothing per case, 4 minutes
    # over the catalogue at one rank. Only the signal cases, whose ranks may still be writing
    # their checkpoint when the first one exits, need that grace.
    wait = [] if graceful_stop else ["--mca", "odls_base_sigkill_timeout", "0"]
    return ["mpirun", "--oversubscribe", "--bind-to", "none"] + wait


def command(case, args, ranks):
    if case.capi:
        program = [args.capi]
    else:
        program = [args.bin]
    launcher = mpirun(ranks, graceful_stop=bool(case.signal_after_steps))
    if case.last_rank_argv and ranks > 1:
        return (launcher + ["-n", str(ranks - 1)] + program + case.argv + [":", "-n", "1"] +
                program + case.last_rank_argv)
    return launcher + ["-n", str(ranks)] + program + case.argv


def wait_for_steps(run_dir, count, proc, limit_s=60):
    metrics = os.path.join(run_dir, "metrics.csv")
    end = time.time() + limit_s
    while time.time() < end and proc.poll() is None:
        try:
            with open(metrics) as f:
                if len(f.readlines()) >= count + 1:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def wait_for_file(root, part, proc, limit_s=60):
    """Until a file whose name holds `part` exists under root (True), or the process ended."""
    end = time.time() + limit_s
    while time.time() < end and proc.poll() is None:
        for _, _, names in os.walk(root):
            if any(part in n for n in names):
                return True
        time.sleep(0.05)
    return False


def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def run_case(case, args, ranks, base, scratch):
    work = os.path.join(scratch, re.sub(r"[^A-Za-z0-9]+", "_", case.name))
    shutil.copytree(base, work, symlinks=True)
    if case.setup:
        case.setup(work)
    before = snapshot(work)
    cmd = command(case, args, ranks)
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    if case.signal_after_steps:
        sig, count = case.signal_after_steps
        if wait_for_steps(os.path.join(work, "sig"), count, proc):
            for child in children(proc.pid):
                os.kill(child, getattr(signal, "SIG" + sig))
    if case.signal_when_file:
        sig, part = case.signal_when_file
        if wait_for_file(work, part, proc):
            for child in children(proc.pid):
                os.kill(child, getattr(signal, "SIG" + sig))
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = None
    seconds = time.time() - start
    text = out.decode(errors="replace")
    problems = []
    if status is None:
        problems.append(f"hung (killed after {TIMEOUT_S} s)")
    elif status == 0 and not case.succeeds:
        problems.append("exit status 0")
    elif status != 0 and case.succeeds:
        problems.append(f"exit status {status}, expected 0 (a notice, not an error)")
    flat = " ".join(text.split())
    if not re.search(case.expect, flat):
        problems.append(f"no match for /{case.expect}/")
    if case.capi and status is not None:
        lines = re.findall(r"capi_misuse rank (\d+): status (\d+): (.*)", text)
        messages = {int(r): m for r, s, m in lines if s != "0"}
        if sorted(messages) != list(range(ranks)):
            problems.append(f"the error reached ranks {sorted(messages)}, not all {ranks}")
        elif len(set(messages.values())) != 1:
            problems.append("ranks returned different messages")
    after = snapshot(work)
    # Every exit path (errors, signals) removes the temporaries of unfinished outputs and
    # releases the run dir's lock.
    for name in sorted(set(after) - set(before)):
        if ".tmp-" in name or name.endswith(".lock"):
            problems.append(f"'{name}' was left behind")
    for name, digest in before.items():
        if name in case.may_change and name in after:
            continue
        if after.get(name) != digest:
            problems.append(f"'{name}' " + ("is gone" if name not in after else "changed"))
    if not problems:
        shutil.rmtree(work, ignore_errors=True)
    return problems, seconds, text, status


def build_workspace(args, ranks, base):
    os.makedirs(base)
    run = lambda *a: subprocess.run(mpirun(ranks) + ["-n", str(ranks), args.bin] + list(a),
                                    cwd=base, check=True, stdout=subprocess.DEVNULL,
                                    timeout=300)
    run("generate", "heat", "--dims", "2", "--size", "12", "--samples", "8", "--steps", "5",
        "--output", "data.h5")
    write(os.path.join(base, "run.yaml"), CONFIG)
    # Two epochs, two checkpoints, so that resume cases have an older and a newer one.
    run("train", "--config", "run.yaml", "--set", "training.epochs=2", "--quiet")
    cks = sorted(os.listdir(os.path.join(base, "run", "checkpoints")))
    shutil.copy(os.path.join(base, "run", "checkpoints", cks[-1]), os.path.join(base, "ck.h5"))
    # The C API driver's model config.
    write(os.path.join(base, "model.yaml"),
          "model: {type: unet, depth: 1, base_channels: 4, norm: none, seed: 3}\n"
          "optimizer: {type: adam, lr: 1.0e-3}\ntraining: {precision: double}\n"
          "data: {normalize: false}\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--capi", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--only", default="")
    p.add_argument("--list", action="store_true")
    p.add_argument("--verbose", action="store_true", help="show the matched message")
    p.add_argument("--keep", action="store_true", help="keep the workspace of failed cases")
    args = p.parse_args()
    args.bin, args.capi = os.path.abspath(args.bin), os.path.abspath(args.capi)
    table = [c for c in cases() if args.only.lower() in c.name.lower()]
    if args.list:
        for c in table:
            print(c.name)
        print(f"{len(table)} cases")
        return 0
    scratch = tempfile.mkdtemp(prefix="shardtensor_bad_inputs_")
    failed, skipped = [], 0
    try:
        base = os.path.join(scratch, "workspace")
        build_workspace(args, args.ranks, base)
        for case in table:
            if args.ranks < case.min_ranks:
                skipped += 1
                print(f"skip  {case.name} (needs {case.min_ranks} ranks)")
                continue
            problems, seconds, text, status = run_case(case, args, args.ranks, base, scratch)
            if problems:
                failed.append(case.name)
                print(f"FAIL  {case.name} ({seconds:.1f} s, exit {status}): {'; '.join(problems)}")
                print("      " + "\n      ".join(text.strip().splitlines()[-12:]))
            else:
                flat = " ".join(text.split())
                found = re.search(case.expect, flat)
                print(f"ok    {case.name} ({seconds:.1f} s): ...{flat[max(0, found.start() - 60):found.end() + 40]}..." if args.verbose else f"ok    {case.name} ({seconds:.1f} s)")
            sys.stdout.flush()
    finally:
        if not (args.keep and failed):
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"kept {scratch}")
    ran = len(table) - skipped
    print(f"bad inputs at {args.ranks} rank(s): {ran - len(failed)} of {ran} cases passed"
          f" ({skipped} need more ranks)")
    if failed:
        print("FAIL: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
