"""Pixtral's image preprocessing on the host (PIL + NumPy, no torch: the API process runs it
too), equal to transformers' `PixtralImageProcessor` as `PixtralProcessor` calls it, and the
run of tokens each image takes in the prompt.

- `resized_shape`: an image larger than `longest_edge` (either side) scaled down to fit, the
  aspect kept (sides floored), then each side rounded up to a multiple of the patch (the tower's
  patch x `spatial_merge_size`: the processor's); a smaller image is only rounded up. No crop.
- `preprocess`: RGB, that resize (PIL's filter on the uint8 image), rescale, normalize: float32
  [3, H, W], each image of its own size (no padding).
- `run_tokens`: `[IMG]` x columns then `[IMG_BREAK]`, row by row, the last `[IMG_BREAK]`
  `[IMG_END]` (the processor's `replace_image_token`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.config import PixelSteps, pixel_steps, processor_kind
from pagoda.runtime.multimodal.image_processing import sized_pixels
from PIL import Image

_PROCESSORS = ("PixtralImageProcessor", "PixtralImageProcessorFast", "PixtralImageProcessorPil")


@dataclass(frozen=True)
class PixtralImageProcessing(PixelSteps):
    """`PixtralImageProcessor`'s fields (its defaults: 1024 px longest edge, bicubic, CLIP's
    mean and std); `patch`: the multiple each side is rounded up to (set from the model)."""

    max_size: tuple[int, int] = (1024, 1024)  # (height, width) the image is scaled to fit
    patch: int = 16

    def __post_init__(self) -> None:
        if min(*self.max_size, self.patch) < 1:
            raise ValueError(f"the image processor's size {self.max_size} and patch "
                             f"{self.patch} must be >= 1")  # fmt: skip

    @classmethod
    def from_json(cls, cfg: dict[str, Any], patch: int) -> PixtralImageProcessing:
        """preprocessor_config.json's fields; ValueError, one line, for another processor, a
        center crop, or a size other than {"longest_edge"} / {"height", "width"}."""
        processor_kind(cfg, _PROCESSORS, "PixtralImageProcessor")
        if cfg.get("do_center_crop"):
            raise ValueError("preprocessor_config.json: do_center_crop true is not supported "
                             "(Pixtral's processor reads whole images)")  # fmt: skip
        size = cfg.get("size") or {"longest_edge": 1024}
        if isinstance(size, int):
            size = {"longest_edge": size}
        if set(size) == {"longest_edge"}:
            max_size = (int(size["longest_edge"]),) * 2
        elif set(size) == {"height", "width"}:
            max_size = (int(size["height"]), int(size["width"]))
        else:
            raise ValueError(f"preprocessor_config.json: size {size} is not supported "
                             "({'longest_edge': N} or {'height': H, 'width': W})")  # fmt: skip
        return cls(max_size=max_size, patch=patch, **pixel_steps(cfg))  # type: ignore[arg-type]


def resized_shape(height: int, width: int, p: PixtralImageProcessing) -> tuple[int, int]:
    """(height, width) the processor resizes an image to: scaled down to fit `max_size`, each
    side then rounded up to a multiple of `patch` (transformers' `get_resize_output_image_size`)."""
    ratio = max(height / p.max_size[0], width / p.max_size[1])
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return (height - 1) // p.patch * p.patch + p.patch, (width - 1) // p.patch * p.patch + p.patch


def preprocess(image: Image.Image, p: PixtralImageProcessing) -> np.ndarray:
    """One image → float32 [3, H, W] (H, W multiples of `patch`), as `PixtralImageProcessor`
    computes it; ValueError, one line, for an image that cannot be read."""
    pixels = sized_pixels(image, p, lambda h, w: resized_shape(h, w, p), p.patch)
    return np.ascontiguousarray(pixels, dtype=np.float32)


def run_tokens(rows: int, cols: int, image: int, brk: int, end: int) -> np.ndarray:
    """int64 [rows * (cols + 1)]: the prompt's run of one image of rows x cols tokens."""
    run = np.full((rows, cols + 1), image, dtype=np.int64)
    run[:, -1] = brk
    run[-1, -1] = end
    return run.reshape(-1)
