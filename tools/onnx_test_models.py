#!/usr/bin/env python3
"""Networks written in PyTorch in several styles, exported to ONNX for tests/test_onnx.cpp.

    /usr/bin/python3 tools/onnx_test_models.py OUTDIR

For each network NAME it writes OUTDIR/NAME.onnx, a random input and PyTorch's output on it
(OUTDIR/NAME.input.bin, NAME.output.bin: float32, C order) and their shapes (NAME.shape:
"input N C spatial...", "output N C spatial..."). Weights are random (seeded), the
BatchNorm running statistics too, so that no layer is an identity. The models are exported
in eval mode, as a trained network is handed over. For the networks written here, PyTorch's
gradients of the mean squared difference to a random target (NAME.target.bin) too: the
input's (NAME.input_grad.bin) and each parameter's (NAME.grads: "name count" lines, the values
in NAME.param_grads.bin in that order); and the same network exported for training
(NAME.train.onnx: batch norm on the batch's statistics, no constant folding) with PyTorch's
training-mode gradients (NAME.train.*). Exit 77 (ctest: skipped) without PyTorch or ONNX."""

import copy
import os
import sys
import zlib

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import onnx  # noqa: F401  (torch.onnx.export needs it)
except ImportError as e:  # pragma: no cover
    print(f"onnx_test_models: skipped: {e}")
    sys.exit(77)


class UNet2d(nn.Module):
    """A U-shaped 2-D network: conv + batch norm (folded into the conv by the exporter), a
    circular conv (Slices and Concats), group norm (Reshape-InstanceNormalization-...), GELU
    (Div-Erf-...), max pooling, nearest upsampling, a transposed conv, a skip concatenation."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, padding_mode="circular")
        self.gn = nn.GroupNorm(2, 8)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.c3 = nn.Conv2d(16, 3, 1)

    def forward(self, x):
        a = F.relu(self.bn(self.c1(x)))
        b = F.max_pool2d(a, 2)
        b = F.gelu(self.gn(self.c2(b)))
        b = F.interpolate(b, scale_factor=2, mode="nearest") + self.up(b)
        return self.c3(torch.cat([a, b], 1))


class ResNet1d(nn.Module):
    """A residual 1-D network: dilated convs, batch norm after an activation (kept as
    BatchNormalization), leaky ReLU, average pooling with padding, linear upsampling, a
    product of two fields, sigmoid and tanh."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Conv1d(3, 6, 5, padding=4, dilation=2)
        self.bn = nn.BatchNorm1d(6)
        self.c1 = nn.Conv1d(6, 6, 3, padding=1, groups=2)
        self.gate = nn.Conv1d(6, 6, 1)
        self.out = nn.Conv1d(6, 2, 3, padding=1)

    def forward(self, x):
        h = self.bn(F.leaky_relu(self.inp(x), 0.2))
        r = F.avg_pool1d(self.c1(h), 3, stride=2, padding=1)
        r = F.interpolate(r, scale_factor=2, mode="linear", align_corners=False)
        h = h + torch.tanh(r) * torch.sigmoid(self.gate(h))
        return self.out(h)


class Net3d(nn.Module):
    """A 3-D network: instance norm with affine weights, strided max pooling with padding,
    trilinear upsampling, a strided conv and a transposed conv with output padding."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv3d(1, 4, 3, padding=1, bias=False)  # a bias before a norm: no gradient
        self.norm = nn.InstanceNorm3d(4, affine=True)
        self.down = nn.Conv3d(4, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose3d(4, 4, 3, stride=2, padding=1, output_padding=1)
        self.out = nn.Conv3d(12, 2, 1)

    def forward(self, x):
        a = F.relu(self.norm(self.c1(x)))
        p = F.max_pool3d(a, 3, stride=2, padding=1)
        u = F.interpolate(p, scale_factor=2, mode="trilinear", align_corners=False)
        t = self.up(self.down(a))
        return self.out(torch.cat([a, u, t], 1))


class Head2d(nn.Module):
    """A classifier head: conv, global average pooling, flatten, a linear layer to one score
    (one sample: the score is the scalar the gradient test starts backward from)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.fc = nn.Linear(6, 1)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(torch.tanh(self.conv(x)), 1), 1))


