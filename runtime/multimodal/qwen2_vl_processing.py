"""Qwen2-VL's and Qwen2.5-VL's image side on the host (PIL + NumPy, no torch: the API process
runs it too): `Qwen2VLImageProcessor`'s pixels and grid, the placeholder run each image takes in
the prompt, and the 3-D (M-RoPE) positions of a prompt.

- `smart_resize`: each side a multiple of patch_size x merge_size, the area within
  [min_pixels, max_pixels], the aspect kept as near as can be (transformers' function).
- `preprocess`: RGB, resize (PIL's filter on the uint8 image), rescale, normalize, then the
  patches transformers' `patchify` lays out: one row per patch, in merge-window order, each
  image repeated to `temporal_patch_size` frames: float32 [h * w, 3 * T * P * P], grid (1, h, w).
- `placeholders`: an image's run of `<|image_pad|>` tokens, (h / merge) * (w / merge) of them.
- `mrope_positions`: a prompt's int64 [3, L] (temporal, height, width) positions and its delta
  (a decode at step s reads position s + delta on all three), as `get_rope_index` computes them:
  text at sequential positions, an image's tokens at (start, start + row, start + column), the
  text after it from start + max(rows, columns). Vectorised: one NumPy pass per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.config import PixelSteps, pixel_steps, processor_kind
from pagoda.runtime.multimodal.image_processing import sized_pixels
from PIL import Image

_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")
MAX_ASPECT = 200  # transformers refuses a longer side over 200 times the shorter


@dataclass(frozen=True)
class QwenImageProcessing(PixelSteps):
    """`Qwen2VLImageProcessor`'s fields (its defaults: 56*56 to 28*28*1280 pixels, 14 px
    patches merged 2x2, two frames per patch, CLIP's mean and std, bicubic)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"the image processor's min_pixels {self.min_pixels} and "
                             f"max_pixels {self.max_pixels} are not 0 < min <= max")  # fmt: skip
        if min(self.patch_size, self.temporal_patch_size, self.merge_size) < 1:
            raise ValueError("the image processor's patch_size, temporal_patch_size and "
                             "merge_size must be >= 1")  # fmt: skip

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_json(cls, cfg: dict[str, Any]) -> QwenImageProcessing:
        processor_kind(cfg, _PROCESSORS, "Qwen2VLImageProcessor")
        size = cfg.get("size") or {}
        lo = cfg.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
        hi = cfg.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
        d = cls()
        return cls(
            min_pixels=int(lo or d.min_pixels),
            max_pixels=int(hi or d.max_pixels),
            patch_size=int(cfg.get("patch_size", d.patch_size)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", d.temporal_patch_size)),
            merge_size=int(cfg.get("merge_size", d.merge_size)),
            **pixel_steps(cfg),
        )


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:  # fmt: skip
    """(height, width), multiples of `factor` with an area within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"an image of {width}x{height} pixels is too narrow (the aspect ratio "
                         f"must be under {MAX_ASPECT})")  # fmt: skip
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def patchify(pixels: np.ndarray, p: QwenImageProcessing) -> np.ndarray:
    """[3, H, W] → float32 [h * w, 3 * T * P * P]: merge windows in row order, the patches of
    a window in row order, each patch (channel, frame, row, column) with the frame repeated."""
    c, height, width = pixels.shape
    ps, m, t = p.patch_size, p.merge_size, p.temporal_patch_size
    gh, gw = height // ps, width // ps
    x = pixels.reshape(c, gh // m, m, ps, gw // m, m, ps).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, ps, ps))
    return np.ascontiguousarray(x.reshape(gh * gw, c * t * ps * ps), dtype=np.float32)


def preprocess(
    image: Image.Image, p: QwenImageProcessing
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image → (patches float32 [h * w, 3 * T * P * P], grid (1, h, w)), as
    `Qwen2VLImageProcessor` computes them."""
    size = lambda h, w: smart_resize(h, w, p.factor, p.min_pixels, p.max_pixels)  # noqa: E731
    pixels = sized_pixels(image, p, size, p.factor)
    grid = (1, pixels.shape[1] // p.patch_size, pixels.shape[2] // p.patch_size)
    return patchify(pixels, p), grid


def placeholders(grid: Sequence[int], merge_size: int) -> int:
    """The `<|image_pad|>` tokens (the merged features) of an image of patch grid (t, h, w)."""
    t, h, w = grid
    return t * (h // merge_size) * (w // merge_size)


def mrope_positions(length: int, offsets: Sequence[int], grids: Sequence[Sequence[int]],
                    merge_size: int, intervals: Sequence[float] | None = None,
                    ) -> tuple[np.ndarray, int]:  # fmt: skip
    """int64 [3, length] positions of a prompt whose images and videos (patch grids `grids`)
    take the runs at `offsets` (in prompt order), and its delta: max position + 1 - length.
    A run's temporal positions are its temporal patches times its `intervals` entry, floored
    (Qwen2.5-VL's videos; 1 elsewhere)."""
    g = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    t, h, w = g[:, 0], g[:, 1] // merge_size, g[:, 2] // merge_size
    n = t * h * w  # each image's tokens
    advance = np.maximum(h, w)  # the positions an image moves the text after it on by
    at = np.asarray(offsets, dtype=np.int64)
    shift = np.zeros(length + 1, dtype=np.int64)
    np.add.at(shift, at + n, n - advance)  # each image ends: later text moves back
    pos = np.arange(length, dtype=np.int64) - np.cumsum(shift)[:length]
    out = np.repeat(pos[None], 3, axis=0)
    for i, (o, k, ti, hi, wi) in enumerate(
        zip(at.tolist(), n.tolist(), t.tolist(), h.tolist(), w.tolist())
    ):
        start = pos[o]
        grid = np.indices((ti, hi, wi), dtype=np.int64).reshape(3, k)
        if intervals is not None and intervals[i] != 1:
            grid[0] = (grid[0].astype(np.float32) * np.float32(intervals[i])).astype(np.int64)
        out[:, o : o + k] = grid + start
    delta = int(out.max()) + 1 - length if length else 0
    return out, delta
