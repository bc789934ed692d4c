"""A Llama 4 prompt's images as the engine receives them (one of the families of
`inputs.FAMILIES`): each image is its tiles (`llama4_processing.preprocess`: a grid of rows x
cols and, with more than one, the global tile), and its `<|image|>` token becomes the text
`Llama4Processor` writes for them:

    <|image_start|>
    <|patch|>*N <|tile_x_separator|> ... <|patch|>*N <|tile_y_separator|>   (a row a line)
    ...
    <|image|> <|patch|>*N <|image_end|>

(one tile: `<|image_start|><|image|><|patch|>*N<|image_end|>`). Each tile is one `ImageInput`
over its run of N `<|patch|>` placeholders (`tiled_inputs.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from pagoda.runtime.multimodal import tiled_inputs
from pagoda.runtime.multimodal.image_inputs import MultiModalInputs, RunsNeedImages, check_tiles
from pagoda.runtime.multimodal.llama4_processing import preprocess
from pagoda.runtime.multimodal.llama4_vision_config import Llama4VisionConfig

Prepared = tuple[np.ndarray, int, int]  # (tiles [T, 3, S, S], rows, cols)

# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`)
PROCESSOR_KWARGS = ("max_patches", "resize_to_max_canvas")


def with_processor_kwargs(vision: Llama4VisionConfig, kwargs: dict[str, Any]) -> Llama4VisionConfig:
    """`vision` whose processor has `kwargs` (keys of `PROCESSOR_KWARGS`); ValueError for a
    max_patches that is not a positive integer or a resize_to_max_canvas that is not a bool."""
    for key, value in kwargs.items():
        if key == "max_patches" and (isinstance(value, bool) or not isinstance(value, int)
                                     or value < 1):  # fmt: skip
            raise ValueError(f"max_patches must be a positive integer, got {value!r}")
        if key == "resize_to_max_canvas" and not isinstance(value, bool):
            raise ValueError(f"resize_to_max_canvas must be true or false, got {value!r}")
    return dataclasses.replace(vision, processing=dataclasses.replace(vision.processing, **kwargs))


def max_run(vision: Llama4VisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image input takes: a tile's run (each
    tile is an image input of the engine)."""
    return vision.tokens_per_image


def prepare_image(image: object, vision: Llama4VisionConfig) -> Prepared:
    """One PIL image → (tiles, rows, cols); ValueError for one that cannot be read."""
    return preprocess(image, vision.processing)


def image_text(rows: int, cols: int, vision: Llama4VisionConfig) -> tiled_inputs.ImageText:
    """The ids of one image's text and the first position of each tile's run in it (its grid
    in row order, then the global tile; the grid alone where it is one tile)."""
    v, n = vision, vision.tokens_per_image
    out, starts = [v.start], []
    if rows * cols > 1:
        for _ in range(rows):
            for c in range(cols):
                starts.append(len(out))
                out += [v.image_token_index] * n
                if c < cols - 1:
                    out.append(v.tile_x)
            out.append(v.tile_y)
    out.append(v.image_token)
    starts.append(len(out))
    out += [v.image_token_index] * n + [v.end]
    return out, starts


def build(token_ids: Sequence[int], prepared: Sequence[Prepared],
          vision: Llama4VisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each `<|image|>` replaced by its image's text, each tile at its run;
    ValueError for another number of `<|image|>` tokens."""
    images = [(pixels, image_text(r, c, vision)) for pixels, r, c in prepared]
    return tiled_inputs.build(token_ids, images, vision.image_token, vision.tokens_per_image)


def expand(token_ids: Sequence[int], num_images: int,
           vision: Llama4VisionConfig) -> tuple[list[int], list[int]]:  # fmt: skip
    """With max_patches 1, each image's text (one tile) and its run's first position;
    RunsNeedImages otherwise: the grid depends on each image's size."""
    if vision.processing.max_patches > 1:
        raise RunsNeedImages("with max_patches over 1 an image's tiles depend on its size: they are "
                         "counted where the images are read")  # fmt: skip
    text = image_text(1, 1, vision)
    return tiled_inputs.expanded(token_ids, [text] * num_images, vision.image_token)


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: Llama4VisionConfig,
          step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless each tile is of the tower's shape over a run of `<|patch|>` tokens
    and the tiles add up to the images'."""
    check_tiles(token_ids, mm, vision)
