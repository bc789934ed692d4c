"""Qwen2-VL's and Qwen2.5-VL's vision tower (`multimodal/qwen2_vl_config.py` for the shapes):
patches (`multimodal/qwen2_vl_processing.preprocess`) of several images, each of its own grid,
in one batch → each image's merged features, the rows its `<|image_pad|>` tokens take.

- The Conv3d patch embedding is one matmul (its kernel equals its stride: each patch row is
  one window, laid out (channel, frame, row, column) as the kernel is).
- 2-D rotary on the heads: a patch's (row, column) in the grid, block-major over the merge
  windows, rotating the first half of the head by the row, the second by the column (float32).
- Attention stays inside an image (Qwen2.5-VL's window layers: inside a window): SDPA once per
  image with a block-diagonal mask of its windows, no loop per token.
- Qwen2.5-VL reorders the patches window by window before the blocks (`window_order`) and the
  merged features back after the merger.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig

_ACT = {"quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "silu": F.silu, "gelu": F.gelu,
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}  # fmt: skip
# each kind's block MLP (None: Qwen2-VL's) and merger tensor names
_MLP = {None: ("mlp.fc1", "mlp.fc2"), "qwen3_vl": ("mlp.linear_fc1", "mlp.linear_fc2"),
        "qwen2_5_vl": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}  # fmt: skip
_MERGER = {"qwen2_vl": ("ln_q", "mlp.0", "mlp.2"), "qwen2_5_vl": ("ln_q", "mlp.0", "mlp.2"),
           "qwen3_vl": ("norm", "linear_fc1", "linear_fc2")}  # fmt: skip


def _read(t: dict[str, torch.Tensor], prefix: str, names: tuple[str, ...]) -> dict:
    """{name: (weight, bias or None)} of the tensors `prefix` + name (KeyError: one missing)."""
    return {n: (t[prefix + n + ".weight"], t.get(prefix + n + ".bias")) for n in names}


def merger(t: dict[str, torch.Tensor], prefix: str, names: tuple[str, ...]) -> dict:
    """A patch merger's (norm, fc1, fc2) under `prefix`, stored as `names`."""
    return dict(zip(("norm", "fc1", "fc2"), _read(t, prefix, names).values()))


