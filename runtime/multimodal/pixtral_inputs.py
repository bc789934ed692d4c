"""A Pixtral prompt's images as the engine receives them (Mistral 3's, LLaVA-Pixtral's): each
image's pixels at its own size (`pixtral_processing.preprocess`) and its `[IMG]` token expanded
to the run `PixtralProcessor` writes: rows x (columns `[IMG]` + `[IMG_BREAK]`), the last break
`[IMG_END]`, rows and columns the image's merged patches (`ImageInput.grid` (1, rows, columns)).
The whole run is the image's: the model's features for it hold the embeddings of the break and
end tokens at their rows (`model/pixtral.py`), so a prefill chunk may end anywhere in it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pagoda.runtime.multimodal.image_inputs import (
    ImageInput,
    MultiModalInputs,
    RunsNeedImages,
    pixels_hash,
)
from pagoda.runtime.multimodal.pixtral_config import PixtralVisionConfig
from pagoda.runtime.multimodal.pixtral_processing import preprocess, run_tokens

# the image processor's settings `--mm-processor-kwargs` may set (`processor_kwargs.py`): none
PROCESSOR_KWARGS: tuple[str, ...] = ()


def max_run(vision: PixtralVisionConfig) -> int:
    """The most placeholder tokens (feature rows) one image takes: an image scaled to fill
    `max_size`, each side rounded up to the patch (its [IMG_BREAK] / [IMG_END] rows too)."""
    p = vision.processing
    rows, cols = (-(-side // p.patch) for side in p.max_size)
    return rows * (cols + 1)


def prepare_image(image: object, vision: PixtralVisionConfig) -> np.ndarray:
    """One PIL image → float32 [3, H, W]; ValueError for one that cannot be read."""
    return preprocess(image, vision.processing)  # type: ignore[arg-type]


def _run(pixels: np.ndarray, vision: PixtralVisionConfig) -> np.ndarray:
    f = vision.processing.patch
    return run_tokens(pixels.shape[1] // f, pixels.shape[2] // f, vision.image_token_index,
                      vision.break_token, vision.end_token)  # fmt: skip


def build(token_ids: Sequence[int], prepared: Sequence[np.ndarray],
          vision: PixtralVisionConfig) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt with each `[IMG]` token replaced by its image's run, and the images at their
    runs; ValueError for another number of image tokens."""
    token = vision.image_token_index
    ids = np.asarray(token_ids, dtype=np.int64)
    at = np.flatnonzero(ids == token)
    if len(at) != len(prepared):
        raise ValueError(f"the prompt has {len(at)} image token(s) (id {token}) for "
                         f"{len(prepared)} image(s): put one image token where each image goes")  # fmt: skip
    runs = [_run(p, vision) for p in prepared]
    pieces = np.split(ids, at)
    out = [pieces[0]]
    for run, piece in zip(runs, pieces[1:]):
        out += [run, piece[1:]]
    n = np.asarray([len(r) for r in runs], dtype=np.int64)
    offsets = at + np.concatenate([[0], np.cumsum(n - 1)[:-1]]).astype(np.int64)
    f = vision.processing.patch
    images = tuple(ImageInput(p, int(o), int(k), pixels_hash(p),
                              grid=(1, p.shape[1] // f, p.shape[2] // f))
                   for p, o, k in zip(prepared, offsets, n))  # fmt: skip
    return np.concatenate(out).tolist(), MultiModalInputs(images)


def expand(token_ids: Sequence[int], num_images: int, vision: PixtralVisionConfig) -> tuple:
    """RunsNeedImages: a run's length is its image's size, known only where the image is read."""
    raise RunsNeedImages("Pixtral's placeholder runs depend on each image's size: "
                     "they are counted where the images are read")  # fmt: skip


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: PixtralVisionConfig,
          step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless each image is float32 [3, H, W] of whole merged patches, its grid says
    so, and its run of `[IMG]` / `[IMG_BREAK]` / `[IMG_END]` tokens sits at its positions."""
    ids = np.asarray(token_ids, dtype=np.int64)
    f = vision.processing.patch
    for i, im in enumerate(mm.images):
        p = im.pixel_values
        ok = p.dtype == np.float32 and p.ndim == 3 and p.shape[0] == 3 and min(p.shape) > 0
        ok = ok and p.shape[1] % f == 0 and p.shape[2] % f == 0
        if not ok or im.grid != (1, p.shape[1] // f, p.shape[2] // f):
            raise ValueError(f"image {i}: pixels {p.dtype} {tuple(p.shape)} with grid {im.grid} "
                             f"are not float32 [3, H, W] of whole {f}-pixel patches")  # fmt: skip
        run = _run(p, vision)
        if im.length != len(run) or not np.array_equal(ids[im.offset : im.end], run):
            raise ValueError(f"image {i}: its placeholder tokens are not at prompt positions "
                             f"[{im.offset}, {im.end})")  # fmt: skip
