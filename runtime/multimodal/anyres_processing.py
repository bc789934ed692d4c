"""LLaVA-NeXT's and LLaVA-OneVision's image preprocessing ("anyres") with PIL and NumPy (the
API process has no torch), equal to transformers' `LlavaNextImageProcessor` /
`LlavaOnevisionImageProcessor`, and the layout of an image's features, which both the prompt's
placeholder count (the processors' `_get_number_of_features`) and the model's assembly
(`model/llava_next.py`) read, so the two agree by construction.

Preprocessing: RGB; the best of the pinpoints for the image's size (`select_best_resolution`:
the most of the image's pixels kept, then the least padding); the image resized into it keeping
its aspect (PIL's filter on the uint8 image), zero-padded to it (centred), cut into crops of
the tower's size row by row; before them the whole image resized to one crop; every crop
rescaled and normalized (`image_processing.rescale_normalize`): float32 [1 + crops, 3, S, S].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pagoda.runtime.multimodal.anyres_config import AnyresVisionConfig
from pagoda.runtime.multimodal.image_processing import checked, rescale_normalize
from PIL import Image


def select_best_resolution(height: int, width: int,
                           pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:  # fmt: skip
    """The (height, width) of `pinpoints` that keeps the most of the image's pixels when it is
    scaled into it, then wastes the fewest (transformers' `select_best_resolution`)."""
    best, most, waste = pinpoints[0], 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - kept
        if kept > most or (kept == most and wasted < waste):
            best, most, waste = (h, w), kept, wasted
    return best


def fitted_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of the image scaled into `target` keeping its aspect (transformers'
    `get_patch_output_size`)."""
    th, tw = target
    sw, sh = tw / width, th / height
    if sw < sh:
        return min(math.ceil(height * sw), th), tw
    return th, min(math.ceil(width * sh), tw)


@dataclass(frozen=True)
class Layout:
    """Where an image's features come from: `grid` crops (rows, cols) after the base crop, the
    joined grid's rows [top, bottom) and columns [left, right) kept (the padding's dropped),
    then resized to `out` (rows, cols) where OneVision caps it (else the kept size); each row
    then takes a newline feature."""

    grid: tuple[int, int]
    top: int
    bottom: int
    left: int
    right: int
    out: tuple[int, int]

    @property
    def resized(self) -> bool:
        return self.out != (self.bottom - self.top, self.right - self.left)


def layout(height: int, width: int, vision: AnyresVisionConfig) -> Layout:
    """The layout of the features of an image of `height` x `width` pixels (transformers'
    `unpad_image` and, for OneVision, `pack_image_features`' downsampling)."""
    s, p = vision.image_size, vision.side
    bh, bw = select_best_resolution(height, width, vision.pinpoints)
    gh, gw = bh // s, bw // s
    ch, cw = gh * p, gw * p
    top, bottom, left, right = 0, ch, 0, cw
    if width / height > cw / ch:
        pad = (ch - int(round(height * (cw / width), 7))) // 2
        top, bottom = pad, ch - pad
    else:
        pad = (cw - int(round(width * (ch / height), 7))) // 2
        left, right = pad, cw - pad
    rows, cols = bottom - top, right - left
    if vision.max_crops:
        ratio = math.sqrt(rows * cols / (vision.max_crops * p**2))
        if ratio > 1.1:
            rows, cols = int(rows // ratio), int(cols // ratio)
    return Layout((gh, gw), top, bottom, left, right, (rows, cols))


def num_tokens(height: int, width: int, vision: AnyresVisionConfig) -> int:
    """The placeholder tokens of an image of `height` x `width` pixels: the base crop's rows,
    then the grid's rows, each with its newline (the processors' count)."""
    rows, cols = layout(height, width, vision).out
    return vision.side**2 + rows * (cols + 1)


def num_crops(height: int, width: int, vision: AnyresVisionConfig) -> int:
    """The crops the tower reads for the image: its grid's and the base one."""
    gh, gw = layout(height, width, vision).grid
    return 1 + gh * gw


def _chw(image: Image.Image) -> np.ndarray:
    pixels = np.asarray(image)
    return np.moveaxis(pixels[:, :, None] if pixels.ndim == 2 else pixels, -1, 0)


def preprocess(image: object, vision: AnyresVisionConfig) -> tuple[np.ndarray, tuple[int, int]]:
    """One image → (float32 [1 + crops, 3, S, S] pixels, its (height, width)); ValueError for
    one that cannot be read."""
    p = vision.processing
    image = checked(image, p.do_convert_rgb)
    h, w, s = image.height, image.width, vision.image_size
    best = select_best_resolution(h, w, vision.pinpoints)
    nh, nw = fitted_size(h, w, best)
    grid = _chw(image.resize((nw, nh), resample=p.resample))
    (py, ry), (px, rx) = divmod(best[0] - nh, 2), divmod(best[1] - nw, 2)
    grid = np.pad(grid, ((0, 0), (py, py + ry), (px, px + rx)))
    c = grid.shape[0]
    crops = grid.reshape(c, best[0] // s, s, best[1] // s, s).transpose(1, 3, 0, 2, 4)
    base = _chw(image.resize((s, s), resample=p.resample))
    if c != 3:
        raise ValueError(f"an image must have 3 channels after preprocessing, got {c}")
    pixels = np.concatenate([base[None], crops.reshape(-1, c, s, s)])  # [N, C, S, S]
    n = len(pixels)
    out = rescale_normalize(pixels.transpose(1, 0, 2, 3).reshape(c, n * s, s), p)
    out = out.reshape(c, n, s, s).transpose(1, 0, 2, 3)
    return np.ascontiguousarray(out, dtype=np.float32), (h, w)
