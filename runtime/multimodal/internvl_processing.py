"""InternVL's image preprocessing with PIL and NumPy (the API process has no torch): an image →
its tiles, float32 [T, 3, S, S], equal to what transformers' `InternVLProcessor` hands the model
through `GotOcr2ImageProcessor` (its PIL backend).

The steps as transformers runs them: RGB (transparency over white); with `crop_to_patches`
(InternVLProcessor's default, whatever the image processor's own config says) and
`max_patches` > 1, the grid of columns x rows (min_patches <= cols x rows <= max_patches)
whose aspect ratio is closest to the image's (a tie goes to the larger grid while the image's
area exceeds half of the grid's), the image resized with PIL's filter to that grid of S x S
tiles and cut in row order, and, where that gives more than one tile, the whole image resized
to S x S after them (the thumbnail); otherwise one tile, the image resized to S x S. Then
x * rescale_factor in float64 cast to float32, (x - mean) / std.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.config import _triple, processor_kind
from pagoda.runtime.multimodal.image_processing import checked, stacked_tiles

PROCESSORS = tuple(f"GotOcr2ImageProcessor{b}" for b in ("", "Fast", "Pil"))
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # (GotOcr2ImageProcessor's class defaults)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class TileProcessing:
    tile: int = 448  # `size` {"height": S, "width": S}
    min_patches: int = 1
    max_patches: int = 12
    crop_to_patches: bool = True  # (InternVLProcessor's images_kwargs default)
    resample: int = 3  # PIL.Image.BICUBIC
    rescale_factor: float = 1 / 255
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_patches <= self.max_patches:
            raise ValueError(f"min_patches {self.min_patches} and max_patches "
                             f"{self.max_patches} must be 1 <= min_patches <= max_patches")  # fmt: skip

    @property
    def tiling(self) -> bool:
        """Whether an image's tiles depend on its size."""
        return self.crop_to_patches and self.max_patches > 1

    @property
    def most_tiles(self) -> int:
        """The most tiles one image gives (its grid's and the thumbnail)."""
        return self.max_patches + 1 if self.tiling else 1

    @classmethod
    def from_json(cls, cfg: dict[str, Any], tile: int) -> TileProcessing:
        """The processor's fields (`preprocessor_config.json`; `{}`: the defaults at the
        tower's tile size `tile`); ValueError, one line, for another processor or size."""
        processor_kind(cfg, PROCESSORS)
        size = cfg.get("size", {"height": tile, "width": tile})
        if not isinstance(size, dict) or set(size) != {"height", "width"} or (
                size["height"] != tile or size["width"] != tile):  # fmt: skip
            raise ValueError(f"preprocessor_config.json: size {size} is not the tower's "
                             f"{tile} x {tile} tile")  # fmt: skip
        if not cfg.get("do_resize", True):
            raise ValueError("preprocessor_config.json: do_resize false is not supported (the "
                             "tower reads tiles of its own size)")  # fmt: skip
        flags = ("do_rescale", "do_normalize", "do_convert_rgb")
        return cls(
            tile=tile,
            min_patches=int(cfg.get("min_patches", 1)),
            max_patches=int(cfg.get("max_patches", 12)),
            resample=int(cfg.get("resample", 3)),
            rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
            mean=_triple(cfg.get("image_mean", CLIP_MEAN), "image_mean"),
            std=_triple(cfg.get("image_std", CLIP_STD), "image_std"),
            **{k: bool(cfg.get(k, True)) for k in flags},
        )


@lru_cache(maxsize=64)
def _arrangements(low: int, high: int) -> tuple[tuple[int, int], ...]:
    """Every (columns, rows) with low <= columns x rows <= high, by their product (stable:
    `get_all_supported_aspect_ratios`'s order)."""
    grids = [(w, h) for w in range(1, high + 1) for h in range(1, high + 1) if low <= w * h <= high]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def grid(height: int, width: int, p: TileProcessing) -> tuple[int, int]:
    """(columns, rows) of an image of `height` x `width` (`get_optimal_tiled_canvas`)."""
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in _arrangements(p.min_patches, p.max_patches):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * p.tile * p.tile * cols * rows:
            best = (cols, rows)
    return best


def num_tiles(height: int, width: int, p: TileProcessing) -> int:
    """The tiles an image of `height` x `width` gives (its grid's, and the thumbnail's where
    the grid has more than one)."""
    if not p.tiling:
        return 1
    cols, rows = grid(height, width, p)
    return cols * rows + (cols * rows > 1)


def preprocess(image: object, p: TileProcessing) -> np.ndarray:
    """One image → its tiles float32 [T, 3, S, S] (C-contiguous): the grid's in row order,
    then the thumbnail; one tile where the grid is 1 x 1 or tiling is off."""
    im = checked(image, p.do_convert_rgb)
    s = p.tile
    frames = []
    if p.tiling:
        cols, rows = grid(im.height, im.width, p)
        whole = np.asarray(im.resize((cols * s, rows * s), resample=p.resample))
        frames = [whole[r * s : (r + 1) * s, c * s : (c + 1) * s]
                  for r in range(rows) for c in range(cols)]  # fmt: skip
    if len(frames) != 1:
        frames.append(np.asarray(im.resize((s, s), resample=p.resample)))
    return stacked_tiles(frames, p)
