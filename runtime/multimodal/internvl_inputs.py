"""An InternVL prompt's images as the engine receives them: each image is its tiles
(`internvl_processing.preprocess`: a grid's tiles and the thumbnail, or one tile), and its
`<IMG_CONTEXT>` token becomes what `InternVLProcessor` writes for them:

    <img> <IMG_CONTEXT> * (N x tiles) </img>

(N: a tile's rows). Each tile is one `ImageInput` over its N placeholders, the tiles of an
image back to back (`MultiModalInputs.tiles`: each image's count), so the engine encodes a
step's new tiles in one batch and a prefill chunk may end inside any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from pagoda.runtime.multimodal import tiled_inputs
from pagoda.runtime.multimodal.image_inputs import (
    MultiModalInputs,
    RunsNeedImages,
    check_tiles,
)
from pagoda.runtime.multimodal.internvl_config import InternVLVisionConfig
from pagoda.runtime.multimodal.internvl_processing import preprocess

# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`)
PROCESSOR_KWARGS: tuple[str, ...] = ("min_patches", "max_patches", "crop_to_patches")


def with_processor_kwargs(vision: InternVLVisionConfig,
                          kwargs: dict[str, Any]) -> InternVLVisionConfig:  # fmt: skip
    """`vision` whose processor has `kwargs` (keys of `PROCESSOR_KWARGS`); ValueError for a
    bound that is not a positive integer, min_patches over max_patches, or a crop_to_patches
    that is not a boolean."""
    for key, value in kwargs.items():
        if key == "crop_to_patches":
            if not isinstance(value, bool):
                raise ValueError(f"crop_to_patches must be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    processing = dataclasses.replace(vision.processing, **kwargs)
    return dataclasses.replace(vision, processing=processing)


def max_run(vision: InternVLVisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image input takes: a tile's run (each
    tile is an image input of the engine)."""
    return vision.tokens_per_image


def prepare_image(image: object, vision: InternVLVisionConfig) -> np.ndarray:
    """One PIL image → its tiles [T, 3, S, S]; ValueError for one that cannot be read."""
    return preprocess(image, vision.processing)


def image_text(tiles: int, vision: InternVLVisionConfig) -> tiled_inputs.ImageText:
    """One image's text: `<img>`, its `tiles` tiles' runs of placeholders, `</img>`; and the
    first position of each tile's run in it."""
    n = vision.tokens_per_image
    text = [vision.start_token] + [vision.image_token_index] * (tiles * n) + [vision.end_token]
    return text, list(range(1, 1 + tiles * n, n))


def build(token_ids: Sequence[int], prepared: Sequence[np.ndarray],
          vision: InternVLVisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each image token replaced by its image's text, each tile at its run
    (`tiled_inputs.build`); ValueError for another number of image tokens."""
    images = [(pixels, image_text(len(pixels), vision)) for pixels in prepared]
    return tiled_inputs.build(token_ids, images, vision.image_token_index, vision.tokens_per_image)


def expand(token_ids: Sequence[int], num_images: int,
           vision: InternVLVisionConfig) -> tuple[list[int], list[int]]:  # fmt: skip
    """Without tiling (crop_to_patches off or max_patches 1), each image's run of one tile and
    its first position; RunsNeedImages with it: the tiles depend on each image's size."""
    if vision.processing.tiling:
        raise RunsNeedImages("with crop_to_patches an image's tiles depend on its size: they are "
                         "counted where the images are read")  # fmt: skip
    texts = [image_text(1, vision)] * num_images
    return tiled_inputs.expanded(token_ids, texts, vision.image_token_index)


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: InternVLVisionConfig,
          step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless each tile is of the tower's shape over a run of image tokens and the
    tiles add up to the images' (`image_inputs.check_tiles`)."""
    check_tiles(token_ids, mm, vision)
