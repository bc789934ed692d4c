"""What the families whose images are tiles share (Idefics3's `idefics3_inputs.py`, Llama 4's
`llama4_inputs.py`): each image token of the prompt replaced by its image's text (the
family's, with a run of placeholders per tile), each tile one `ImageInput` over its run
(`MultiModalInputs.tiles`: an image's count), so the engine encodes a step's new tiles in one
batch and a prefill chunk may end inside any run; and the engine's check of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pagoda.runtime.multimodal.image_inputs import ImageInput, MultiModalInputs, pixels_hash

# an image's text: (its ids, the first position of each tile's run in it)
ImageText = tuple[list[int], list[int]]


def image_tokens(token_ids: Sequence[int], num_images: int, token: int) -> list[int]:
    """The positions of the prompt's image tokens; ValueError for another number of them."""
    at = np.flatnonzero(np.asarray(token_ids, dtype=np.int64) == token)
    if len(at) != num_images:
        raise ValueError(f"the prompt has {len(at)} image token(s) (id {token}) for "
                         f"{num_images} image(s): put one image token where each image "
                         "goes")  # fmt: skip
    return at.tolist()


def expanded(token_ids: Sequence[int], texts: Sequence[ImageText],
             token: int) -> tuple[list[int], list[int]]:  # fmt: skip
    """The prompt with its k-th image token (`token`) replaced by `texts[k]`, and the first
    position of every tile's run."""
    token_ids = list(token_ids)
    out: list[int] = []
    offsets, prev = [], 0
    for a, (text, starts) in zip(image_tokens(token_ids, len(texts), token), texts):
        out += token_ids[prev:a]
        offsets += [len(out) + s for s in starts]
        out += text
        prev = a + 1
    out += token_ids[prev:]
    return out, offsets


def build(token_ids: Sequence[int], images: Sequence[tuple[np.ndarray, ImageText]],
          token: int, run: int) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt expanded (`images`: each image's tiles [T, 3, S, S] and text), each tile an
    image input over its `run` placeholders."""
    ids, offsets = expanded(token_ids, [text for _, text in images], token)
    tiles = [t for pixels, _ in images for t in pixels]
    inputs = tuple(ImageInput(t, o, run, pixels_hash(t)) for t, o in zip(tiles, offsets))
    return ids, MultiModalInputs(inputs, tiles=tuple(len(p) for p, _ in images))


def check(token_ids: Sequence[int], mm: MultiModalInputs, side: int, run: int,
          placeholder: int) -> None:  # fmt: skip
    """ValueError unless each tile is float32 [3, side, side] over a run of `run`
    placeholders and the tiles add up to the images'."""
    if sum(mm.tiles) != len(mm.images) or min(mm.tiles, default=1) < 1:
        raise ValueError(f"multi_modal: tiles per image {mm.tiles} do not add up to its "
                         f"{len(mm.images)} tiles")  # fmt: skip
    ids = np.asarray(token_ids, dtype=np.int64)
    shape = (3, side, side)
    for i, im in enumerate(mm.images):
        if tuple(im.pixel_values.shape) != shape or im.pixel_values.dtype != np.float32:
            raise ValueError(f"tile {i}: pixels must be float32 {shape}, got "
                             f"{im.pixel_values.dtype} {tuple(im.pixel_values.shape)}")  # fmt: skip
        seen = ids[im.offset : im.end]
        if im.length != run or len(seen) != run or (seen != placeholder).any():
            raise ValueError(f"tile {i}: its {run} placeholder tokens are not at prompt "
                             f"positions [{im.offset}, {im.end})")  # fmt: skip