class Affine2d(nn.Module):
    """Arithmetic with constants, as users write it: an input normalisation from buffers,
    a scaled difference of two branches, a constant minus a field, a constant added."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.2, -0.1]).view(1, 2, 1, 1))
        self.register_buffer("std", torch.tensor([1.5, 0.5]).view(1, 2, 1, 1))
        self.a = nn.Conv2d(2, 4, 3, padding=1)
        self.b = nn.Conv2d(2, 4, 1)

    def forward(self, x):
        x = (x - self.mean) / self.std
        h = self.a(x) * 0.5 - self.b(x)
        return 1.0 - torch.relu(h) + 2


class Acts1d(nn.Module):
    """The activations beyond ReLU: ELU, SELU, Softplus, hard sigmoid and swish (MobileNet's),
    ReLU6 (a Clip), Mish and SiLU (Sigmoid times the field), one after another between convs."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(2 if i == 0 else 4, 4, 3, padding=1)
                                    for i in range(8)])
        self.out = nn.Conv1d(4, 1, 1)

    def forward(self, x):
        acts = [F.elu, F.selu, F.softplus, F.hardsigmoid, F.hardswish, F.relu6, F.mish, F.silu]
        for conv, act in zip(self.convs, acts):
            x = act(conv(x) * 3)  # spread the inputs over the activations' bends
        return self.out(x)


class Ops2d(nn.Module):
    """The rest of the operator table: elementwise functions (Exp, Log, Sqrt, Abs, Neg, Erf,
    Reciprocal, Pow, CELU, Clip), PReLU (per channel and shared), quotients, minima and maxima
    of fields, a group norm without weights, reductions over the channels broadcast back
    (x - x.mean(1)), softmax and
    log-softmax over the channels, a split and a slice of the channels, squeeze-and-excitation
    (a pooled vector through 1x1 convs, times the field) and a global maximum added to the
    field."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(2, 6, 3, padding=1)
        self.prelu = nn.PReLU(6)
        self.shared = nn.PReLU()
        self.squeeze = nn.Conv2d(6, 3, 1)
        self.excite = nn.Conv2d(3, 6, 1)
        self.mid = nn.Conv2d(6, 6, 3, padding=1)
        self.out = nn.Conv2d(12, 3, 1)

    def forward(self, x):
        h = self.prelu(self.inp(x))
        h = h - h.mean(1, keepdim=True)
        h = h / (1 + h.amax(1, keepdim=True).abs())
        p = torch.exp(-h * h) + torch.sqrt(torch.abs(h) + 0.5) - torch.log(1 + h * h)
        q = torch.erf(h) * torch.reciprocal(h * h + 2) + F.celu(h, 0.7) - h ** 3
        h = torch.minimum(p, q) + torch.maximum(torch.clamp(h, -0.5, 0.8), -q)
        h = self.shared(F.group_norm(self.mid(h), 3)) + torch.maximum(h, torch.tensor(0.1))
        gate = self.excite(torch.relu(self.squeeze(h.mean((2, 3), keepdim=True))))
        h = h * (F.relu6(gate * 2 + 3) / 6) - h.amax((2, 3), keepdim=True)  # a hand-written hard sigmoid
        a, b, c = torch.split(h, [2, 3, 1], dim=1)
        s = torch.cat([F.softmax(h, 1), -a, torch.tanh(b), F.log_softmax(c * h, 1)[:, :1]], 1)
        return self.out(s)


class Next2d(nn.Module):
    """ConvNeXt's blocks as torchvision writes them: channels-last regions (a permute, a
    LayerNorm over the channels, Linear layers as MatMul and Add, GELU, a permute back), a
    layer scale, and the official repository's channels-first LayerNorm (x - x.mean(1)) /
    sqrt(var + eps) with per-channel weights; a stem and a downsampling conv, upsampled back."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 8, 2, stride=2)
        self.stem_norm = nn.LayerNorm(8, eps=1e-6)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.norm = nn.LayerNorm(8, eps=1e-6)
        self.expand = nn.Linear(8, 32)
        self.project = nn.Linear(32, 8)
        self.layer_scale = nn.Parameter(torch.full((8, 1, 1), 0.5))
        self.cf_weight = nn.Parameter(torch.ones(8))
        self.cf_bias = nn.Parameter(torch.zeros(8))
        self.out = nn.ConvTranspose2d(8, 3, 2, stride=2)

    def forward(self, x):
        h = self.stem(x).permute(0, 2, 3, 1)
        h = self.stem_norm(h).permute(0, 3, 1, 2)
        r = self.dw(h).permute(0, 2, 3, 1)
        r = self.project(F.gelu(self.expand(self.norm(r)))).permute(0, 3, 1, 2)
        h = h + self.layer_scale * r
        u = h.mean(1, keepdim=True)
        v = (h - u).pow(2).mean(1, keepdim=True)
        h = (h - u) / torch.sqrt(v + 1e-6)
        h = self.cf_weight[:, None, None] * h + self.cf_bias[:, None, None]
        return self.out(h)


