"""A LLaVA-NeXT / LLaVA-OneVision prompt's images as the engine receives them (one of the
families of `inputs.FAMILIES`): each image's crops (`anyres_processing.preprocess`) with its
(height, width) as `ImageInput.grid`, its image token repeated to the run of placeholders the
processor writes for an image of that size (`anyres_processing.num_tokens`: a run per image).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from pagoda.runtime.multimodal.anyres_config import AnyresVisionConfig
from pagoda.runtime.multimodal.anyres_processing import num_crops, num_tokens, preprocess
from pagoda.runtime.multimodal.image_inputs import (
    ImageInput,
    MultiModalInputs,
    RunsNeedImages,
    pixels_hash,
    repeat_runs,
)

# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`): none
PROCESSOR_KWARGS: tuple[str, ...] = ()


def max_run(vision: AnyresVisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image takes: an image the size of the
    largest-run pinpoint (no padding to unpad)."""
    return max(num_tokens(h, w, vision) for h, w in vision.pinpoints)


def prepare_image(image: object, vision: AnyresVisionConfig) -> tuple[np.ndarray, tuple]:
    """One PIL image → (crops, (height, width)); ValueError for one that cannot be read."""
    return preprocess(image, vision)


def content_hash(pixels: np.ndarray, size: tuple[int, int]) -> bytes:
    """The crops' hash with the image's size (which the features' unpadding reads)."""
    return hashlib.blake2b(pixels_hash(pixels) + repr(tuple(size)).encode(),
                           digest_size=16).digest()  # fmt: skip


def build(token_ids: Sequence[int], prepared: Sequence[tuple[np.ndarray, tuple]],
          vision: AnyresVisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each image token repeated to its image's run and the images at their
    runs; ValueError for another number of image tokens."""
    n = np.asarray([num_tokens(*size, vision) for _, size in prepared], dtype=np.int64)
    ids, offsets = repeat_runs(token_ids, vision.image_token_index, n)
    images = tuple(ImageInput(p, int(o), int(k), content_hash(p, size), grid=tuple(size))
                   for (p, size), o, k in zip(prepared, offsets, n))  # fmt: skip
    return ids.tolist(), MultiModalInputs(images)


def expand(token_ids: Sequence[int], num_images: int, vision: AnyresVisionConfig) -> tuple:
    """RunsNeedImages: a run's length is its image's size's, known only where the image is read."""
    raise RunsNeedImages(f"{vision.kind}'s placeholder runs depend on each image's size: "
                     "they are counted where the images are read")  # fmt: skip


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: AnyresVisionConfig,
          step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless each image's crops fit its size and the tower and sit over its run of
    image tokens."""
    ids = np.asarray(token_ids, dtype=np.int64)
    s = vision.image_size
    for i, im in enumerate(mm.images):
        size = im.grid
        ok = size is not None and len(size) == 2 and min(size) > 0
        shape = (num_crops(*size, vision), 3, s, s) if ok else None
        if shape is None or im.pixel_values.shape != shape or im.pixel_values.dtype != np.float32:
            raise ValueError(f"image {i}: crops {im.pixel_values.dtype} "
                             f"{tuple(im.pixel_values.shape)} do not fit an image of size "
                             f"{size} ({shape} float32)")  # fmt: skip
        run = ids[im.offset : im.end]
        if (
            im.length != num_tokens(*size, vision)
            or len(run) != im.length
            or (run != vision.image_token_index).any()
        ):
            raise ValueError(f"image {i}: its placeholder tokens are not at prompt positions "
                             f"[{im.offset}, {im.end})")  # fmt: skip
