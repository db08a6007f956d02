#!/usr/bin/env python3
"""PyTorch's ViT training step and inference on the GPU: the peer of bench_scaling's `vit` run.

The model of --config (default examples/02_train_config/heat2d_vit.yaml), built as ShardTensor's
models::ViT builds it (models/src/vit.cpp), 2 -> 1 channels, batch 1, float, on an N^2 field of
random values, with the same layers, parameter names and parameter count:

    patch_embed.proj   Conv2d(in, E, kernel patch + 2 overlap, stride patch) on the field padded
                       by `overlap` cells (periodic axes wrap, open axes pad as model.padding says)
    position           sin-cos of the global token coordinates (no parameters; docs in
                       layers/include/shardtensor/layers/positional_embedding.hpp), or a learned table
    per block l        x = x + attention{l}(norm{l}a(x))
                       x = x + mlp{l}_out(act(mlp{l}_in(norm{l}b(x))))
                       norms: LayerNorm(E), eps 1e-5; attention: q, k (no bias), v, out Linear(E, E)
                       and attention per head with scale 1/sqrt(head_dim); MLP: Linear E -> M -> E
    head_norm          LayerNorm(E), only with final_norm
    head.proj          ConvTranspose2d(E, out, kernel = stride = patch)
    skip               Conv2d(in, out, 1), only with input_skip

Neighbourhood attention has ShardTensor's window semantics (neighborhood_attention.hpp): along
axis a, query token x sees the keys x + dilation * (o - (window - 1) // 2), o = 0 .. window - 1;
along a periodic axis (data.periodic, as bench_scaling's decomposition) they wrap around the
token grid, along an open axis keys outside it are left out of the softmax (not shifted inwards
as NATTEN does). Implementations (--attention-impl):

    flex     torch.nn.attention.flex_attention (PyTorch >= 2.5, CUDA) with a block mask of the
             2-D window. The tokens are stored in 8 x 16 tiles (--layout tiled, --tile), one tile
             per 128-token block, so the windows of a block touch few key blocks (9 for 7 x 7
             windows: the JSON's block_mask gives the count and the fraction of the computed
             scores that lie in a window). The block mask is built exactly from the windows'
             key lists (BlockMask.from_kv_blocks, full blocks marked). A head dim flex does not
             take (12 here) is zero-padded to the next power of two (>= 16), with the scale of
             the true head dim. Compiled with torch.compile: the whole model (--compile model,
             the default) or flex_attention alone (--compile attention).
             Before timing, flex's forward on the run's own grid is checked against gather's
             (flex_check_error in the JSON: max relative error; --no-flex-check skips it).
    gather   every query gathers its window's keys and values by index (a (tokens, window)
             table, invalid keys masked): any PyTorch, any device; memory ~ window x K/V.
    dense    full attention with a boolean mask: the reference, small grids only.
    auto     flex where it runs (CUDA, PyTorch >= 2.5), gather otherwise. On the GPU, a flex
             set-up that fails (compile, kernel) falls back to the next of flex+model,
             flex+attention, gather+model, gather; the JSON line says which ran and why.

The training step is bench_scaling's: forward, MSE loss, backward, gradient-norm clipping
(training.clip_grad_norm), the config's optimizer (adamw: torch.optim.AdamW with its lr and
weight_decay); then the eval-mode forward without gradients. Prints one JSON line per TF32
setting (--tf32 off|on|both; default both, off first): the median of --iters timed steps after
--warmup (CUDA events; the first step of each kind compiles, its wall time is reported as
first_train_step_s / first_infer_step_s), and the peak memory PyTorch allocated over training
and inference (peak_mib) and over the timed inference steps (infer_peak_mib). A size that does
not fit prints "fits": false. With --device cpu: wall-clock medians on --threads threads and
the allocation peaks of one step of each kind (as tools/pytorch_gpu_unet.py), the heap keeping
freed memory as ShardTensor's benchmarks do (--heap, tools/glibc_heap.py).

    python3 tools/pytorch_gpu_vit.py --size 1024                     # both TF32 settings
    python3 tools/pytorch_gpu_vit.py --size 1024 --tf32 on --warmup 3 --iters 7
    /usr/bin/python3 tools/pytorch_gpu_vit.py --device cpu --size 32 --warmup 1 --iters 2
    /usr/bin/python3 tools/pytorch_gpu_vit.py --self-check           # + flex checks on a GPU
    /usr/bin/python3 tools/pytorch_gpu_vit.py --compare CKPT.h5 IN.h5 PRED.h5   # vs ShardTensor

--self-check compares the attention implementations (forward and q/k/v gradients) with a
brute-force loop that follows the C++ kernel's per-axis key ranges, on small grids with open and
periodic axes, odd and even windows and dilation, both token layouts, and the whole model with
gather against dense attention; on a GPU with flex_attention, flex too (and its block mask
against create_block_mask's). --compare loads a ShardTensor checkpoint (h5py) into the peer and
checks its output against `shardtensor infer`'s prediction of the same input (normalization from
the checkpoint). --set model.KEY=VALUE / data.periodic=false changes the config.

Parameter count of heat2d_vit.yaml at 2 -> 1 channels: 77428, bench_scaling's "parameters".
The GPU machines have PyTorch but maybe not PyYAML: without it, a small reader of block maps
and scalars reads the config (all these configs use).
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from glibc_heap import add_heap_option, keep_heap

VIT_KEYS = ["type", "patch", "overlap", "padding", "embed_dim", "depth", "heads", "mlp_channels",
            "attention", "window", "dilation", "position", "activation", "input_skip",
            "final_norm", "seed"]
PADDING_MODES = ["zeros", "periodic", "replicate", "reflect"]
ACTIVATIONS = ["relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid"]
FLEX_TILE = (8, 16)  # tokens per 128-token block of the tiled layout (rows, columns)
FLEX_BLOCK = 128

# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------


def scalar(text):
    """A YAML scalar of these configs: bool, int, float, flow list or string."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("[") and text.endswith("]"):
        return [scalar(t) for t in text[1:-1].split(",") if t.strip()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


def read_block_maps(text):
    """Nested `key: value` block maps (indentation, # comments), the configs' YAML."""
    root = {}
    stack = [(-1, root)]
    for line in text.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= indent:
            stack.pop()
        if value.strip():
            stack[-1][1][key] = scalar(value)
        else:
            stack[-1][1][key] = {}
            stack.append((indent, stack[-1][1][key]))
    return root


def load_config(path, overrides=()):
    """(run config dict, model section) of a run config, with --set overrides applied."""
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        import yaml
        config = yaml.safe_load(text)
    except ImportError:
        config = read_block_maps(text)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            sys.exit(f"--set {item}: expected SECTION.KEY=VALUE")
        node = config
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = scalar(value)
    model = config.get("model", config)
    if model.get("type") != "vit":
        sys.exit(f"{path}: model.type is {model.get('type')!r}; this peer builds type: vit only")
    unknown = [k for k in model if k not in VIT_KEYS]
    if unknown:
        sys.exit(f"{path}: model: unknown key(s) {unknown} (ShardTensor accepts {VIT_KEYS})")
    return config, model


def sizes(value, dims, name):
    """One value for every axis, or one per axis."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) == 1:
        values = values * dims
    if len(values) != dims:
        sys.exit(f"model.{name}: {len(values)} entries for a {dims}-D field")
    return [int(v) for v in values]


def vit_options(model, dims=2):
    """ViTOptions as models/src/builder.cpp fills them (its defaults)."""
    o = {
        "patch": sizes(model.get("patch", 4), dims, "patch"),
        "overlap": sizes(model.get("overlap", 0), dims, "overlap"),
        "padding": model.get("padding", "zeros"),
        "embed_dim": int(model.get("embed_dim", 64)),
        "depth": int(model.get("depth", 4)),
        "heads": int(model.get("heads", 4)),
        "mlp_channels": int(model.get("mlp_channels", 0)),
        "attention": model.get("attention", "global"),
        "window": sizes(model.get("window", 7), dims, "window"),
        "dilation": sizes(model.get("dilation", 1), dims, "dilation"),
        "position": model.get("position", "sincos"),
        "activation": model.get("activation", "gelu"),
        "input_skip": bool(model.get("input_skip", False)),
        "final_norm": bool(model.get("final_norm", False)),
    }
    if o["mlp_channels"] == 0:
        o["mlp_channels"] = 4 * o["embed_dim"]
    if o["embed_dim"] % o["heads"]:
        sys.exit(f"model.heads {o['heads']} does not divide embed_dim {o['embed_dim']}")
    if o["padding"] not in PADDING_MODES:
        sys.exit(f"model.padding {o['padding']!r}: one of {PADDING_MODES}")
    if o["attention"] not in ("global", "neighborhood"):
        sys.exit(f"model.attention {o['attention']!r}: global or neighborhood")
    if o["attention"] == "global" and ("window" in model or "dilation" in model):
        sys.exit("model.window and model.dilation apply to attention: neighborhood, not global "
                 "(ShardTensor refuses them too)")
    if o["position"] not in ("sincos", "learned", "none"):
        sys.exit(f"model.position {o['position']!r}: sincos, learned or none")
    if o["activation"] not in ACTIVATIONS:
        sys.exit(f"model.activation {o['activation']!r}: one of {ACTIVATIONS}")
    return o


def periodic_axes(config, dims=2):
    """data.periodic as bench_scaling reads it: one bool for every axis or one per axis."""
    value = (config.get("data") or {}).get("periodic", False)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) == 1:
        values = values * dims
    return tuple(bool(v) for v in values)


def expected_parameters(o, in_channels, out_channels, tokens):
    """ShardTensor's count_parameters of the ViT, from the options alone."""
    e, m = o["embed_dim"], o["mlp_channels"]
    kernel = math.prod(p + 2 * v for p, v in zip(o["patch"], o["overlap"]))
    n = e * in_channels * kernel + e                                # patch_embed.proj
    n += e * math.prod(tokens) if o["position"] == "learned" else 0  # position.table
    block = 2 * 2 * e                                               # norm{l}a, norm{l}b
    block += 4 * e * e + 3 * e                                      # q, k, v, out (k: no bias)
    block += e * m + m + m * e + e                                  # mlp{l}_in, mlp{l}_out
    n += o["depth"] * block
    n += 2 * e if o["final_norm"] else 0                            # head_norm
    n += e * out_channels * math.prod(o["patch"]) + out_channels    # head.proj
    n += in_channels * out_channels + out_channels if o["input_skip"] else 0  # skip
    return n


# ---------------------------------------------------------------------------------------
# Token grid, window, layouts
# ---------------------------------------------------------------------------------------


class Window:
    """The token grid, ShardTensor's neighbourhood window on it, and the order of the tokens
    in the sequence: 'rowmajor' (index i * W + j) or 'tiled' (tiles of `tile` tokens in row-major
    order of tiles, row-major inside a tile)."""

    def __init__(self, extents, window, dilation, periodic, layout="rowmajor", tile=FLEX_TILE):
        self.extents = tuple(int(e) for e in extents)
        self.window = tuple(int(w) for w in window)
        self.dilation = tuple(int(d) for d in dilation)
        self.periodic = tuple(bool(p) for p in periodic)
        self.below = tuple((w - 1) // 2 for w in self.window)
        for a in range(2):
            span = (self.window[a] - 1) * self.dilation[a] + 1
            if span > self.extents[a]:
                raise ValueError(f"window {self.window[a]} with dilation {self.dilation[a]} spans "
                                 f"{span} tokens along axis {a}, more than the {self.extents[a]} "
                                 "tokens of the grid (ShardTensor refuses it too)")
        if layout == "tiled" and not self.tiles(tile):
            raise ValueError(f"tiled layout: the token grid {self.extents} is not a multiple of "
                             f"the tile {tile}")
        self.layout = layout
        self.tile = tuple(tile)
        self.tokens = self.extents[0] * self.extents[1]
        self.cells = self.window[0] * self.window[1]
        self._tables = {}
        self.keys = self.valid = None  # prepare(device): the key table where attention runs
        self.all_valid = True

    def prepare(self, device):
        """Builds the key table on `device` ahead of time (no data-dependent step, nothing
        created, inside a compiled forward)."""
        self.keys, self.valid = self.table(device)
        self.all_valid = bool(self.valid.all())
        return self

    def tiles(self, tile=FLEX_TILE):
        return all(e % t == 0 for e, t in zip(self.extents, tile))

    # Sequence index <-> grid coordinates (tensors of any integer dtype; also in mask_mods).
    def coords(self, s):
        if self.layout == "rowmajor":
            return s // self.extents[1], s % self.extents[1]
        th, tw = self.tile
        tile, r = s // (th * tw), s % (th * tw)
        tiles_per_row = self.extents[1] // tw
        return (tile // tiles_per_row) * th + r // tw, (tile % tiles_per_row) * tw + r % tw

    def index(self, i, j):
        if self.layout == "rowmajor":
            return i * self.extents[1] + j
        th, tw = self.tile
        tiles_per_row = self.extents[1] // tw
        return ((i // th) * tiles_per_row + j // tw) * (th * tw) + (i % th) * tw + j % tw

    def to_sequence(self, t):
        """(N, C, H, W) -> (N, L, C) in this layout."""
        n, c, h, w = t.shape
        if self.layout == "rowmajor":
            return t.flatten(2).transpose(1, 2)
        th, tw = self.tile
        t = t.reshape(n, c, h // th, th, w // tw, tw).permute(0, 2, 4, 3, 5, 1)
        return t.reshape(n, h * w, c)

    def to_grid(self, s):
        """(N, L, C) in this layout -> (N, C, H, W)."""
        n, _, c = s.shape
        h, w = self.extents
        if self.layout == "rowmajor":
            return s.transpose(1, 2).reshape(n, c, h, w)
        th, tw = self.tile
        s = s.reshape(n, h // th, w // tw, th, tw, c).permute(0, 5, 1, 3, 2, 4)
        return s.reshape(n, c, h, w)

    def axis_ok(self, delta, a):
        """Whether key - query = delta (grid steps along axis a) is a window offset."""
        shifted = delta + self.dilation[a] * self.below[a]
        if self.periodic[a]:
            shifted = shifted % self.extents[a]
        ok = (shifted >= 0) & (shifted <= self.dilation[a] * (self.window[a] - 1))
        if self.dilation[a] > 1:
            ok = ok & (shifted % self.dilation[a] == 0)
        return ok

    def mask_mod(self, b, h, q_idx, kv_idx):
        """flex_attention's mask_mod: is key kv_idx in query q_idx's window."""
        qi, qj = self.coords(q_idx)
        ki, kj = self.coords(kv_idx)
        return self.axis_ok(ki - qi, 0) & self.axis_ok(kj - qj, 1)

    def table(self, device):
        """(keys, valid): (L, window cells) sequence indices of every query's window keys in
        window order (axis 0 outer), and whether each lies in the field; an invalid entry
        points at the query itself (a real token; masked)."""
        key = str(device)
        if key not in self._tables:
            s = torch.arange(self.tokens, device=device)
            i, j = self.coords(s)
            ki, kj, valid = [], [], []
            for o0 in range(self.window[0]):
                for o1 in range(self.window[1]):
                    a = i + self.dilation[0] * (o0 - self.below[0])
                    b = j + self.dilation[1] * (o1 - self.below[1])
                    ok = torch.ones_like(s, dtype=torch.bool)
                    if self.periodic[0]:
                        a = a % self.extents[0]
                    else:
                        ok = ok & (a >= 0) & (a < self.extents[0])
                    if self.periodic[1]:
                        b = b % self.extents[1]
                    else:
                        ok = ok & (b >= 0) & (b < self.extents[1])
                    ki.append(a)
                    kj.append(b)
                    valid.append(ok)
            ki, kj, valid = torch.stack(ki, 1), torch.stack(kj, 1), torch.stack(valid, 1)
            keys = torch.where(valid, self.index(ki.clamp(0, self.extents[0] - 1),
                                                 kj.clamp(0, self.extents[1] - 1)), s[:, None])
            self._tables[key] = (keys, valid)
        return self._tables[key]


# ---------------------------------------------------------------------------------------
# Attention implementations: q, k, v (N, heads, L, head_dim) in the window's layout
# ---------------------------------------------------------------------------------------


def gather_attention(q, k, v, win):
    keys, valid = (win.keys, win.valid) if win.keys is not None else win.table(q.device)
    n, h, length, d = q.shape
    flat = keys.reshape(-1)
    kw = k.index_select(2, flat).view(n, h, length, win.cells, d)
    vw = v.index_select(2, flat).view(n, h, length, win.cells, d)
    scores = torch.einsum("nhld,nhlwd->nhlw", q, kw) * (1.0 / math.sqrt(d))
    if not (win.all_valid if win.keys is not None else bool(valid.all())):
        scores = scores.masked_fill(~valid, float("-inf"))
    return torch.einsum("nhlw,nhlwd->nhld", scores.softmax(-1), vw)


def dense_mask(win, device):
    keys, valid = win.table(device)
    mask = torch.zeros(win.tokens, win.tokens, dtype=torch.bool, device=device)
    rows = torch.arange(win.tokens, device=device)[:, None].expand_as(keys)
    mask[rows[valid], keys[valid]] = True
    return mask


def dense_attention(q, k, v, win):
    if win.tokens > 16384:
        raise ValueError(f"dense attention over {win.tokens} tokens: use gather or flex")
    mask = dense_mask(win, q.device)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def global_attention(q, k, v, win=None):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    return ((q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))).softmax(-1) @ v


def flex_available():
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
        return True
    except ImportError:
        return False


def ordered_blocks(dense):
    """(num_blocks, indices) of a (rows, columns) block matrix, as BlockMask stores them."""
    num = dense.sum(-1).to(torch.int32)
    indices = torch.argsort(dense.to(torch.int32), dim=-1, descending=True, stable=True)
    return num[None, None].contiguous(), indices.to(torch.int32)[None, None].contiguous()


def flex_block_mask(win, device, exact=True):
    """The window's BlockMask: from the key table (exact: which 128 x 128 blocks hold a
    (query, key) pair of a window, and which hold only such pairs), or create_block_mask."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
    block = FLEX_BLOCK
    if not exact or win.tokens % block:
        mask = create_block_mask(win.mask_mod, None, None, win.tokens, win.tokens, device=device,
                                 BLOCK_SIZE=block, _compile=win.tokens > 16384)
        return mask, None
    keys, valid = win.table(device)
    blocks = win.tokens // block
    rows = (torch.arange(win.tokens, device=device) // block)[:, None].expand_as(keys)
    pairs = (rows * blocks + keys // block)[valid]
    counts = torch.bincount(pairs, minlength=blocks * blocks).view(blocks, blocks)
    full = counts == block * block
    partial = (counts > 0) & ~full
    kv_num, kv_indices = ordered_blocks(partial)
    full_num, full_indices = ordered_blocks(full)
    computed = int((counts > 0).sum()) * block * block
    stats = {"blocks": blocks, "kv_blocks_per_q_block": round(int((counts > 0).sum()) / blocks, 2),
             "full_blocks": int(full.sum()),
             "useful_fraction": round(int(valid.sum()) / computed, 4)}
    try:
        mask = BlockMask.from_kv_blocks(kv_num, kv_indices, full_num, full_indices,
                                        BLOCK_SIZE=block, mask_mod=win.mask_mod)
    except (TypeError, AttributeError) as e:  # another BlockMask API: let PyTorch build it
        mask = create_block_mask(win.mask_mod, None, None, win.tokens, win.tokens,
                                 device=device, BLOCK_SIZE=block, _compile=win.tokens > 16384)
        stats["built_by"] = f"create_block_mask ({type(e).__name__} from from_kv_blocks)"
    return mask, stats


class FlexAttention:
    """flex_attention with the window's block mask; the head dim zero-padded to a size flex
    takes (powers of two >= 16), the scale that of the true head dim."""

    def __init__(self, win, device, head_dim, compiled_kernel, exact_mask=True):
        from torch.nn.attention.flex_attention import flex_attention
        self.win = win
        self.block_mask, self.stats = flex_block_mask(win, device, exact_mask)
        self.padded = max(16, 1 << (head_dim - 1).bit_length())
        self.fn = flex_attention
        if compiled_kernel:
            self.fn = torch.compile(flex_attention, dynamic=False)

    def __call__(self, q, k, v, win=None, fn=None):
        d = q.shape[-1]
        if self.padded != d:
            q, k, v = (F.pad(t, (0, self.padded - d)) for t in (q, k, v))
        out = (fn or self.fn)(q, k, v, block_mask=self.block_mask, scale=1.0 / math.sqrt(d))
        return out[..., :d] if self.padded != d else out

    def check(self, heads, head_dim, device):
        """Max relative error of the compiled flex forward against gather attention on this
        grid, for random q, k, v of one layer's shape."""
        from torch.nn.attention.flex_attention import flex_attention
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, heads, self.win.tokens, head_dim, generator=g, device=device)
                   for _ in range(3))
        with torch.no_grad():
            fn = self.fn if self.fn is not flex_attention else torch.compile(flex_attention,
                                                                            dynamic=False)
            got = self(q, k, v, fn=fn)
            want = gather_attention(q, k, v, self.win)
        return float((got - want).abs().max() / want.abs().max())


def reference_attention(q, k, v, win):
    """Brute force in the C++ kernel's terms (layers/src/neighborhood_attention.cpp, plan_geometry):
    per axis and query coordinate x, window positions o in [first, last) (all of them along a
    periodic axis), key x + dilation (o - below), wrapped on periodic axes."""
    n, h, length, d = q.shape
    grid = lambda t: t.reshape(n, h, length, d)  # noqa: E731
    q, k, v = grid(q), grid(k), grid(v)
    out = [None] * length
    ranges = []
    for a in range(2):
        ext, dil, w, below = win.extents[a], win.dilation[a], win.window[a], win.below[a]
        per = []
        for x in range(ext):
            if win.periodic[a]:
                per.append(range(0, w))
            else:
                first = max(0, below - x // dil)
                per.append(range(first, min(w, below + (ext - 1 - x) // dil + 1)))
        ranges.append(per)
    for x0 in range(win.extents[0]):
        for x1 in range(win.extents[1]):
            s = int(win.index(x0, x1))
            keys = []
            for o0 in ranges[0][x0]:
                for o1 in ranges[1][x1]:
                    k0 = (x0 + win.dilation[0] * (o0 - win.below[0])) % win.extents[0]
                    k1 = (x1 + win.dilation[1] * (o1 - win.below[1])) % win.extents[1]
                    keys.append(int(win.index(k0, k1)))
            idx = torch.tensor(keys, device=q.device)
            scores = torch.einsum("nhd,nhwd->nhw", q[:, :, s], k[:, :, idx]) / math.sqrt(d)
            out[s] = torch.einsum("nhw,nhwd->nhd", scores.softmax(-1), v[:, :, idx])
    return torch.stack(out, 2)


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


def activation(name):
    return {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.01), "gelu": nn.GELU(),
            "silu": nn.SiLU(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()}[name]


def pad_axis(x, axis, lo, hi, mode):
    """Pads spatial axis `axis` (2 or 3 of an (N, C, H, W) tensor) by lo / hi cells."""
    if lo == 0 and hi == 0:
        return x
    if mode == "circular":
        n = x.shape[axis]
        parts = [x.narrow(axis, n - lo, lo)] if lo else []
        parts.append(x)
        if hi:
            parts.append(x.narrow(axis, 0, hi))
        return torch.cat(parts, axis)
    pads = (lo, hi, 0, 0) if axis == 3 else (0, 0, lo, hi)
    return F.pad(x, pads, mode="constant" if mode == "zeros" else mode)


class PatchEmbedding(nn.Module):
    """ShardTensor's PatchEmbedding: a convolution, kernel patch + 2 overlap, stride patch,
    padding overlap; periodic axes wrap, open axes pad as `padding` says."""

    def __init__(self, in_channels, embed_dim, patch, overlap, padding, periodic):
        super().__init__()
        self.overlap, self.periodic = overlap, periodic
        self.mode = {"zeros": "zeros", "periodic": "circular", "replicate": "replicate",
                     "reflect": "reflect"}[padding]
        kernel = [p + 2 * v for p, v in zip(patch, overlap)]
        self.proj = nn.Conv2d(in_channels, embed_dim, kernel, stride=patch)

    def forward(self, x):
        for a in range(2):
            mode = "circular" if self.periodic[a] else self.mode
            x = pad_axis(x, 2 + a, self.overlap[a], self.overlap[a], mode)
        return self.proj(x)


class PatchUnembedding(nn.Module):
    def __init__(self, embed_dim, out_channels, patch):
        super().__init__()
        self.proj = nn.ConvTranspose2d(embed_dim, out_channels, patch, stride=patch)

    def forward(self, t):
        return self.proj(t)


def sincos_table(channels, tokens, dims=2):
    """PositionalEmbedding's sincos values (C, H, W), computed in double as the C++ does."""
    per_axis = 2 * (channels // (2 * dims))
    table = torch.zeros(channels, *tokens, dtype=torch.float64)
    if per_axis == 0:
        return table
    coords = torch.meshgrid(*[torch.arange(t, dtype=torch.float64) for t in tokens],
                            indexing="ij")
    for c in range(dims * per_axis):
        axis, f = c // per_axis, (c % per_axis) // 2
        w = 10000.0 ** (-float(f) / float(per_axis // 2))
        table[c] = torch.sin(w * coords[axis]) if c % 2 == 0 else torch.cos(w * coords[axis])
    return table


class Attention(nn.Module):
    """MultiHeadAttention: q, k (no bias), v, out projections; attention per head."""

    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(channels, channels)
        self.k = nn.Linear(channels, channels, bias=False)
        self.v = nn.Linear(channels, channels)
        self.out = nn.Linear(channels, channels)
        self.kernel = None  # set by ViT: (q, k, v, window) -> output
        self.window = None

    def forward(self, s):
        n, length, c = s.shape
        split = lambda t: t.view(n, length, self.heads, c // self.heads).transpose(1, 2)  # noqa
        y = self.kernel(split(self.q(s)), split(self.k(s)), split(self.v(s)), self.window)
        return self.out(y.transpose(1, 2).reshape(n, length, c))


class ViT(nn.Module):
    """ShardTensor's models::ViT on a 2-D field, its parameter names and count."""

    def __init__(self, o, in_channels, out_channels, field, periodic, impl="gather",
                 layout="rowmajor", device="cpu", compiled_kernel=False, tile=FLEX_TILE):
        super().__init__()
        for a in range(2):
            if field[a] % o["patch"][a]:
                raise ValueError(f"field extent {field[a]} along dim {a} is not a multiple of "
                                 f"the patch size {o['patch'][a]}")
        self.tokens = tuple(f // p for f, p in zip(field, o["patch"]))
        self.attention_kind = o["attention"]
        window = o["window"] if o["attention"] == "neighborhood" else (1, 1)
        dilation = o["dilation"] if o["attention"] == "neighborhood" else (1, 1)
        self.win = Window(self.tokens, window, dilation, periodic, layout, tile)
        e = o["embed_dim"]
        self.patch_embed = PatchEmbedding(in_channels, e, o["patch"], o["overlap"], o["padding"],
                                          periodic)
        self.position_kind = o["position"]
        if o["position"] == "learned":
            self.position = nn.Module()
            self.position.table = nn.Parameter(torch.empty(e, *self.tokens).uniform_(-0.02, 0.02))
        elif o["position"] == "sincos":
            self.register_buffer("sincos", sincos_table(e, self.tokens).float(), persistent=False)
        self.depth = o["depth"]
        if o["attention"] == "global":
            kernel = global_attention
            self.impl = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "math"
        elif impl == "flex":
            kernel = FlexAttention(self.win, device, e // o["heads"], compiled_kernel)
            self.impl = "flex"
        else:
            kernel = {"gather": gather_attention, "dense": dense_attention}[impl]
            self.impl = impl
            self.win.prepare(device)
        self.flex = kernel if isinstance(kernel, FlexAttention) else None
        for l in range(self.depth):
            setattr(self, f"norm{l}a", nn.LayerNorm(e, eps=1e-5))
            attention = Attention(e, o["heads"])
            attention.kernel, attention.window = kernel, self.win
            setattr(self, f"attention{l}", attention)
            setattr(self, f"norm{l}b", nn.LayerNorm(e, eps=1e-5))
            setattr(self, f"mlp{l}_in", nn.Linear(e, o["mlp_channels"]))
            setattr(self, f"mlp{l}_out", nn.Linear(o["mlp_channels"], e))
        self.act = activation(o["activation"])
        if o["final_norm"]:
            self.head_norm = nn.LayerNorm(e, eps=1e-5)
        self.head = PatchUnembedding(e, out_channels, o["patch"])
        if o["input_skip"]:
            self.skip = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x):
        t = self.patch_embed(x)
        if self.position_kind == "learned":
            t = t + self.position.table
        elif self.position_kind == "sincos":
            t = t + self.sincos
        s = self.win.to_sequence(t)
        for l in range(self.depth):
            s = s + getattr(self, f"attention{l}")(getattr(self, f"norm{l}a")(s))
            hidden = self.act(getattr(self, f"mlp{l}_in")(getattr(self, f"norm{l}b")(s)))
            s = s + getattr(self, f"mlp{l}_out")(hidden)
        if hasattr(self, "head_norm"):
            s = self.head_norm(s)
        y = self.head(self.win.to_grid(s))
        return y + self.skip(x) if hasattr(self, "skip") else y


def count_parameters(net):
    return sum(p.numel() for p in net.parameters())


def make_optimizer(config, params):
    cfg = config.get("optimizer") or {}
    kind = cfg.get("type", "adam")
    lr, wd = float(cfg.get("lr", 1e-3)), float(cfg.get("weight_decay", 0.0))
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd,
                               momentum=float(cfg.get("momentum", 0.0)))
    sys.exit(f"optimizer.type {kind!r}: this peer runs adam, adamw and sgd")


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, warmup, iters, device):
    """Median seconds of `iters` calls of step() after `warmup` (CUDA events on a GPU)."""
    times = []
    for i in range(warmup + iters):
        if device.type == "cpu":
            start = time.perf_counter()
            step()
            if i >= warmup:
                times.append(time.perf_counter() - start)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times) if times else float("nan")


def wall(step, device):
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


def allocation_peak_mib(step):
    """Peak bytes PyTorch's CPU allocator held during step(), above what it held before."""
    try:
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
            step()
        events = sorted((e.start_us(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]")
    except Exception:  # noqa: BLE001 - an informative number only
        return None
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return round(peak / 2**20, 1)


def build_steps(args, config, o, field, periodic, device, impl, compile_mode):
    """(train_step, infer_step, net, record additions) of one implementation choice."""
    layout = args.layout
    if layout == "auto":
        tokens = [f // p for f, p in zip(field, o["patch"])]
        tiled = impl == "flex" and all(t % s == 0 for t, s in zip(tokens, args.tile))
        layout = "tiled" if tiled else "rowmajor"
    torch.manual_seed(1)
    net = ViT(o, 2, 1, field, periodic, impl, layout, device,
              compiled_kernel=(compile_mode == "attention"), tile=args.tile).to(device)
    opt = make_optimizer(config, net.parameters())
    clip = float((config.get("training") or {}).get("clip_grad_norm", 0.0))
    x = torch.rand(args.batch, 2, *field, device=device)
    target = torch.rand(args.batch, 1, *field, device=device)
    model = torch.compile(net) if compile_mode == "model" else net
    state = {}

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), target)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        state["loss"] = loss

    def infer_step():
        with torch.no_grad():
            model(x)

    extra = {"attention_impl": net.impl, "compile": compile_mode,
             "layout": layout if layout == "rowmajor" else "tiled %dx%d" % net.win.tile,
             "head_dim": o["embed_dim"] // o["heads"]}
    if net.flex is not None:
        extra["flex_head_dim"] = net.flex.padded
        if net.flex.stats:
            extra["block_mask"] = net.flex.stats
        if args.flex_check:  # the kernel on this very grid against the gather path
            extra["flex_check_error"] = net.flex.check(o["heads"], o["embed_dim"] // o["heads"],
                                                       device)
    return train_step, infer_step, net, extra, state


def candidates(args, device):
    """(attention impl, compile mode) to try in order."""
    has_compile = hasattr(torch, "compile") and device.type == "cuda"
    impls = [args.attention_impl] if args.attention_impl != "auto" else (
        ["flex", "gather"] if device.type == "cuda" and flex_available() else ["gather"])
    out = []
    for impl in impls:
        if args.compile != "auto":
            modes = [args.compile]
        elif impl == "flex":
            modes = ["model", "attention"]
        else:
            modes = ["model", "none"] if has_compile else ["none"]
        for mode in modes:
            if impl == "flex" and mode == "none":
                mode = "attention"  # eager flex materialises every score: never at this size
            if (impl, mode) not in out:
                out.append((impl, mode))
    return out


def is_oom(error):
    """A CUDA allocation failure (torch.cuda.OutOfMemoryError, or its RuntimeError before 1.13)."""
    kind = getattr(torch.cuda, "OutOfMemoryError", None)
    return (kind is not None and isinstance(error, kind)) or (
        isinstance(error, RuntimeError) and "CUDA out of memory" in str(error))


def run(args, config, o, size, tf32):
    device = torch.device(args.device)
    field = tuple(size)
    periodic = periodic_axes(config)
    tokens = [f // p for f, p in zip(field, o["patch"])]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    record = {"peer": "pytorch_vit", "device": name, "torch": torch.__version__,
              "config": args.config, "dims": 2, "size": field[0] if field[0] == field[1] else None,
              "global": list(field), "tokens": tokens, "batch": args.batch, "channels_in": 2,
              "channels_out": 1, "attention": o["attention"],
              "window": o["window"] if o["attention"] == "neighborhood" else None,
              "periodic": list(periodic), "precision": "float"}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        record["tf32"] = tf32
    else:
        torch.set_num_threads(args.threads)
        record["threads"] = args.threads
    record["warmup"], record["iters"], record["infer_iters"] = args.warmup, args.iters, \
        args.infer_iters
    fallbacks = []
    result = None
    for impl, mode in candidates(args, device):
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # (re)compile under this TF32 setting
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        attempt = {"attention_impl": impl, "compile": mode}
        print(f"pytorch_gpu_vit: {field[0]}x{field[1]}, TF32 {'on' if tf32 else 'off'}: "
              f"{impl} attention, compile {mode}", file=sys.stderr, flush=True)
        try:
            train_step, infer_step, net, extra, state = build_steps(
                args, config, o, field, periodic, device, impl, mode)
            attempt.update(extra)
            attempt["parameters"] = count_parameters(net)
            attempt["expected_parameters"] = expected_parameters(o, 2, 1, tokens)
            net.train()
            attempt["first_train_step_s"] = round(wall(train_step, device), 4)
            net.eval()
            attempt["first_infer_step_s"] = round(wall(infer_step, device), 4)
        except Exception as e:  # noqa: BLE001 - out of memory: does not fit; else the next one
            if is_oom(e):
                attempt["fits"] = False
                result = attempt
                break
            text = str(e).strip().splitlines()[0][:240] if str(e).strip() else ""
            fallbacks.append(f"{impl}+{mode}: {type(e).__name__}: {text}")
            print(f"pytorch_gpu_vit: {fallbacks[-1]}", file=sys.stderr, flush=True)
            train_step = infer_step = net = state = None
            continue
        result = attempt
        try:
            net.train()
            attempt["train_step_s"] = timed(train_step, max(args.warmup - 1, 0), args.iters,
                                            device)
            attempt["loss"] = float(state["loss"])
            net.eval()
            if device.type == "cuda":
                attempt["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                torch.cuda.reset_peak_memory_stats()
            attempt["infer_step_s"] = timed(infer_step, 0, args.infer_iters, device)
            attempt["fits"] = True
            if device.type == "cuda":
                attempt["infer_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                attempt["peak_mib"] = max(attempt["peak_mib"], attempt["infer_peak_mib"])
            else:
                net.train()
                attempt["train_peak_mib"] = allocation_peak_mib(train_step)
                net.eval()
                attempt["infer_peak_mib"] = allocation_peak_mib(infer_step)
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
                raise
            attempt["fits"] = False
        break
    if result is None:
        record.update({"fits": None, "error": "no attention implementation ran"})
    else:
        record.update(result)
        if device.type == "cuda" and result["fits"] is False:
            record["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if fallbacks:
        record["fallbacks"] = fallbacks
    print(json.dumps(record), flush=True)
    return record.get("fits") is not None


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def close(self, what, got, want, tol):
        err = float((got - want).abs().max()) / max(float(want.abs().max()), 1e-30)
        ok = err <= tol
        self.passed += ok
        self.failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: relative max error {err:.2e} (<= {tol:g})")
        return ok

    def equal(self, what, got, want):
        ok = got == want
        self.passed += ok
        self.failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: {got} {'==' if ok else '!='} {want}")


def attention_cases():
    """(grid, window, dilation, periodic, layout, tile) of the self-check."""
    return [
        ((6, 5), (3, 3), (1, 1), (False, False), "rowmajor", FLEX_TILE),
        ((6, 5), (4, 2), (1, 2), (True, False), "rowmajor", FLEX_TILE),
        ((9, 6), (5, 3), (2, 1), (True, True), "rowmajor", FLEX_TILE),
        ((7, 7), (7, 7), (1, 1), (False, True), "rowmajor", FLEX_TILE),
        ((4, 8), (3, 4), (1, 1), (True, False), "tiled", (2, 4)),
        ((6, 8), (2, 5), (2, 1), (False, True), "tiled", (3, 2)),
    ]


def qkv(n, h, length, d, device, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, length, d, generator=g, dtype=dtype).to(device).requires_grad_()
            for _ in range(3)]


def compare_kernels(checks, what, kernel, win, device, dtype, tol, n=2, h=2, d=3, seed=0):
    """kernel against the brute-force reference: output and q/k/v gradients."""
    q, k, v = qkv(n, h, win.tokens, d, device, dtype, seed)
    g = torch.randn(n, h, win.tokens, d, generator=torch.Generator().manual_seed(seed + 1),
                    dtype=dtype).to(device)
    want = reference_attention(q, k, v, win)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    got = kernel(q, k, v, win)
    got_grads = torch.autograd.grad(got, (q, k, v), g)
    checks.close(f"{what} forward", got.detach(), want.detach(), tol)
    for name, a, b in zip("qkv", got_grads, want_grads):
        checks.close(f"{what} d{name}", a, b, tol)


def self_check(args):
    checks = Checks()
    cpu = torch.device("cpu")
    print("self-check: attention against the brute-force reference (double, CPU)")
    for grid, window, dilation, periodic, layout, tile in attention_cases():
        win = Window(grid, window, dilation, periodic, layout, tile)
        what = (f"{grid[0]}x{grid[1]} window {window[0]}x{window[1]} dilation "
                f"{dilation[0]},{dilation[1]} periodic {int(periodic[0])}{int(periodic[1])} "
                f"{layout}")
        # the key table holds exactly the C++ key counts per query
        keys, valid = win.table(cpu)
        counts = []
        for a in range(2):
            ext, dil, w, below = grid[a], dilation[a], window[a], win.below[a]
            counts.append([w if periodic[a] else
                           min(w, below + (ext - 1 - x) // dil + 1) - max(0, below - x // dil)
                           for x in range(ext)])
        i, j = win.coords(torch.arange(win.tokens))
        want = torch.tensor([counts[0][a] * counts[1][b] for a, b in zip(i.tolist(), j.tolist())])
        got = valid.sum(1)
        checks.equal(f"{what}: keys per query (C++ first/last ranges; {int(want.min())} to "
                     f"{int(want.max())})", bool((got == want).all()), True)
        for name, kernel in (("gather", gather_attention), ("dense", dense_attention)):
            compare_kernels(checks, f"{what}: {name}", kernel, win, cpu, torch.float64, 1e-12)
        # mask_mod (flex's predicate) against the key table
        s = torch.arange(win.tokens)
        mask = win.mask_mod(None, None, s[:, None], s[None, :])
        checks.equal(f"{what}: mask_mod == key table", bool((mask == dense_mask(win, cpu)).all()),
                     True)
        # layout round trip
        t = torch.randn(1, 3, *grid, dtype=torch.float64)
        checks.equal(f"{what}: to_grid(to_sequence(x)) == x",
                     bool((win.to_grid(win.to_sequence(t)) == t).all()), True)

    print("self-check: the whole ViT, gather against dense attention (double, CPU)")
    config, model = load_config(args.config, args.set)
    o = vit_options(model)
    o["attention"] = "neighborhood"
    o_small = dict(o, window=[5, 3], depth=2)
    field = tuple(t * p for t, p in zip((8, 6), o["patch"]))
    x = torch.rand(2, 2, *field, dtype=torch.float64)
    for periodic in ((True, True), (False, True)):
        nets = []
        for impl, layout in (("dense", "rowmajor"), ("gather", "rowmajor"), ("gather", "tiled")):
            net = ViT(o_small, 2, 1, field, periodic, impl, layout, tile=(2, 3)).double()
            if nets:
                net.load_state_dict(nets[0].state_dict())
            nets.append(net)
        outs = [net(x) for net in nets]
        for net, out, label in zip(nets[1:], outs[1:], ("gather rowmajor", "gather tiled")):
            checks.close(f"ViT periodic {periodic}: {label} vs dense output", out.detach(),
                          outs[0].detach(), 1e-12)
            grads = torch.autograd.grad(out.square().sum(), list(net.parameters()))
            want = torch.autograd.grad(outs[0].square().sum(), list(nets[0].parameters()),
                                       retain_graph=True)
            worst = max(range(len(grads)), key=lambda i: float((grads[i] - want[i]).abs().max()))
            checks.close(f"ViT periodic {periodic}: {label} vs dense, worst parameter gradient "
                         f"({list(dict(net.named_parameters()))[worst]})", grads[worst],
                         want[worst], 1e-10)
    tokens = [f // p for f, p in zip((32, 32), o["patch"])]
    net = ViT(o, 2, 1, (32, 32), periodic_axes(config))
    checks.equal("parameters of the config's model vs ShardTensor's formula",
                 count_parameters(net), expected_parameters(o, 2, 1, tokens))
    print(f"  (the config's model, 2 -> 1 channels: {count_parameters(net)} parameters)")

    if torch.cuda.is_available() and flex_available():
        gpu = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        print("self-check: flex_attention against the reference (float, CUDA)")
        flex_cases = [((16, 16), (7, 7), (1, 1), (True, True), "tiled"),
                      ((16, 16), (7, 7), (1, 1), (False, False), "tiled"),
                      ((16, 32), (4, 5), (2, 1), (False, True), "tiled"),
                      ((12, 10), (5, 5), (1, 1), (True, False), "rowmajor")]
        for grid, window, dilation, periodic, layout in flex_cases:
            win = Window(grid, window, dilation, periodic, layout)
            what = (f"{grid[0]}x{grid[1]} window {window[0]}x{window[1]} dilation "
                    f"{dilation[0]},{dilation[1]} periodic {int(periodic[0])}{int(periodic[1])} "
                    f"{layout}")
            try:
                flex = FlexAttention(win, gpu, 12, compiled_kernel=True)
                compare_kernels(checks, f"{what}: flex", flex, win, gpu, torch.float32, 2e-5,
                                n=1, h=4, d=12)
                if win.tokens % FLEX_BLOCK == 0:
                    created, _ = flex_block_mask(win, gpu, exact=False)
                    checks.equal(f"{what}: exact block mask == create_block_mask's",
                                 bool((flex.block_mask.to_dense() == created.to_dense()).all()),
                                 True)
            except Exception as e:  # noqa: BLE001
                checks.failed += 1
                print(f"  FAIL {what}: flex raised {type(e).__name__}: {e}")
    else:
        print("self-check: no CUDA flex_attention here: flex not checked")
    print(f"self-check: {checks.passed} passed, {checks.failed} failed")
    return checks.failed == 0


def compare_checkpoint(args):
    """The peer with a ShardTensor checkpoint's parameters against `shardtensor infer`."""
    import h5py
    import numpy as np
    checkpoint, inputs, prediction = args.compare
    config, model = load_config(args.config, args.set)
    o = vit_options(model)
    data = config.get("data") or {}
    with h5py.File(inputs, "r") as f:
        x = torch.from_numpy(np.asarray(f[data.get("input", "input")][: args.compare_samples]))
    with h5py.File(prediction, "r") as f:
        want = torch.from_numpy(np.asarray(f["prediction"][: args.compare_samples]))
    x, want = x.double(), want.double()
    net = ViT(o, x.shape[1], want.shape[1], tuple(x.shape[2:]), periodic_axes(config),
              "gather").double()
    params = dict(net.named_parameters())
    with h5py.File(checkpoint, "r") as f:
        stored = {k: torch.from_numpy(np.asarray(v)) for k, v in f["parameters"].items()}
        norm = {k: torch.from_numpy(np.asarray(v)).double()
                for k, v in f["normalization"].items()} if "normalization" in f else {}
    missing = sorted(set(params) ^ set(stored))
    if missing:
        sys.exit(f"--compare: parameter names differ from the checkpoint's: {missing}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(stored[name].reshape(p.shape))
        c = (None, slice(None), None, None)
        if norm:
            x = (x - norm["input_mean"][c]) / norm["input_std"][c]
        y = net(x)
        if norm:
            y = y * norm["target_std"][c] + norm["target_mean"][c]
    err = float((y - want).abs().max() / want.abs().max())
    print(json.dumps({"peer": "pytorch_vit", "compare": checkpoint, "samples": int(x.shape[0]),
                      "global": list(x.shape[2:]), "parameters": count_parameters(net),
                      "max_relative_error": err, "ok": err < 1e-4}))
    return err < 1e-4


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--config", default=os.path.normpath(os.path.join(
        here, "..", "examples", "02_train_config", "heat2d_vit.yaml")))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key, e.g. model.window=5, data.periodic=false")
    parser.add_argument("--size", default="1024", help="N (N x N), AxB, or a list N1,N2,...")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--infer-iters", type=int, default=None, help="default: --iters")
    parser.add_argument("--tf32", choices=("off", "on", "both"), default="both")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (--device cpu)")
    parser.add_argument("--attention-impl", choices=("auto", "flex", "gather", "dense"),
                        default="auto")
    parser.add_argument("--compile", choices=("auto", "model", "attention", "none"),
                        default="auto")
    parser.add_argument("--layout", choices=("auto", "rowmajor", "tiled"), default="auto",
                        help="token order: tiled for flex where the grid allows (auto)")
    parser.add_argument("--tile", default="8x16",
                        help="tokens per tile of the tiled layout, RxC (R*C = 128: one block)")
    parser.add_argument("--no-flex-check", dest="flex_check", action="store_false",
                        help="skip the check of flex's forward against gather on the run's grid")
    parser.add_argument("--self-check", action="store_true")
    parser.add_argument("--compare", nargs=3, metavar=("CHECKPOINT", "INPUT", "PREDICTION"))
    parser.add_argument("--compare-samples", type=int, default=4)
    add_heap_option(parser)
    args = parser.parse_args()
    keep_heap(args, args.device)
    if args.infer_iters is None:
        args.infer_iters = args.iters
    args.tile = tuple(int(v) for v in args.tile.split("x"))
    if len(args.tile) != 2 or min(args.tile) < 1:
        sys.exit(f"--tile {args.tile}: expected RxC")
    if args.self_check:
        sys.exit(0 if self_check(args) else 1)
    if args.compare:
        sys.exit(0 if compare_checkpoint(args) else 1)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu")
    torch.backends.cudnn.benchmark = True
    config, model = load_config(args.config, args.set)
    o = vit_options(model)
    if (config.get("training") or {}).get("precision", "float") != "float":
        print("note: the config's precision is not float; the peer runs float", file=sys.stderr)
    ok = True
    for text in args.size.split(","):
        size = [int(v) for v in text.split("x")]
        size = size * 2 if len(size) == 1 else size
        settings = {"off": (False,), "on": (True,), "both": (False, True)}[args.tf32]
        for tf32 in settings if args.device == "cuda" else (False,):
            ok = run(args, config, o, size, tf32) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
