"""Pixtral's vision tower (transformers' `PixtralVisionModel`), inference only: several images,
each of its own size (`multimodal/pixtral_processing.preprocess`), in one pass → each image's
patch features at `vision_feature_layer`, image by image, patches in row order.

- The patch convolution (no bias; kernel = stride) is one matmul over every image's patches.
- `ln_pre`, then layers of RMSNorm (eps 1e-5) → attention → RMSNorm → gated MLP.
- 2-D rotary: a patch's (row, column) in its image's grid turning the head's even-indexed
  frequencies by the row and the odd-indexed by the column, as transformers lays them out; the
  cos / sin rows in the model's dtype, as transformers applies them.
- Each image attends only to itself (transformers' block-diagonal mask): SDPA once per image.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.multimodal.pixtral_config import PixtralVisionConfig

_ACT = {"silu": F.silu, "gelu": F.gelu}
EPS = 1e-5  # PixtralRMSNorm's, in every layer and ln_pre


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """transformers' RMSNorm: normalised in float32, cast back, times the weight."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def grid_positions(grids: np.ndarray) -> np.ndarray:
    """int64 [N, 2]: each patch's (row, column), row-major, image by image (grids: [I, 2])."""
    return np.concatenate([np.indices((h, w)).reshape(2, -1).T for h, w in grids.tolist()])


def patches(pixels: torch.Tensor, p: int) -> torch.Tensor:
    """[3, H, W] → [H/p * W/p, 3 * p * p]: each patch laid out as the convolution's kernel."""
    c, h, w = pixels.shape
    x = pixels.reshape(c, h // p, p, w // p, p).permute(1, 3, 0, 2, 4)
    return x.reshape((h // p) * (w // p), c * p * p)


class PixtralVisionTower:
    """The tower's tensors (transformers' names under the vision tower: `patch_conv.weight`,
    `ln_pre.weight`, `transformer.layers.N....`), on the device in the model's dtype."""

    def __init__(self, t: Mapping[str, torch.Tensor], c: PixtralVisionConfig) -> None:
        self.c = c
        self.patch = t["patch_conv.weight"].reshape(c.width, -1)
        self.ln_pre = t["ln_pre.weight"]
        self.layers = []
        for i in range(c.layers_run):
            p = f"transformer.layers.{i}."
            qkv = torch.cat([t[f"{p}attention.{n}_proj.weight"] for n in "qkv"])
            gate_up = torch.cat([t[f"{p}feed_forward.{n}_proj.weight"] for n in ("gate", "up")])
            self.layers.append((t[p + "attention_norm.weight"], qkv, t[p + "attention.o_proj.weight"],
                                t[p + "ffn_norm.weight"], gate_up,
                                t[p + "feed_forward.down_proj.weight"]))  # fmt: skip
        d = c.head_dim
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.inv_freq = (inv[0::2], inv[1::2])  # (rows', columns') frequencies

    def _rotary(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rows = pos[:, :1].float() * self.inv_freq[0].to(pos.device)
        cols = pos[:, 1:].float() * self.inv_freq[1].to(pos.device)
        f = torch.cat([rows, cols], -1)
        f = torch.cat([f, f], -1)[:, None, :]  # [N, 1, head_dim]
        return f.cos().to(dtype), f.sin().to(dtype)

    def _attention(self, x: torch.Tensor, layer, cos, sin, spans) -> torch.Tensor:
        n, c = len(x), self.c
        q, k, v = F.linear(x, layer[1]).reshape(n, 3, c.num_heads, -1).unbind(1)
        q, k = (y * cos + torch.cat([-y[..., y.shape[-1] // 2 :], y[..., : y.shape[-1] // 2]],
                                    -1) * sin for y in (q, k))  # fmt: skip
        out = torch.empty_like(q)
        for a, b in spans:
            qi, ki, vi = (y[a:b].transpose(0, 1) for y in (q, k, v))
            out[a:b] = F.scaled_dot_product_attention(qi, ki, vi).transpose(0, 1)
        return F.linear(out.reshape(n, -1), layer[2])

    @torch.inference_mode()
    def __call__(self, pixels: list[torch.Tensor]) -> tuple[torch.Tensor, np.ndarray]:
        """Images float32 [3, H, W] → (`hidden_states[feature_layer]` [N, width] of their
        patches, image by image; the patch grids int [I, 2])."""
        c, p = self.c, self.c.patch_size
        grids = np.asarray([(x.shape[1] // p, x.shape[2] // p) for x in pixels], dtype=np.int64)
        x = torch.cat([patches(px, p) for px in pixels]).to(self.patch.dtype) @ self.patch.T
        x = rms_norm(x, self.ln_pre)
        pos = torch.from_numpy(grid_positions(grids)).to(x.device)
        cos, sin = self._rotary(pos, x.dtype)
        cu = np.concatenate([[0], np.cumsum(grids[:, 0] * grids[:, 1])]).tolist()
        spans = list(itertools.pairwise(cu))
        act = _ACT[c.hidden_act]
        for layer in self.layers:
            x = x + self._attention(rms_norm(x, layer[0]), layer, cos, sin, spans)
            g, u = F.linear(rms_norm(x, layer[3]), layer[4]).chunk(2, -1)
            x = x + F.linear(act(g) * u, layer[5])
        return x, grids
