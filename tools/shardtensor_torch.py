"""PyTorch mirrors of ShardTensor's config-built models (`unet` and `sequential`).

    import shardtensor_torch as st
    model_cfg, run_cfg, text = st.load_config("run.yaml")      # a run config or a model YAML
    net = st.build_model(model_cfg, dims=2, in_channels=2, out_channels=1)
    net.eval()
    y = net(torch.randn(1, 2, 32, 32))

`build_model` reads the same YAML `model` section as ShardTensor's C++ builder
(models/src/builder.cpp), checks it the same way (unknown keys and values are errors that
name the key), and returns an `nn.Module` that computes what ShardTensor computes, with
`state_dict()` keys equal to ShardTensor's parameter and buffer names
(`down0.conv0.weight`, `3.layers.0.weight`, `5.running_mean`, ...). The only extra keys are
BatchNorm's `num_batches_tracked`, which ShardTensor does not keep; `shardtensor_names`
lists the names ShardTensor expects. docs/pytorch.md describes the correspondence.

Semantics mirrored from the C++ layers:
  - Conv: weight (out, in/groups, k...), PyTorch's cross-correlation; `padding_mode`
    zeros / periodic (PyTorch "circular") / replicate / reflect.
  - ConvTranspose: weight (in, out/groups, k...), zero padding, output_padding.
  - GroupNorm: statistics per (sample, group) over the group's channels and every cell,
    biased variance, per-channel affine (PyTorch's nn.GroupNorm).
  - LayerNorm: GroupNorm with one group (per-channel affine, shape (C)); NOT PyTorch's
    nn.LayerNorm over (C, spatial...), whose affine has one weight per cell.
  - BatchNorm: PyTorch's BatchNorm1d/2d/3d (evaluation uses the running statistics).
  - Pooling: window, stride (default the window), padding at most half the window; max
    pooling pads with -inf, average pooling with zeros counted in the divisor
    (count_include_pad=True); periodic padding wraps around (then the window is always full).
  - Upsample: integer scale; nearest (source o // s) or linear (align_corners=False,
    edges clamped: PyTorch's linear / bilinear / trilinear).
  - Activations: relu, leaky_relu (slope, default 0.01), gelu (exact erf form), silu, tanh,
    sigmoid. Dropout is the identity in evaluation mode.
"""

from __future__ import annotations

import collections
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "ConfigError",
    "load_config",
    "model_section",
    "build_model",
    "build_unet",
    "build_sequential",
    "UNet",
    "Residual",
    "Pool",
    "shardtensor_names",
    "infer_shape",
]


class ConfigError(ValueError):
    """A model section the mirror (or ShardTensor) does not accept; names the key."""


# ---------------------------------------------------------------------------------------
# Config reading
# ---------------------------------------------------------------------------------------

ACTIVATIONS = ["relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid"]
PADDING_MODES = ["zeros", "periodic", "replicate", "reflect"]
NORMS = ["group", "batch", "layer", "none"]
DOWN_MODES = ["maxpool", "avgpool", "conv"]
UP_MODES = ["transpose", "nearest", "linear"]
UNET_KEYS = ["type", "depth", "base_channels", "norm", "norm_groups", "activation", "down",
             "up", "padding", "blocks", "seed", "input_skip", "recompute"]
SEQUENTIAL_KEYS = ["type", "layers", "seed"]
LAYER_KEYS = {
    "conv": ["type", "out_channels", "kernel", "stride", "dilation", "padding", "padding_mode",
             "groups", "bias", "seed"],
    "conv_transpose": ["type", "out_channels", "kernel", "stride", "dilation", "padding",
                       "output_padding", "groups", "bias", "seed"],
    "pool": ["type", "kind", "kernel", "stride", "padding", "padding_mode"],
    "upsample": ["type", "scale", "mode"],
    "group_norm": ["type", "groups", "eps", "affine"],
    "layer_norm": ["type", "eps", "affine"],
    "batch_norm": ["type", "momentum", "eps", "affine"],
    "activation": ["type", "function", "slope"],
    "dropout": ["type", "p", "seed"],
    "residual": ["type", "layers"],
}
TORCH_PADDING = {"zeros": "zeros", "periodic": "circular", "replicate": "replicate",
                 "reflect": "reflect"}


