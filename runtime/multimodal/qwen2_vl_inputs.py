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
    repeat_at,
)
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig
from pagoda.runtime.multimodal.qwen2_vl_processing import mrope_positions, placeholders, preprocess
from pagoda.runtime.multimodal.qwen2_vl_video import Video, preprocess_video

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
    """The most placeholder tokens (feature rows) one image (or a video's temporal patch)
    takes: an image (frame) resized to its processor's max_pixels, in merged patches."""
    return max(1, *(p.max_pixels // p.factor**2 for p in (vision.processing, vision.video)))


def prepare_image(image: object, vision: QwenVisionConfig) -> tuple[np.ndarray, tuple]:
    """One PIL image → (patches, grid); ValueError for one that cannot be read."""
    return preprocess(image, vision.processing)  # type: ignore[arg-type]


def reads_videos(vision: QwenVisionConfig) -> bool:
    """Qwen2-VL's and Qwen2.5-VL's video input; Qwen3-VL's is refused: its processor writes
    each temporal patch's timestamp into the prompt, which is not built here."""
    return vision.kind != "qwen3_vl"


def prepare_video(video: object, vision: QwenVisionConfig) -> Video:
    """One video (`qwen2_vl_video.frames_of`'s forms) → its patches and grid; ValueError for
    one that cannot be read."""
    return preprocess_video(video, vision.video)


def build(token_ids: Sequence[int], prepared: Sequence[tuple[np.ndarray, tuple] | Video],
          vision: QwenVisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each image (video) token repeated to its image's (video's) run, in
    prompt order, the images and each video's temporal patches at their runs, and the prompt's
    M-RoPE positions; ValueError for another number of image or video tokens."""
    m = vision.merge_size
    images = [x for x in prepared if not isinstance(x, Video)]
    videos = [x for x in prepared if isinstance(x, Video)]
    ids = np.asarray(token_ids, dtype=np.int64)
    is_video = _token_counts(ids, vision, len(images), len(videos))
    items: list = [None] * len(is_video)
    image_at, video_at = np.flatnonzero(~is_video), np.flatnonzero(is_video)
    for k, x in zip(image_at, images):
        items[k] = x
    for k, x in zip(video_at, videos):
        items[k] = x
    grids = [x.grid if isinstance(x, Video) else tuple(x[1]) for x in items]
    n = np.asarray([placeholders(g, m) for g in grids], dtype=np.int64)
    at = np.flatnonzero((ids == vision.image_token_index) | (ids == vision.video_token_index))
    out, offsets = repeat_at(ids, at, n)
    scale = vision.tokens_per_second
    intervals = [x.seconds_per_grid * scale if isinstance(x, Video) and scale else 1.0
                 for x in items]  # fmt: skip
    pos, delta = mrope_positions(len(out), offsets.tolist(), grids, m, intervals)
    inputs: list[ImageInput] = []
    for x, o in zip(items, offsets.tolist()):
        if isinstance(x, Video):
            inputs.extend(_temporal_patches(x, o, m, pos[0, o:]))
        else:
            p, g = x
            k = placeholders(g, m)
            inputs.append(ImageInput(p, o, k, pixels_hash(p, tuple(g)), grid=tuple(g)))
    mm = MultiModalInputs(tuple(inputs), mrope=pos, mrope_delta=delta, num_videos=len(videos))
    return out.tolist(), mm


def _token_counts(ids: np.ndarray, vision: QwenVisionConfig, images: int,
                  videos: int) -> np.ndarray:  # fmt: skip
    """Whether each image or video token of the prompt (in order) is a video's; ValueError
    where the prompt holds another number of either."""
    found = {"image": int((ids == vision.image_token_index).sum()),
             "video": int((ids == vision.video_token_index).sum())}  # fmt: skip
    for kind, want, token in (("image", images, vision.image_token_index),
                              ("video", videos, vision.video_token_index)):  # fmt: skip
        if found[kind] != want:
            raise ValueError(f"the prompt has {found[kind]} {kind} token(s) (id {token}) for "
                             f"{want} {kind}(s): put one {kind} token where each {kind} goes")  # fmt: skip
    special = ids[(ids == vision.image_token_index) | (ids == vision.video_token_index)]
    return special == vision.video_token_index


def _temporal_patches(video: Video, offset: int, merge: int,
                      temporal: np.ndarray) -> list[ImageInput]:  # fmt: skip
    """A video's temporal patches as items of grid (1, h, w) over consecutive runs from
    `offset` (the tower encodes each temporal patch on its own: its attention, rotary and
    position table are per temporal patch, so this equals the whole video's features). Each
    one's content hash covers its temporal position after the video's first (`temporal`: the
    prompt's temporal positions from the video on): the same frames at another frame rate sit
    at other positions, so their KV is another (the prefix cache)."""
    t, h, w = video.grid
    grid = (1, h, w)
    k = placeholders(grid, merge)
    rows = h * w
    out = []
    for j in range(t):
        p = video.patches[j * rows : (j + 1) * rows]
        key = pixels_hash(p, (*grid, int(temporal[j * k] - temporal[0])))
        out.append(ImageInput(p, offset + j * k, k, key, grid=grid, video=True))
    return out


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
        token = vision.video_token_index if im.video else vision.image_token_index
        if (
            im.length != placeholders(g, vision.merge_size)
            or len(run) != im.length
            or (run != token).any()
        ):
            raise ValueError(f"image {i}: its placeholder tokens are not at prompt positions "
                             f"[{im.offset}, {im.end})")  # fmt: skip
    if mm.mrope is None or mm.mrope.shape != (3, len(ids)):
        raise ValueError("multi_modal: the M-RoPE positions do not cover the prompt")
