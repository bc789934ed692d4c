"""A prompt's images as the engine receives them (plain data, pickled to the engine process):
each image's pixels, where its placeholder tokens sit in the prompt, and a content hash.

`build` turns a prompt's token ids with one image token per image into the ids the model
reads (each image token repeated as many times as the image has feature rows, as transformers'
`LlavaProcessor` expands `<image>`), preprocessing the images on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pagoda.runtime.multimodal import qwen2_vl_inputs
from pagoda.runtime.multimodal.config import VisionConfig
from pagoda.runtime.multimodal.image_inputs import ImageInput, MultiModalInputs, pixels_hash
from pagoda.runtime.multimodal.image_processing import preprocess

__all__ = ["ImageInput", "MultiModalInputs", "pixels_hash"]


def whole_images(mm: MultiModalInputs | None, start: int, n: int, budget: int) -> int:
    """The tokens of a prefill chunk of `n` from prompt position `start` that split no
    bidirectional image: a chunk that would end inside an image ends before it, or, starting
    at or inside it, takes the rest of it where `budget` holds that (else 0: not this step)."""
    if mm is None or not mm.bidirectional:
        return n
    end = start + n
    for im in mm.images:
        if im.offset < end < im.end:
            if im.offset > start:
                return im.offset - start
            return im.end - start if im.end - start <= budget else 0
    return n


def image_list(data: object) -> list:
    """`multi_modal_data["image"]`: one image or a list of them."""
    return list(data) if isinstance(data, (list, tuple)) else [data]


def expand(
    token_ids: Sequence[int], num_images: int, vision: VisionConfig
) -> tuple[list[int], list[int]]:
    """The prompt with each image's marker (LLaVA's: the image token) replaced by its run of
    image tokens (with Gemma 3's text around it: `marked`), and each run's first position;
    ValueError where the prompt holds another number of markers."""
    if _qwen(vision) is not None:
        raise ValueError("Qwen2-VL's placeholder runs depend on each image's size: "
                         "they are counted where the images are read")  # fmt: skip
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


def _qwen(vision: object):
    """Qwen2-VL's inputs module where `vision` is its config (else None)."""
    return qwen2_vl_inputs if getattr(vision, "kind", None) in ("qwen2_vl", "qwen2_5_vl") else None


def prepare_image(image: object, vision: VisionConfig) -> object:
    """One image as the checkpoint's processor prepares it (what `build` takes)."""
    q = _qwen(vision)
    return preprocess(image, vision.processing) if q is None else q.prepare_image(image, vision)


def build(
    token_ids: Sequence[int], pixels: Sequence[np.ndarray], vision: VisionConfig
) -> tuple[list[int], MultiModalInputs]:
    """The prompt `expand`ed, and the images placed at their runs."""
    if (q := _qwen(vision)) is not None:
        return q.build(token_ids, pixels, vision)
    ids, offsets = expand(token_ids, len(pixels), vision)
    n = vision.tokens_per_image
    images = tuple(ImageInput(p, o, n, pixels_hash(p)) for p, o in zip(pixels, offsets))
    return ids, MultiModalInputs(images, bidirectional=vision.bidirectional)


def from_images(
    token_ids: Sequence[int], images: Sequence[object], vision: VisionConfig
) -> tuple[list[int], MultiModalInputs]:
    """`build` over PIL images, each preprocessed as the checkpoint's processor does."""
    return build(token_ids, [prepare_image(im, vision) for im in images], vision)


def from_data(
    token_ids: Sequence[int], data: object, vision: VisionConfig | None
) -> tuple[list[int], MultiModalInputs]:
    """vLLM's `multi_modal_data` ({"image": a PIL image or a list of them}) over a prompt's
    token ids; ValueError for a model without images, another modality, or a bad image."""
    if vision is None:
        raise ValueError("this model does not read images: multi_modal_data is not supported")
    if not isinstance(data, dict) or set(data) - {"image"}:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"multi_modal_data must be {{'image': image or list of images}}; got "
                         f"{keys} (only images are supported)")  # fmt: skip
    return from_images(token_ids, image_list(data.get("image", [])), vision)


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision: VisionConfig | None,
          limit: int, step_tokens: int | None = None) -> None:  # fmt: skip
    """ValueError unless `mm` fits the model and the prompt: a model that reads images, at most
    `limit` of them, each of the tower's shape over a run of image tokens in the prompt."""
    if vision is None:
        raise ValueError("this model does not read images (multi_modal_data / image parts)")
    if not isinstance(mm, MultiModalInputs):
        raise ValueError("multi_modal must be a MultiModalInputs")
    if len(mm.images) > limit:
        raise ValueError(f"at most {limit} image(s) per prompt (--limit-mm-per-prompt), got "
                         f"{len(mm.images)}")  # fmt: skip
    if (q := _qwen(vision)) is not None:
        return q.check(token_ids, mm, vision)
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