def _yaml():
    try:
        import yaml  # python3-yaml
    except ImportError as e:  # pragma: no cover - Debian has it with python3-torch's deps
        raise ConfigError("reading YAML configs needs python3-yaml (apt-get install "
                          "python3-yaml)") from e
    return yaml


def model_section(config: dict, source: str = "config") -> dict:
    """The `model` map of a run config, or the config itself if it is a model map."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a YAML map, got {type(config).__name__}")
    if "model" in config:
        if not isinstance(config["model"], dict):
            raise ConfigError(f"{source}: model: expected a map of keys")
        return config["model"]
    if "type" in config:
        return config
    raise ConfigError(f"{source}: neither a run config (no 'model' key) nor a model map "
                      "(no 'type' key)")


def load_config(path: str) -> Tuple[dict, Optional[dict], str]:
    """Reads a run config or a model YAML: (model section, run config or None, file text)."""
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    config = _yaml().safe_load(text)
    model = model_section(config, path)
    return model, (config if isinstance(config, dict) and "model" in config else None), text


class _Map:
    """A config map with an accepted key list; values read with their key paths."""

    def __init__(self, node, path: str, accepted: Sequence[str]):
        if not isinstance(node, dict):
            raise ConfigError(f"{path}: expected a map of keys, got {node!r}")
        for key in node:
            if key not in accepted:
                raise ConfigError(f"{path}: unknown key '{key}'; accepted keys: "
                                  + ", ".join(accepted))
        self.node, self.path = node, path

    def has(self, key):
        return key in self.node and self.node[key] is not None

    def integer(self, key, default, minimum):
        if not self.has(key):
            return default
        return _integer(self.node[key], f"{self.path}.{key}", minimum)

    def required(self, key, hint=""):
        if not self.has(key):
            raise ConfigError(f"{self.path}: missing required key '{key}'{hint}")
        return self.node[key]

    def real(self, key, default, lo, hi):
        if not self.has(key):
            return float(default)
        v = self.node[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"{self.path}.{key}: expected a number, got {v!r}") from None
        if not lo <= v <= hi:
            raise ConfigError(f"{self.path}.{key}: value {v} outside [{lo}, {hi}]")
        return float(v)

    def boolean(self, key, default):
        if not self.has(key):
            return default
        v = self.node[key]
        if not isinstance(v, bool):
            raise ConfigError(f"{self.path}.{key}: expected true or false, got {v!r}")
        return v

    def choice(self, key, default, choices):
        if not self.has(key):
            return default
        v = self.node[key]
        if v not in choices:
            raise ConfigError(f"{self.path}.{key}: unknown value {v!r}; accepted values: "
                              + ", ".join(choices))
        return v

    def sizes(self, key, dims, default, minimum):
        if not self.has(key):
            return [default] * dims
        v = self.node[key]
        path = f"{self.path}.{key}"
        if isinstance(v, list):
            if len(v) != dims:
                raise ConfigError(f"{path}: expected {dims} sizes (one per spatial dim), "
                                  f"got {len(v)}")
            return [_integer(x, f"{path}[{i}]", minimum) for i, x in enumerate(v)]
        return [_integer(v, path, minimum)] * dims


def _integer(v, path, minimum):
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{path}: expected an integer, got {v!r}")
    if v < minimum:
        raise ConfigError(f"{path}: value {v} must be at least {minimum}")
    return v


def _check_shape(dims, in_channels, out_channels):
    if dims not in (1, 2, 3):
        raise ConfigError(f"build_model: dims {dims} outside [1, 3]")
    if in_channels < 1 or out_channels < 1:
        raise ConfigError(f"build_model: in_channels {in_channels} and out_channels "
                          f"{out_channels} must be at least 1")


# ---------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------

def _conv_class(dims):
    return {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]


def _conv_transpose_class(dims):
    return {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}[dims]


def _batch_norm_class(dims):
    return {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]


def _activation(name: str, slope: float = 0.01) -> nn.Module:
    if name == "relu":
        return nn.ReLU()
    if name == "leaky_relu":
        return nn.LeakyReLU(slope)
    if name == "gelu":
        return nn.GELU()  # exact erf form, as ShardTensor
    if name == "silu":
        return nn.SiLU()
    if name == "tanh":
        return nn.Tanh()
    if name == "sigmoid":
        return nn.Sigmoid()
    raise ConfigError(f"unknown activation {name!r}; accepted values: " + ", ".join(ACTIVATIONS))


class Pool(nn.Module):
    """ShardTensor's Pool: max (-inf padding) or average (zero padding counted in the
    divisor) pooling; periodic padding wraps around before a padding-free pool."""

    def __init__(self, dims, kind, kernel, stride, padding, padding_mode="zeros"):
        super().__init__()
        self.dims, self.kind, self.padding_mode = dims, kind, padding_mode
        self.kernel, self.stride, self.padding = list(kernel), list(stride), list(padding)
        self.periodic = padding_mode == "periodic" and any(p > 0 for p in padding)
        torch_padding = [0] * dims if self.periodic else list(padding)
        if kind == "max":
            cls = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}[dims]
            self.pool = cls(self.kernel, self.stride, torch_padding)
        else:
            cls = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}[dims]
            self.pool = cls(self.kernel, self.stride, torch_padding, count_include_pad=True)

    def forward(self, x):
        if self.periodic:
            pads = []
            for p in reversed(self.padding):  # F.pad: last dim first
                pads += [p, p]
            x = F.pad(x, pads, mode="circular")
        return self.pool(x)


class Residual(nn.Module):
    """y = layers(x) + x, or + projection(x) (1x1 conv with bias) when the channels change."""

    def __init__(self, layers: nn.Sequential, projection: Optional[nn.Module] = None):
        super().__init__()
        self.layers = layers
        if projection is not None:
            self.projection = projection
        else:
            self.projection = None

    def forward(self, x):
        y = self.layers(x)
        skip = self.projection(x) if self.projection is not None else x
        if y.shape != skip.shape:
            raise RuntimeError(f"Residual: its layers turn {tuple(skip.shape)} into "
                               f"{tuple(y.shape)}; a residual block must keep the field's size")
        return y + skip


class UNet(nn.Module):
    """ShardTensor's UNet (models/src/unet.cpp) with the same module and parameter names."""

    def __init__(self, dims=2, in_channels=1, out_channels=1, depth=4, base_channels=32,
                 norm="group", norm_groups=8, activation="relu", down="maxpool",
                 up="transpose", padding="zeros", blocks=2, input_skip=False, recompute=False):
        super().__init__()
        # recompute: each level's blocks through torch.utils.checkpoint (PyTorch's per-level
        # activation checkpointing, the peer of ShardTensor's model.recompute).
        self.recompute = recompute
        self.dims, self.depth, self.base_channels = dims, depth, base_channels
        self.norm, self.norm_groups, self.activation = norm, norm_groups, activation
        self.down_mode, self.up_mode, self.padding = down, up, padding
        self.blocks, self.input_skip = blocks, input_skip
        if dims not in (1, 2, 3):
            raise ConfigError(f"UNet: dims {dims} outside [1, 3]")
        if not 0 <= depth <= 16:
            raise ConfigError(f"UNet: depth {depth} outside [0, 16]")
        if norm == "group" and base_channels % norm_groups != 0:
            raise ConfigError(f"UNet: norm_groups {norm_groups} does not divide base_channels "
                              f"{base_channels}")
        c = self.channels
        # Registration follows ShardTensor's order (the data flow).
        for l in range(depth):
            self.add_module(f"down{l}", self._block(in_channels if l == 0 else c(l - 1), c(l)))
            self.add_module(f"downsample{l}", self._down(c(l)))
        self.bottom = self._block(in_channels if depth == 0 else c(depth - 1), c(depth))
        for l in reversed(range(depth)):
            self.add_module(f"upsample{l}", self._up(c(l + 1), c(l)))
            self.add_module(f"up{l}", self._block(2 * c(l), c(l)))
        self.head = self._conv(c(0), out_channels, 1, 1, True)
        self.skip = self._conv(in_channels, out_channels, 1, 1, True) if input_skip else None

    def channels(self, level):
        return self.base_channels * (2 ** level)

    def _conv(self, cin, cout, kernel, stride, bias):
        return _conv_class(self.dims)(
            cin, cout, kernel, stride=stride, padding=1 if kernel == 3 else 0, bias=bias,
            padding_mode=TORCH_PADDING[self.padding] if kernel == 3 else "zeros")

    def _norm(self, channels):
        if self.norm == "group":
            return nn.GroupNorm(self.norm_groups, channels, eps=1e-5, affine=True)
        if self.norm == "layer":
            return nn.GroupNorm(1, channels, eps=1e-5, affine=True)
        return _batch_norm_class(self.dims)(channels, eps=1e-5, momentum=0.1, affine=True)

    def _block(self, cin, cout):
        layers = collections.OrderedDict()
        for i in range(self.blocks):
            normalized = self.norm != "none"
            layers[f"conv{i}"] = self._conv(cin if i == 0 else cout, cout, 3, 1, not normalized)
            if normalized:
                layers[f"norm{i}"] = self._norm(cout)
            layers[f"activation{i}"] = _activation(self.activation)
        return nn.Sequential(layers)

    def _down(self, channels):
        if self.down_mode == "conv":
            return self._conv(channels, channels, 2, 2, True)
        return Pool(self.dims, "max" if self.down_mode == "maxpool" else "average",
                    [2] * self.dims, [2] * self.dims, [0] * self.dims)

    def _up(self, cin, cout):
        if self.up_mode == "transpose":
            return _conv_transpose_class(self.dims)(cin, cout, 2, stride=2, bias=True)
        mode = "nearest" if self.up_mode == "nearest" else \
            {1: "linear", 2: "bilinear", 3: "trilinear"}[self.dims]
        resize = nn.Upsample(scale_factor=2, mode=mode,
                             align_corners=None if mode == "nearest" else False)
        return nn.Sequential(collections.OrderedDict(
            resize=resize, conv=self._conv(cin, cout, 3, 1, True)))

    def forward(self, x):
        factor = 2 ** self.depth
        for d, n in enumerate(x.shape[2:]):
            if n % factor:
                raise RuntimeError(f"UNet: field extent {n} along dim {d} is not divisible by "
                                   f"2^depth = {factor}")
        def block(module, h):
            if self.recompute and self.training and torch.is_grad_enabled():
                return torch.utils.checkpoint.checkpoint(module, h, use_reentrant=False)
            return module(h)

        skips = []
        h = x
        for l in range(self.depth):
            h = block(getattr(self, f"down{l}"), h)
            skips.append(h)
            h = getattr(self, f"downsample{l}")(h)
        h = block(self.bottom, h)
        for l in reversed(range(self.depth)):
            h = getattr(self, f"upsample{l}")(h)
            h = block(getattr(self, f"up{l}"), torch.cat([skips[l], h], dim=1))  # the skip first
        h = self.head(h)
        return h + self.skip(x) if self.skip is not None else h


