"""Qwen3-VL's vision tower (`multimodal/qwen3_vl_config.py` for the shapes): Qwen2-VL's
(`qwen2_vl_vision.py`: patches of several images in one batch, 2-D rotary, attention inside
each image, LayerNorm blocks) with what differs:

- the patch embedding has a bias;
- a learned square table of positions, resampled to each image's patch grid (bilinear,
  corners aligned: transformers' `get_vision_interpolation_indices_and_weights`, four taps a
  patch, in float32), added to the patch embeddings;
- DeepStack: after each block of `deepstack_visual_indexes`, its own merger (LayerNorm over
  the merged window, not each patch) gives features the text model adds to its first layers'
  image rows (`model/qwen3_vl.py`).

`encode` returns each merge window's row: the merger's features, then each DeepStack
feature in block order, side by side ([N / merge^2, out_size * (1 + deepstack)]), so the
engine keeps, slices and scatters them as one image feature (`worker/mm_encoder.py`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.model.qwen2_vl_vision import QwenVisionTower, grid_positions, merger
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig

_MERGER = ("norm", "linear_fc1", "linear_fc2")


class Qwen3VisionTower(QwenVisionTower):
    def __init__(self, t: dict[str, torch.Tensor], c: QwenVisionConfig):
        super().__init__(t, c)
        self.patch_bias = t["patch_embed.proj.bias"]
        self.pos_table = t["pos_embed.weight"]  # [side * side, width]
        self.side = math.isqrt(c.pos_embeddings)
        # block -> its DeepStack merger, in block order (transformers appends them so)
        order = sorted(range(len(c.deepstack)), key=lambda k: c.deepstack[k])
        self.deepstack = {c.deepstack[k]: merger(t, f"deepstack_merger_list.{k}.", _MERGER)
                          for k in order}  # fmt: skip

    def positions(self, pos: torch.Tensor, grids: np.ndarray) -> torch.Tensor:
        """float32 [N, width]: the table resampled to each patch's (row, column) `pos` of its
        image's grid (`grids`, the patches in their order)."""
        side, dev = self.side, pos.device
        sizes = np.repeat(grids[:, 1:], grids[:, 0] * grids[:, 1] * grids[:, 2], axis=0)
        sizes = torch.from_numpy(sizes).to(dev)  # [N, 2]: its image's (h, w)
        src = pos.float() * (side - 1) / torch.clamp(sizes - 1, min=1)
        floor = torch.floor(src)
        off = torch.arange(2, device=dev)
        taps = (floor.long()[..., None] + off).clamp(0, side - 1)  # [N, 2 axes, 2 taps]
        wts = (1 - (src[..., None] - floor[..., None] - off).abs()).clamp(min=0)
        idx = (taps[:, 0, :, None] * side + taps[:, 1, None, :]).reshape(-1, 4)
        w = (wts[:, 0, :, None] * wts[:, 1, None, :]).reshape(-1, 4, 1)
        return (self.pos_table[idx] * w).sum(1)

    def _merge_post(self, x: torch.Tensor, m: dict) -> torch.Tensor:
        """A DeepStack merger: the window's patches side by side, then its LayerNorm."""
        h = x.reshape(-1, self.c.width * self.c.merge_size**2)
        return self.merge(F.layer_norm(h, (h.shape[-1],), *m["norm"], 1e-6), m)

    @torch.inference_mode()
    def encode(self, patches: torch.Tensor, grids: np.ndarray) -> torch.Tensor:
        """[N, patch_dim] patches of images of patch grids `grids` (int [I, 3]) → [N / merge^2,
        out_size * (1 + deepstack)]: merged features, then the DeepStack features."""
        c, dev = self.c, patches.device
        x = F.linear(patches.to(self.patch.dtype), self.patch, self.patch_bias)
        pos = torch.from_numpy(grid_positions(grids, c.merge_size)).to(dev)
        x = x + self.positions(pos, grids).to(x.dtype)
        sizes = (grids[:, 0] * grids[:, 1] * grids[:, 2]).tolist()
        spans = list(itertools.pairwise(np.concatenate([[0], np.cumsum(sizes)]).tolist()))
        full = [None] * len(spans)
        cos, sin = self._rotary(pos)
        stacked = []
        for i, blk in enumerate(self.blocks):
            x = x + self._attention(self._norm(x, blk["norm1"]), blk, cos, sin, spans, full)
            x = x + self._mlp(self._norm(x, blk["norm2"]), blk)
            if i in self.deepstack:
                stacked.append(self._merge_post(x, self.deepstack[i]))
        main = self.merge(self._norm(x, self.merger["norm"]), self.merger)
        return torch.cat([main, *stacked], dim=-1)
