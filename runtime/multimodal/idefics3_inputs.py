"""An Idefics3 / SmolVLM prompt's images as the engine receives them: each image is its tiles
(`idefics3_processing.preprocess`: a grid of rows x cols and the global image, or the global
image alone), and its `<image>` token becomes the text `Idefics3Processor` writes for them:

    <fake_token_around_image><row_1_col_1><image>*N ... <row_1_col_C><image>*N "\\n"
    ... (a row a line) ... "\\n\\n"
    <fake_token_around_image><global-img><image>*N<fake_token_around_image>

(without a grid: <fake_token_around_image><global-img><image>*N<fake_token_around_image>),
"\\n" and "\\n\\n" as the tokenizer writes them. Each tile is one `ImageInput` over its run of N
placeholders (`MultiModalInputs.tiles`: an image's count), so the engine encodes a step's new
tiles in one batch and a prefill chunk may end inside any run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pagoda.runtime.multimodal import tiled_inputs
from pagoda.runtime.multimodal.idefics3_config import Idefics3VisionConfig
from pagoda.runtime.multimodal.idefics3_processing import preprocess
from pagoda.runtime.multimodal.image_inputs import (
    MultiModalInputs,
    RunsNeedImages,
    check_tiles,
)

Prepared = tuple[np.ndarray, int, int]  # (tiles [T, 3, S, S], rows, cols)


# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`): none
PROCESSOR_KWARGS: tuple[str, ...] = ()


def max_run(vision: Idefics3VisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image input takes: a tile's run (each
    tile is an image input of the engine)."""
    return vision.tokens_per_image


def prepare_image(image: object, vision: Idefics3VisionConfig) -> Prepared:
    """One PIL image → (tiles, rows, cols); ValueError for one that cannot be read."""
    return preprocess(image, vision.processing)


def image_text(rows: int, cols: int, vision: Idefics3VisionConfig) -> tuple[list[int], list[int]]:
    """The ids of one image's text and the first position of each tile's run in it (its grid
    in row order, then the global image)."""
    v, n = vision, vision.tokens_per_image
    if rows > len(v.row_col) or (rows and cols > len(v.row_col[0])):
        raise ValueError(f"an image of {rows}x{cols} tiles needs <row_{rows}_col_{cols}>, which "
                         "the tokenizer lacks")  # fmt: skip
    out: list[int] = []
    starts = []
    for r in range(rows):
        for c in range(cols):
            out += [v.fake_token, v.row_col[r][c]]
            starts.append(len(out))
            out += [v.image_token_index] * n
        out += v.newline if r < rows - 1 else v.newlines2
    out += [v.fake_token, v.global_token]
    starts.append(len(out))
    out += [v.image_token_index] * n + [v.fake_token]
    return out, starts


def build(token_ids: Sequence[int], prepared: Sequence[Prepared],
          vision: Idefics3VisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each image token replaced by its image's text, each tile at its run
    (`tiled_inputs.build`); ValueError for another number of image tokens."""
    images = [(pixels, image_text(r, c, vision)) for pixels, r, c in prepared]
    return tiled_inputs.build(token_ids, images, vision.image_token_index, vision.tokens_per_image)


def expand(token_ids: Sequence[int], num_images: int,
           vision: Idefics3VisionConfig) -> tuple[list[int], list[int]]:  # fmt: skip
    """Without image splitting, each image's text (the global image alone) and its run's first
    position; RunsNeedImages with it: the grid depends on each image's size."""
    if vision.processing.splitting:
        raise RunsNeedImages("with do_image_splitting an image's tiles depend on its size: they are "
                         "counted where the images are read")  # fmt: skip
    texts = [image_text(0, 0, vision)] * num_images
    return tiled_inputs.expanded(token_ids, texts, vision.image_token_index)


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: Idefics3VisionConfig,
          step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless each tile is of the tower's shape over a run of image tokens and the
    tiles add up to the images' (`image_inputs.check_tiles`)."""
    check_tiles(token_ids, mm, vision)