def build_unet(model: dict, dims: int, in_channels: int, out_channels: int,
               key: str = "model") -> UNet:
    _check_shape(dims, in_channels, out_channels)
    m = _Map(model, key, UNET_KEYS)
    if m.node.get("type") != "unet":
        raise ConfigError(f"{key}.type: expected 'unet', got {m.node.get('type')!r}")
    depth = m.integer("depth", 4, 0)
    if depth > 16:
        raise ConfigError(f"{key}.depth: depth {depth} outside [0, 16]")
    base = m.integer("base_channels", 32, 1)
    norm = m.choice("norm", "group", NORMS)
    groups = m.integer("norm_groups", 8, 1)
    if norm == "group" and base % groups:
        raise ConfigError(f"{key}.{'norm_groups' if m.has('norm_groups') else 'base_channels'}: "
                          f"norm_groups {groups} does not divide base_channels {base} (every "
                          "level has a multiple of base_channels)")
    if m.has("seed"):
        _integer(m.node["seed"], f"{key}.seed", 0)
    return UNet(dims=dims, in_channels=in_channels, out_channels=out_channels, depth=depth,
                base_channels=base, norm=norm, norm_groups=groups,
                activation=m.choice("activation", "relu", ACTIVATIONS),
                down=m.choice("down", "maxpool", DOWN_MODES),
                up=m.choice("up", "transpose", UP_MODES),
                padding=m.choice("padding", "zeros", PADDING_MODES),
                blocks=m.integer("blocks", 2, 1),
                input_skip=m.boolean("input_skip", False),
                recompute=m.boolean("recompute", False))


