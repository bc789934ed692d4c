"""Images of a fixed number of placeholder tokens each, LLaVA 1.5's and Gemma 3's: one image
token per image in the prompt repeated to the image's run (Gemma 3's marker replaced by its
text around the run), each image's pixels preprocessed to the tower's square (one of the
families of `inputs.FAMILIES`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pagoda.runtime.multimodal.config import VisionConfig
from pagoda.runtime.multimodal.image_inputs import ImageInput, MultiModalInputs, pixels_hash
from pagoda.runtime.multimodal.image_processing import preprocess

# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`):
# none, a run is the tower's fixed size (so no `with_processor_kwargs` either)
PROCESSOR_KWARGS: tuple[str, ...] = ()


def max_run(vision: VisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image takes: every image's run."""
    return vision.tokens_per_image


def prepare_image(image: object, vision: VisionConfig) -> np.ndarray:
    """One image as the checkpoint's processor prepares it: float32 [3, H, W]."""
    return preprocess(image, vision.processing)


def expand(
    token_ids: Sequence[int], num_images: int, vision: VisionConfig
) -> tuple[list[int], list[int]]:
    """The prompt with each image's marker (LLaVA's: the image token) replaced by its run of
    image tokens (with Gemma 3's text around it: `marked`), and each run's first position;
    ValueError where the prompt holds another number of markers."""
    token, n = vision.image_token_index, vision.tokens_per_image
    marker = token if vision.marker is None else vision.marker
    ids = np.asarray(token_ids, dtype=np.int64)
    at = np.flatnonzero(ids == marker)
    if len(at) != num_images:
        raise ValueError(
            f"the prompt has {len(at)} image token(s) (id {marker}) for "
            f"{num_images} image(s): put one image token where each image goes"
        )
    if vision.marker is not None:
        return marked(ids.tolist(), at.tolist(), vision)
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[at] = n
    offsets = at + np.arange(len(at)) * (n - 1)
    return np.repeat(ids, repeats).tolist(), offsets.tolist()


def marked(ids: list[int], at: list[int], vision: VisionConfig) -> tuple[list[int], list[int]]:
    """Gemma 3's: each marker at `at` → prefix + image tokens + suffix, a newline token at
    either end merged with the prompt's newline token beside it into the one token of the
    longer run where the tokenizer has it (what tokenizing the processor's text gives)."""
    nl = {t: k + 1 for k, t in enumerate(vision.newlines)}
    run = [vision.image_token_index] * vision.tokens_per_image
    out: list[int] = []
    offsets, prev = [], 0
    for a in at:
        out += ids[prev:a]
        head = list(vision.prefix)
        if out and head and out[-1] in nl and head[0] in nl:
            k = nl[out[-1]] + nl[head[0]]
            if k <= len(vision.newlines):
                out.pop()
                head[0] = vision.newlines[k - 1]
        out += head
        offsets.append(len(out))
        out += run + list(vision.suffix)
        prev = a + 1
        if vision.suffix and out[-1] in nl and prev < len(ids) and ids[prev] in nl:
            k = nl[out[-1]] + nl[ids[prev]]
            if k <= len(vision.newlines):
                out[-1] = vision.newlines[k - 1]
                prev += 1
    out += ids[prev:]
    return out, offsets


def build(token_ids: Sequence[int], pixels: Sequence[np.ndarray],
          vision: VisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt `expand`ed, and the images placed at their runs."""
    ids, offsets = expand(token_ids, len(pixels), vision)
    n = vision.tokens_per_image
    images = tuple(ImageInput(p, o, n, pixels_hash(p)) for p, o in zip(pixels, offsets))
    return ids, MultiModalInputs(images, bidirectional=vision.bidirectional)


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: VisionConfig,
          step_tokens: int | None) -> None:  # fmt: skip
    """ValueError unless each image is of the tower's shape over a run of image tokens (and a
    bidirectional image fits one prefill chunk of `step_tokens`)."""
    if mm.bidirectional != vision.bidirectional:
        raise ValueError("multi_modal was built for another model's images (bidirectional "
                         f"{mm.bidirectional}, this model's {vision.bidirectional})")  # fmt: skip
    if vision.bidirectional and step_tokens is not None and vision.tokens_per_image > step_tokens:
        raise ValueError(f"an image's {vision.tokens_per_image} tokens are one prefill chunk, "
                         f"more than max_num_batched_tokens {step_tokens}")  # fmt: skip
    ids = np.asarray(token_ids, dtype=np.int64)
    shape = (3, vision.image_size, vision.image_size)
    for i, im in enumerate(mm.images):
        if tuple(im.pixel_values.shape) != shape or im.pixel_values.dtype != np.float32:
            raise ValueError(f"image {i}: pixels must be float32 {shape}, got "
                             f"{im.pixel_values.dtype} {tuple(im.pixel_values.shape)}")  # fmt: skip
        run = ids[im.offset : im.end]
        if (
            im.length != vision.tokens_per_image
            or len(run) != im.length
            or (run != vision.image_token_index).any()
        ):
            raise ValueError(f"image {i}: its {vision.tokens_per_image} placeholder tokens are "
                             f"not at prompt positions [{im.offset}, {im.end})")  # fmt: skip
