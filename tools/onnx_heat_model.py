#!/usr/bin/env python3
"""A PyTorch network for the heat-equation data (2 input channels: u0 and kappa; 1 output),
exported to ONNX, and PyTorch's predictions on a data file, for tests/onnx_cli.sh.

    /usr/bin/python3 tools/onnx_heat_model.py export MODEL.onnx
    /usr/bin/python3 tools/onnx_heat_model.py export-classifier MODEL.onnx
    /usr/bin/python3 tools/onnx_heat_model.py compare MODEL.onnx DATA.h5 PREDICTIONS.h5

`compare` runs the exported network's PyTorch twin (same seed) on DATA.h5's `input` and
prints the largest difference to PREDICTIONS.h5's `prediction`, relative to the largest
prediction; it exits 1 above 1e-5. Exit 77 (ctest: skipped) without PyTorch, ONNX or h5py."""

import sys

try:
    import h5py
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import onnx  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"onnx_heat_model: skipped: {e}")
    sys.exit(77)


class HeatNet(nn.Module):
    """A small U-shaped network with periodic convolutions, as one would write it in PyTorch,
    and a per-channel scale (a layer scale: an initializer that trains where listed)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(2, 8, 3, padding=1, padding_mode="circular")
        self.mid = nn.Conv2d(8, 8, 3, padding=1, padding_mode="circular")
        self.dec = nn.Conv2d(16, 8, 3, padding=1, padding_mode="circular")
        self.head = nn.Conv2d(8, 1, 1)
        self.skip = nn.Conv2d(2, 1, 1)
        self.scale = nn.Parameter(torch.full((8, 1, 1), 0.7))

    def forward(self, x):
        a = F.gelu(self.enc(x)) * self.scale
        b = F.gelu(self.mid(F.avg_pool2d(a, 2)))
        b = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(F.gelu(self.dec(torch.cat([a, b], 1)))) + self.skip(x)


class HeatClassifier(nn.Module):
    """A network that ends in a pooled vector: three scores per sample."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 8, 3, padding=1, padding_mode="circular")
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1), 1))


def model(classifier=False):
    torch.manual_seed(7)
    return (HeatClassifier() if classifier else HeatNet()).eval()


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("export", "export-classifier"):
        x = torch.rand(1, 2, 32, 32)
        net = model(sys.argv[1] == "export-classifier")
        torch.onnx.export(net, x, sys.argv[2], opset_version=17, input_names=["input"],
                          output_names=["prediction"],
                          dynamic_axes={"input": {0: "batch"}, "prediction": {0: "batch"}})
        print(f"onnx_heat_model: wrote {sys.argv[2]}")
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "compare":
        with h5py.File(sys.argv[3], "r") as f:
            x = torch.tensor(np.asarray(f["input"], dtype=np.float32))
        with h5py.File(sys.argv[4], "r") as f:
            ours = np.asarray(f["prediction"], dtype=np.float64)
        with torch.no_grad():
            theirs = model(ours.ndim == 2)(x).numpy().astype(np.float64)
        if ours.shape != theirs.shape:
            print(f"onnx_heat_model: shapes differ: {ours.shape} against PyTorch's {theirs.shape}")
            return 1
        error = np.abs(ours - theirs).max() / np.abs(theirs).max()
        print(f"onnx_heat_model: {ours.shape[0]} samples, max |ShardTensor - PyTorch| / "
              f"max |PyTorch| = {error:.2e}")
        return 0 if error <= 1e-5 else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