class _SequentialBuilder:
    """Mirrors SequentialBuilder in models/src/builder.cpp (channel rule included)."""

    def __init__(self, dims, in_channels, out_channels):
        self.dims, self.in_channels, self.out_channels = dims, in_channels, out_channels

    def build_list(self, layers, path, channels, top_level):
        if not isinstance(layers, list) or not layers:
            raise ConfigError(f"{path}: expected a non-empty list of layer maps, got {layers!r}")
        last_conv = len(layers)
        if top_level:
            for i, layer in enumerate(layers):
                if isinstance(layer, dict) and layer.get("type") in ("conv", "conv_transpose"):
                    last_conv = i
        modules = collections.OrderedDict()
        for i, layer in enumerate(layers):
            module, channels = self.build_layer(layer, f"{path}[{i}]", channels, i == last_conv)
            modules[str(i)] = module
        return nn.Sequential(modules), channels

    def _out_channels(self, m, channels, defaults_to_out):
        if not m.has("out_channels"):
            return self.out_channels if defaults_to_out else channels
        v = m.node["out_channels"]
        if v == "out":
            return self.out_channels
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{m.path}.out_channels: expected a positive integer or 'out' "
                              f"(the model's out_channels), got {v!r}")
        return v

    def build_layer(self, node, path, channels, defaults_to_out):
        if not isinstance(node, dict):
            raise ConfigError(f"{path}: expected a layer map, got {node!r}")
        if "type" not in node:
            raise ConfigError(f"{path}: missing required key 'type'; accepted values: "
                              + ", ".join(LAYER_KEYS))
        kind = node["type"]
        if kind not in LAYER_KEYS:
            raise ConfigError(f"{path}.type: unknown value {kind!r}; accepted values: "
                              + ", ".join(LAYER_KEYS))
        m = _Map(node, path, LAYER_KEYS[kind])
        dims = self.dims
        if kind == "conv":
            out = self._out_channels(m, channels, defaults_to_out)
            m.required("kernel")
            kernel = m.sizes("kernel", dims, None, 1)
            stride = m.sizes("stride", dims, 1, 1)
            dilation = m.sizes("dilation", dims, 1, 1)
            if m.has("padding") and m.node["padding"] == "same":
                padding = []
                for d in range(dims):
                    if kernel[d] % 2 == 0:
                        raise ConfigError(f"{path}.padding: 'same' padding needs an odd kernel, "
                                          f"got {kernel[d]} along dim {d}")
                    padding.append(dilation[d] * (kernel[d] - 1) // 2)
            else:
                padding = m.sizes("padding", dims, 0, 0)
            mode = m.choice("padding_mode", "zeros", PADDING_MODES)
            groups = m.integer("groups", 1, 1)
            self._check_groups(path, groups, channels, out, "Conv")
            module = _conv_class(dims)(channels, out, kernel, stride=stride, padding=padding,
                                       dilation=dilation, groups=groups,
                                       bias=m.boolean("bias", True),
                                       padding_mode=TORCH_PADDING[mode])
            return module, out
        if kind == "conv_transpose":
            out = self._out_channels(m, channels, defaults_to_out)
            m.required("kernel")
            kernel = m.sizes("kernel", dims, None, 1)
            stride = m.sizes("stride", dims, 1, 1)
            dilation = m.sizes("dilation", dims, 1, 1)
            padding = m.sizes("padding", dims, 0, 0)
            output_padding = m.sizes("output_padding", dims, 0, 0)
            for d in range(dims):
                if output_padding[d] >= max(stride[d], dilation[d]):
                    raise ConfigError(f"{path}.output_padding: {output_padding[d]} along dim {d} "
                                      "must be smaller than the stride or the dilation")
            groups = m.integer("groups", 1, 1)
            self._check_groups(path, groups, channels, out, "ConvTranspose")
            module = _conv_transpose_class(dims)(
                channels, out, kernel, stride=stride, padding=padding,
                output_padding=output_padding, groups=groups, bias=m.boolean("bias", True),
                dilation=dilation)
            return module, out
        if kind == "pool":
            pool_kind = m.choice("kind", "max", ["max", "average"])
            m.required("kernel")
            kernel = m.sizes("kernel", dims, None, 1)
            stride = m.sizes("stride", dims, 1, 1) if m.has("stride") else list(kernel)
            padding = m.sizes("padding", dims, 0, 0)
            for d in range(dims):
                if 2 * padding[d] > kernel[d]:
                    raise ConfigError(f"{path}.padding: {padding[d]} along dim {d} exceeds half "
                                      f"the window {kernel[d]}")
            mode = m.choice("padding_mode", "zeros", ["zeros", "periodic"])
            return Pool(dims, pool_kind, kernel, stride, padding, mode), channels
        if kind == "upsample":
            scale = m.sizes("scale", dims, 2, 1)
            mode = m.choice("mode", "nearest", ["nearest", "linear"])
            torch_mode = "nearest" if mode == "nearest" else \
                {1: "linear", 2: "bilinear", 3: "trilinear"}[dims]
            return nn.Upsample(scale_factor=tuple(float(s) for s in scale), mode=torch_mode,
                               align_corners=None if mode == "nearest" else False), channels
        if kind in ("group_norm", "layer_norm"):
            groups = 1 if kind == "layer_norm" else _integer(m.required("groups"),
                                                              f"{path}.groups", 1)
            if channels % groups:
                raise ConfigError(f"{path}: GroupNorm '{path}': num_groups {groups} must divide "
                                  f"channels {channels}")
            return nn.GroupNorm(groups, channels, eps=m.real("eps", 1e-5, 0, 1),
                                affine=m.boolean("affine", True)), channels
        if kind == "batch_norm":
            return _batch_norm_class(dims)(channels, eps=m.real("eps", 1e-5, 0, 1),
                                           momentum=m.real("momentum", 0.1, 0, 1),
                                           affine=m.boolean("affine", True)), channels
        if kind == "activation":
            function = m.node.get("function")
            if function is None:
                raise ConfigError(f"{path}: missing required key 'function'; accepted values: "
                                  + ", ".join(ACTIVATIONS))
            function = m.choice("function", None, ACTIVATIONS)
            return _activation(function, m.real("slope", 0.01, -1e30, 1e30)), channels
        if kind == "dropout":
            return nn.Dropout(m.real("p", 0.5, 0, 0.999999)), channels
        # residual
        cin = channels
        layers, channels = self.build_list(m.required("layers"), f"{path}.layers", channels,
                                           False)
        projection = _conv_class(dims)(cin, channels, 1, bias=True) if channels != cin else None
        return Residual(layers, projection), channels

    @staticmethod
    def _check_groups(path, groups, cin, cout, kind):
        if cin % groups or cout % groups:
            raise ConfigError(f"{path}: {kind} '{path}': groups {groups} must divide in_channels "
                              f"{cin} and out_channels {cout}")


def build_sequential(model: dict, dims: int, in_channels: int, out_channels: int,
                     key: str = "model") -> nn.Sequential:
    _check_shape(dims, in_channels, out_channels)
    m = _Map(model, key, SEQUENTIAL_KEYS)
    if m.has("seed"):
        _integer(m.node["seed"], f"{key}.seed", 0)
    builder = _SequentialBuilder(dims, in_channels, out_channels)
    net, channels = builder.build_list(m.required("layers"), f"{key}.layers", in_channels, True)
    if channels != out_channels:
        raise ConfigError(f"{key}.layers: the layers end with {channels} channels, but the "
                          f"model's out_channels is {out_channels}; end with a conv whose "
                          "out_channels is omitted or 'out'")
    return net


def build_model(model: dict, dims: int, in_channels: int, out_channels: int,
                key: str = "model") -> nn.Module:
    """The PyTorch mirror of ShardTensor's build_model for a `model` section."""
    if not isinstance(model, dict):
        raise ConfigError(f"{key}: expected a map of keys, got {model!r}")
    kind = model.get("type")
    if kind == "unet":
        return build_unet(model, dims, in_channels, out_channels, key)
    if kind == "sequential":
        return build_sequential(model, dims, in_channels, out_channels, key)
    if kind is None:
        raise ConfigError(f"{key}: missing required key 'type'; accepted values: unet, "
                          "sequential")
    raise ConfigError(f"{key}.type: unknown value {kind!r}; ShardTensor's config builder "
                      "builds 'unet' and 'sequential' models only (FNO and ViT are C++-only "
                      "and have no importer)")


# ---------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------

def group_norm_in_float_under_cpu_autocast(net: nn.Module) -> None:
    """Makes net's GroupNorms take float input, as CUDA's autocast runs group_norm: PyTorch
    1.13's CPU autocast hands it bf16 input with float weights, which fails."""
    for module in net.modules():
        if isinstance(module, nn.GroupNorm):
            module.register_forward_pre_hook(lambda _, inputs: (inputs[0].float(),))


def shardtensor_names(module: nn.Module) -> Tuple["collections.OrderedDict[str, tuple]",
                                                  "collections.OrderedDict[str, tuple]"]:
    """(parameters, buffers): ShardTensor's names and shapes for a mirror module. BatchNorm's
    num_batches_tracked (not kept by ShardTensor) is left out."""
    params = collections.OrderedDict(
        (name, tuple(p.shape)) for name, p in module.named_parameters())
    buffers = collections.OrderedDict(
        (name, tuple(b.shape)) for name, b in module.named_buffers()
        if not name.endswith("num_batches_tracked"))
    return params, buffers


def _first_conv_in(layers, state_dict, prefix):
    """In channels of a sequential model from its first conv-like layer's weight."""
    for i, layer in enumerate(layers if isinstance(layers, list) else []):
        if not isinstance(layer, dict):
            return None
        kind = layer.get("type")
        name = f"{prefix}{i}"
        if kind in ("conv", "conv_transpose"):
            w = state_dict.get(name + ".weight")
            if w is None:
                return None
            groups = layer.get("groups", 1) if isinstance(layer.get("groups", 1), int) else 1
            return int(w.shape[1]) * groups if kind == "conv" else int(w.shape[0])
        if kind == "residual":
            found = _first_conv_in(layer.get("layers"), state_dict, f"{name}.layers.")
            if found is not None:
                return found
            w = state_dict.get(name + ".projection.weight")
            return int(w.shape[1]) if w is not None else None
    return None


def infer_shape(model: dict, state_dict: Dict[str, torch.Tensor]) -> Dict[str, int]:
    """What the state_dict says about dims, in_channels and out_channels (keys it cannot
    tell are left out)."""
    shape = {}
    for name, t in state_dict.items():
        if name.endswith(".weight") and t.dim() >= 3:
            shape["dims"] = t.dim() - 2
            break
    if not isinstance(model, dict):
        return shape
    if model.get("type") == "unet":
        first = "down0.conv0.weight" if model.get("depth", 4) != 0 else "bottom.conv0.weight"
        if first in state_dict:
            shape["in_channels"] = int(state_dict[first].shape[1])
        if "head.weight" in state_dict:
            shape["out_channels"] = int(state_dict["head.weight"].shape[0])
    elif model.get("type") == "sequential":
        layers = model.get("layers")
        cin = _first_conv_in(layers, state_dict, "")
        if cin is not None:
            shape["in_channels"] = cin
        if isinstance(layers, list):
            for i in reversed(range(len(layers))):
                layer = layers[i]
                if isinstance(layer, dict) and layer.get("type") in ("conv", "conv_transpose"):
                    w = state_dict.get(f"{i}.weight")
                    if w is not None:
                        groups = layer.get("groups", 1)
                        groups = groups if isinstance(groups, int) else 1
                        shape["out_channels"] = int(w.shape[0]) if layer["type"] == "conv" \
                            else int(w.shape[1]) * groups
                    break
    return shape