def grid_positions(grids: np.ndarray, merge: int) -> np.ndarray:
    """int64 [N, 2]: each patch's (row, column), merge window by merge window, image by image."""
    out = []
    for t, h, w in grids.tolist():
        rows, cols = np.indices((h, w)).reshape(2, h // merge, merge, w // merge, merge)
        pos = np.stack([rows.transpose(0, 2, 1, 3).ravel(), cols.transpose(0, 2, 1, 3).ravel()], 1)
        out.append(np.tile(pos, (t, 1)))
    return np.concatenate(out).astype(np.int64)


def window_order(
    grid: tuple[int, int, int], merge: int, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's window attention over one image: the merged units in window order, and each
    unit's window id (`window`: the merged units per window side)."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    idx = np.arange(t * h * w).reshape(t, h, w)
    wy, wx = np.arange(h) // window, np.arange(w) // window
    nwx = -(-w // window)
    win = (np.arange(t)[:, None, None] * (-(-h // window)) + wy[None, :, None]) * nwx + wx[
        None, None, :
    ]
    order = np.lexsort((idx.ravel(), win.ravel()))  # stable: row order inside a window
    return idx.ravel()[order], win.ravel()[order]


class QwenVisionTower:
    """The tower's tensors (stored names under `visual.`), run in `encode`."""

    def __init__(self, t: dict[str, torch.Tensor], c: QwenVisionConfig):
        self.c = c
        self.patch = t["patch_embed.proj.weight"].reshape(c.width, -1)
        names = ("norm1", "norm2", "attn.qkv", "attn.proj", *_MLP.get(c.kind, _MLP[None]))
        self.blocks = [_read(t, f"blocks.{i}.", names) for i in range(c.depth)]
        self.merger = merger(t, "merger.", _MERGER[c.kind])
        hd = c.head_dim // 2
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    def _norm(self, x: torch.Tensor, wb) -> torch.Tensor:
        if self.c.kind == "qwen2_5_vl":  # RMSNorm in float32
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
            return wb[0] * xf.to(x.dtype)
        return F.layer_norm(x, (x.shape[-1],), wb[0], wb[1], 1e-6)

    def _rotary(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = pos[:, :, None].float() * self.inv_freq.to(pos.device)  # [N, 2, hd/4]
        f = f.reshape(len(pos), -1)
        f = torch.cat([f, f], -1)[:, None, :]  # [N, 1, head_dim]
        return f.cos(), f.sin()

    def _attention(self, x: torch.Tensor, blk, cos, sin, spans, masks) -> torch.Tensor:
        n, c = len(x), self.c
        q, k, v = F.linear(x, *blk["attn.qkv"]).reshape(n, 3, c.num_heads, -1).unbind(1)
        q, k = (_rotate(y, cos, sin) for y in (q, k))
        out = torch.empty_like(q)
        for (a, b), mask in zip(spans, masks):
            qi, ki, vi = (y[a:b].transpose(0, 1) for y in (q, k, v))
            out[a:b] = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask).transpose(0, 1)
        return F.linear(out.reshape(n, -1), *blk["attn.proj"])

    def _mlp(self, x: torch.Tensor, blk) -> torch.Tensor:
        act = _ACT[self.c.hidden_act]
        if self.c.kind == "qwen2_5_vl":
            h = act(F.linear(x, *blk["mlp.gate_proj"])) * F.linear(x, *blk["mlp.up_proj"])
            return F.linear(h, *blk["mlp.down_proj"])
        fc1, fc2 = _MLP.get(self.c.kind, _MLP[None])
        return F.linear(act(F.linear(x, *blk[fc1])), *blk[fc2])

    @torch.inference_mode()
    def encode(self, patches: torch.Tensor, grids: np.ndarray) -> torch.Tensor:
        """[N, patch_dim] patches of images of patch grids `grids` (int [I, 3]) → [N / merge^2,
        out_size] merged features, image by image in the patches' order."""
        c, dev = self.c, patches.device
        unit = c.merge_size**2
        x = patches.to(self.patch.dtype) @ self.patch.T
        pos = torch.from_numpy(grid_positions(grids, c.merge_size)).to(dev)
        sizes = (grids[:, 0] * grids[:, 1] * grids[:, 2]).tolist()
        cu = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        spans = list(itertools.pairwise(cu))
        full = [None] * len(spans)
        windowed, order = full, None
        if c.kind == "qwen2_5_vl":
            side = c.window_size // c.merge_size // c.patch_size
            parts, wmasks = [], []
            for (a, _), g in zip(spans, grids.tolist()):
                o, win = window_order(tuple(g), c.merge_size, side)
                parts.append(o + a // unit)
                w = torch.from_numpy(np.repeat(win, unit)).to(dev)
                wmasks.append(w[:, None] == w[None, :])
            order = torch.from_numpy(np.concatenate(parts)).to(dev)
            rows = (order[:, None] * unit + torch.arange(unit, device=dev)).reshape(-1)
            x, pos = x[rows], pos[rows]
            windowed = wmasks
        cos, sin = self._rotary(pos)
        for i, blk in enumerate(self.blocks):
            masks = full if (order is None or i in c.fullatt_blocks) else windowed
            x = x + self._attention(self._norm(x, blk["norm1"]), blk, cos, sin, spans, masks)
            x = x + self._mlp(self._norm(x, blk["norm2"]), blk)
        h = self.merge(self._norm(x, self.merger["norm"]), self.merger)
        if order is not None:
            h = h[torch.argsort(order)]
        return h

    def merge(self, x: torch.Tensor, m: dict) -> torch.Tensor:
        """Each merge window's patches [N, width] (normalised) → one row: fc2(gelu(fc1))."""
        h = x.reshape(-1, self.c.width * self.c.merge_size**2)
        return F.linear(F.gelu(F.linear(h, *m["fc1"])), *m["fc2"])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary in float32, rounded back to x's dtype (transformers' way)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)
