"""The tiled families' prompt expansion (Idefics3's, InternVL's, Llama 4's `*_inputs.py`):
each image token of the prompt replaced by its image's text (the family's, with a run of
placeholders per tile), each tile one `ImageInput` over its run (`MultiModalInputs.tiles`: an
image's count), so the engine encodes a step's new tiles in one batch and a prefill chunk may
end inside any run (the engine's check of them: `image_inputs.check_tiles`).
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
