"""Idefics3's and SmolVLM's image preprocessing with PIL and NumPy (the API process has no
torch): an image → its tiles, float32 [tiles, 3, S, S], and the grid they were cut from, equal
to transformers' `Idefics3ImageProcessor` / `SmolVLMImageProcessor` (their PIL backend).

The steps as transformers runs them, each resize with PIL's filter on the uint8 image: RGB
(transparency over white); the longest edge resized to `size["longest_edge"]` (the other edge
scaled, truncated, rounded up to even; at most 4096 px); with `do_image_splitting`, resized
again to multiples of the tile (`max_image_size["longest_edge"]`, S), cut into rows x cols
tiles of S x S in row order, and the whole resized to S x S as the global image after them
(an image of one tile is that tile alone: rows = cols = 0); without it, resized to S x S
(rows = cols = 0); then x * rescale_factor in float64 cast to float32, (x - mean) / std.
Every tile is S x S: the processor's padding and pixel masks never cover an image's own pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.config import _triple, processor_kind
from pagoda.runtime.multimodal.image_processing import checked, stacked_tiles
from PIL import Image

MAX_IMAGE_SIZE = 4096  # transformers' cap on the resized image's longest edge
PROCESSORS = tuple(f"{family}ImageProcessor{backend}" for family in ("Idefics3", "SmolVLM")
                   for backend in ("", "Fast", "Pil"))  # fmt: skip
HALF = (0.5, 0.5, 0.5)  # (IMAGENET_STANDARD_MEAN and _STD)


@dataclass(frozen=True)
class TileProcessing:
    longest_edge: int = 4 * 364  # `size`
    tile: int = 364  # `max_image_size`
    splitting: bool = True  # `do_image_splitting`
    resample: int = 1  # PIL.Image.LANCZOS
    rescale_factor: float = 1 / 255
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    @classmethod
    def from_json(cls, cfg: dict[str, Any], tile: int) -> TileProcessing:
        """The processor's fields (`preprocessor_config.json`; `{}`: the defaults at the
        tower's tile size `tile`); ValueError, one line, for another processor or size."""
        processor_kind(cfg, PROCESSORS)
        sizes = {}
        for key, default in (("size", 4 * tile), ("max_image_size", tile)):
            size = cfg.get(key, {"longest_edge": default})
            if not isinstance(size, dict) or set(size) != {"longest_edge"}:
                raise ValueError(f"preprocessor_config.json: {key} {size} is not supported "
                                 "(Idefics3's is {'longest_edge': N})")  # fmt: skip
            sizes[key] = int(size["longest_edge"])
        flags = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")
        return cls(
            longest_edge=sizes["size"],
            tile=sizes["max_image_size"],
            splitting=bool(cfg.get("do_image_splitting", True)),
            resample=int(cfg.get("resample", 1)),
            rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
            mean=_triple(cfg.get("image_mean", HALF), "image_mean"),
            std=_triple(cfg.get("image_std", HALF), "image_std"),
            **{k: bool(cfg.get(k, True)) for k in flags},
        )


def longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """(height, width) with the longest edge `longest` (the other truncated, rounded up to
    even), then capped at MAX_IMAGE_SIZE (transformers' two steps)."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) rounded up to multiples of `tile` (`resize_for_vision_encoder`)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def preprocess(image: object, p: TileProcessing) -> tuple[np.ndarray, int, int]:
    """One image → (tiles float32 [T, 3, S, S] C-contiguous, rows, cols): T = rows x cols + 1
    (the grid's tiles in row order, then the global image), or 1 where rows = cols = 0."""
    im = checked(image, p.do_convert_rgb)

    def resize(x: Image.Image, h: int, w: int) -> Image.Image:
        return x.resize((w, h), resample=p.resample)

    if p.do_resize:
        im = resize(im, *longest_edge_size(im.height, im.width, p.longest_edge))
    rows = cols = 0
    if not p.splitting:
        frames = [np.asarray(resize(im, p.tile, p.tile))]
    else:
        im = resize(im, *tile_multiple_size(im.height, im.width, p.tile))
        if im.height > p.tile or im.width > p.tile:
            rows, cols = im.height // p.tile, im.width // p.tile
            whole, s = np.asarray(im), p.tile
            frames = [whole[r * s : (r + 1) * s, c * s : (c + 1) * s]
                      for r in range(rows) for c in range(cols)]  # fmt: skip
            frames.append(np.asarray(resize(im, s, s)))
        else:
            frames = [np.asarray(im)]
    return stacked_tiles(frames, p), rows, cols