class Pads2d(nn.Module):
    """Asymmetric pads and ceil_mode: latent diffusion's downsampling (F.pad(x, (0, 1, 0, 1)),
    then a stride-2 conv), a reflect pad wider on one side, max and average pooling with
    ceil_mode (GoogLeNet's, SqueezeNet's) whose last windows run past the padded field (with
    and without the padding counted), and bilinear upsampling with align_corners=True."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(2, 6, 3, padding=1)
        self.down = nn.Conv2d(6, 6, 3, stride=2)
        self.side = nn.Conv2d(6, 6, (4, 3))
        self.out = nn.Conv2d(6, 3, 1)

    def forward(self, x):
        h = self.down(F.pad(self.inp(x), (0, 1, 0, 1)))
        e = self.side(F.pad(torch.relu(h), (1, 1, 2, 1), mode="reflect"))
        m = F.max_pool2d(e, 3, stride=2, ceil_mode=True)
        b = F.avg_pool2d(m, 3, stride=2, padding=1, ceil_mode=True)
        c = F.avg_pool2d(m, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        d = F.avg_pool2d(b * c, 2, stride=2, ceil_mode=True)
        gate = torch.sigmoid(d.mean((2, 3), keepdim=True)) + (b + c).amax((2, 3), keepdim=True)
        u = F.interpolate(m * gate, scale_factor=2, mode="bilinear", align_corners=True)
        return self.out(F.interpolate(u + e, scale_factor=2, mode="nearest"))


# (name, model, input shape, opset[, input cells a part must hold: 7x7 convs at stride 2 need 6])
MODELS = [
    ("next2d", Next2d, (2, 2, 32, 24), 13, 6),
    ("next2d_opset17", Next2d, (1, 2, 32, 24), 17, 6),  # LayerNormalization as one op
    ("ops2d", Ops2d, (2, 2, 12, 10), 13),
    ("pads2d", Pads2d, (2, 2, 64, 96), 13, 16),
    ("acts1d", Acts1d, (2, 2, 24), 14),
    ("affine2d", Affine2d, (2, 2, 12, 10), 13),
    ("head2d", Head2d, (1, 2, 16, 12), 13),
    ("unet2d", UNet2d, (2, 2, 24, 20), 13),
    ("resnet1d", ResNet1d, (1, 3, 40), 17),
    ("net3d", Net3d, (1, 1, 12, 10, 8), 14),
]


def torchvision_models():
    """Networks no one wrote for ShardTensor (python3-torchvision, random weights): (name, make,
    input shape, opset, total stride: each rank's part of the last axis must hold that many
    cells, enough for the dilated stages' halos too). Empty without torchvision."""
    try:
        import torchvision.models as tv
    except ImportError:
        return []
    return [
        ("tv_resnet18", lambda: tv.resnet18(num_classes=10), (2, 3, 64, 128), 13, 32),
        ("tv_r3d_18", lambda: tv.video.r3d_18(num_classes=5), (1, 3, 8, 16, 64), 13, 16),
        ("tv_fcn_resnet50",
         lambda: tv.segmentation.fcn_resnet50(num_classes=3, weights_backbone=None,
                                              aux_loss=False), (1, 3, 32, 128), 13, 32),
        # Squeeze-and-excitation (pooled vectors through 1x1 convs gating fields), hard swish.
        ("tv_mobilenet_v3_small", lambda: tv.mobilenet_v3_small(num_classes=10),
         (1, 3, 64, 256), 13, 64),  # 5x5 convs at stride 32: two cells a part
        # Lite R-ASPP: a pooled branch gating the field, the stride-8 and stride-16 features
        # resized and added, the result resized to the input's size.
        ("tv_lraspp_mobilenet",
         lambda: tv.segmentation.lraspp_mobilenet_v3_large(num_classes=3, weights_backbone=None),
         (1, 3, 32, 256), 13, 64),  # 5x5 convs dilated by 2 at stride 16: four cells a part
        # Channels-last blocks (permute, LayerNorm, Linear as MatMul, GELU, permute back),
        # layer scales, a LayerNorm of the pooled vector before the head.
        ("tv_convnext_tiny", lambda: tv.convnext_tiny(num_classes=10), (1, 3, 32, 512), 13, 128),
        # Max pooling with ceil_mode, Fire modules (squeeze, two expands concatenated).
        ("tv_squeezenet1_1", lambda: tv.squeezenet1_1(num_classes=10), (1, 3, 64, 256), 13, 64),
        # Inception blocks (four branches concatenated), ceil_mode max pooling with and without
        # padding.
        # Channel split (Slices of the channels), concatenation and channel shuffle (Reshape,
        # Transpose, Reshape of the channels).
        ("tv_shufflenet_v2_x0_5", lambda: tv.shufflenet_v2_x0_5(num_classes=10),
         (1, 3, 64, 256), 13, 64),
        ("tv_googlenet",
         lambda: tv.googlenet(num_classes=10, aux_logits=False, init_weights=False),
         (1, 3, 64, 256), 13, 64),
    ]


class FcnOut(nn.Module):
    """torchvision's segmentation models return a dict; the exported graph is its 'out'."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)["out"]


def randomize(model, generator):
    for p in model.parameters():
        with torch.no_grad():
            # Uniform in +-bound with PyTorch's fan-in bound: deep networks stay O(1).
            fan_in = p[0].numel() if p.dim() > 1 else max(p.numel(), 1)
            bound = 1.2 / fan_in ** 0.5 if p.dim() > 1 else 0.6
            p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=generator) - 0.5)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=generator) + 0.5)


def write_gradients(model, x, y, base, generator):
    """PyTorch's gradients of mean((model(x) - target)^2) for a random target (eval mode)."""
    target = torch.rand(y.shape, generator=generator) * 2 - 1
    x = x.clone().requires_grad_(True)
    model.zero_grad()
    F.mse_loss(model(x), target).backward()
    target.numpy().astype(np.float32).tofile(base + ".target.bin")
    x.grad.numpy().astype(np.float32).tofile(base + ".input_grad.bin")
    grads = [(n, p.grad.reshape(-1)) for n, p in model.named_parameters() if p.grad is not None]
    torch.cat([g for _, g in grads]).numpy().astype(np.float32).tofile(base + ".param_grads.bin")
    with open(base + ".grads", "w") as f:
        for n, g in grads:
            f.write(f"{n} {g.numel()}\n")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    models = [(m + (1,))[:5] for m in MODELS]
    for name, make, shape, opset, stride in models + torchvision_models():
        # A seed per network: adding one leaves the others' weights and inputs as they were.
        generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        model = make()
        if name.startswith("tv_fcn") or name.startswith("tv_lraspp"):
            model = FcnOut(model)
        randomize(model, generator)
        model.eval()
        x = torch.rand(shape, generator=generator) * 2 - 1
        with torch.no_grad():
            y = model(x)
        if not name.startswith("tv_"):
            write_gradients(model, x, y, os.path.join(out, name), generator)
        if not name.startswith("tv_") and name != "head2d":
            base = os.path.join(out, name + ".train")
            torch.onnx.export(copy.deepcopy(model).train(), x, base + ".onnx", opset_version=opset,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, input_names=["input"],
                              output_names=["output"],
                              dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
            trained = copy.deepcopy(model).train()
            write_gradients(trained, x, trained(x).detach(), base, generator)
        path = os.path.join(out, name + ".onnx")
        torch.onnx.export(model, x, path, opset_version=opset, input_names=["input"],
                          output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
        x.numpy().astype(np.float32).tofile(os.path.join(out, name + ".input.bin"))
        y.numpy().astype(np.float32).tofile(os.path.join(out, name + ".output.bin"))
        with open(os.path.join(out, name + ".shape"), "w") as f:
            f.write("input " + " ".join(map(str, x.shape)) + "\n")
            f.write("output " + " ".join(map(str, y.shape)) + "\n")
            f.write(f"stride {stride}\n")
        print(f"onnx_test_models: {path}: opset {opset}, input {tuple(x.shape)}, "
              f"output {tuple(y.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
