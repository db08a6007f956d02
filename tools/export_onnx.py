#!/usr/bin/env python3
"""A config-built ShardTensor model's PyTorch mirror (tools/shardtensor_torch.py), exported
to ONNX: the same network as a file any framework reads, and what `model: {type: onnx}`
imports back (bench_scaling compares the two).

    /usr/bin/python3 tools/export_onnx.py CONFIG.yaml OUT.onnx --dims 2 --in 2 --out 1 \
        [--size 32] [--opset 17] [--seed 0]

The weights are PyTorch's default initialization (seeded), BatchNorm in evaluation mode."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import shardtensor_torch as st  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("output")
    p.add_argument("--dims", type=int, default=2)
    p.add_argument("--in", dest="in_channels", type=int, default=2)
    p.add_argument("--out", dest="out_channels", type=int, default=1)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    model, _, _ = st.load_config(a.config)
    net = st.build_model(model, a.dims, a.in_channels, a.out_channels).eval()
    x = torch.rand((1, a.in_channels) + (a.size,) * a.dims)
    torch.onnx.export(net, x, a.output, opset_version=a.opset, input_names=["input"],
                      output_names=["prediction"],
                      dynamic_axes={"input": {0: "batch"}, "prediction": {0: "batch"}})
    print(f"export_onnx: {a.config} -> {a.output} (opset {a.opset})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
