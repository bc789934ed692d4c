"""A Qwen2-VL / Qwen2.5-VL / Qwen3-VL prompt's images as the engine receives them: each
image's patches and grid (`qwen2_vl_processing.preprocess`), its `<|image_pad|>` token expanded
to the run of (h / merge) * (w / merge) placeholders the processor writes, and the prompt's
M-RoPE positions and delta computed once here, for the whole prompt (chunks and prefix-cache
hits read them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.image_inputs import (
    ImageInput,
    MultiModalInputs,
    RunsNeedImages,
    pixels_hash,
    repeat_runs,
)
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig
from pagoda.runtime.multimodal.qwen2_vl_processing import mrope_positions, placeholders, preprocess

# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`):
# the resized area's bounds, as vLLM's Qwen2-VL takes them
PROCESSOR_KWARGS = ("min_pixels", "max_pixels")


def with_processor_kwargs(vision: QwenVisionConfig, kwargs: dict[str, Any]) -> QwenVisionConfig:
    """`vision` whose processor has `kwargs` (keys of `PROCESSOR_KWARGS`); ValueError for a
    value that is not a positive integer, or min_pixels over max_pixels."""
    for key, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    processing = dataclasses.replace(vision.processing, **kwargs)
    return dataclasses.replace(vision, processing=processing)


def max_run(vision: QwenVisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image takes: an image resized to
    max_pixels, in merged patches."""
    return max(1, vision.processing.max_pixels // vision.processing.factor**2)


def prepare_image(image: object, vision: QwenVisionConfig) -> tuple[np.ndarray, tuple]:
    """One PIL image → (patches, grid); ValueError for one that cannot be read."""
    return preprocess(image, vision.processing)  # type: ignore[arg-type]


def build(token_ids: Sequence[int], prepared: Sequence[tuple[np.ndarray, tuple]],
          vision: QwenVisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each image token repeated to its image's run, the images at their runs,
    and the prompt's M-RoPE positions; ValueError for another number of image tokens."""
    m = vision.merge_size
    n = np.asarray([placeholders(g, m) for _, g in prepared], dtype=np.int64)
    out, offsets = repeat_runs(token_ids, vision.image_token_index, n)
    grids = [g for _, g in prepared]
    pos, delta = mrope_positions(len(out), offsets.tolist(), grids, m)
    images = tuple(ImageInput(p, int(o), int(k), pixels_hash(p, tuple(g)), grid=tuple(g))
                   for (p, g), o, k in zip(prepared, offsets, n))  # fmt: skip
    return out.tolist(), MultiModalInputs(images, mrope=pos, mrope_delta=delta)


def expand(token_ids: Sequence[int], num_images: int, vision: QwenVisionConfig) -> tuple:
    """RunsNeedImages: a run's length is its image's grid, known only where the image is read."""
    raise RunsNeedImages("Qwen2-VL's and Qwen3-VL's placeholder runs depend on each image's size: "
                     "they are counted where the images are read")  # fmt: skip


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: QwenVisionConfig,
          step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless each image's patches fit its grid and the tower and sit over a run of
    image tokens, and the M-RoPE positions cover the prompt."""
    ids = np.asarray(token_ids, dtype=np.int64)
    for i, im in enumerate(mm.images):
        g = im.grid
        ok = g is not None and len(g) == 3 and min(g) > 0 and g[1] % vision.merge_size == 0
        ok = ok and g[2] % vision.merge_size == 0 and im.pixel_values.dtype == np.float32
        if not ok or im.pixel_values.shape != (g[0] * g[1] * g[2], vision.patch_dim):
            raise ValueError(f"image {i}: patches {tuple(im.pixel_values.shape)} do not fit "
                             f"grid {g} of {vision.patch_dim}-wide patches")  # fmt: skip
        run = ids[im.offset : im.end]
        if (
            im.length != placeholders(g, vision.merge_size)
            or len(run) != im.length
            or (run != vision.image_token_index).any()
        ):
            raise ValueError(f"image {i}: its placeholder tokens are not at prompt positions "
                             f"[{im.offset}, {im.end})")  # fmt: skip
    if mm.mrope is None or mm.mrope.shape != (3, len(ids)):
        raise ValueError("multi_modal: the M-RoPE positions do not cover the prompt")
