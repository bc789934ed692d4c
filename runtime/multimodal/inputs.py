"""A prompt's images as the engine receives them (plain data, pickled to the engine process):
each image's pixels, where its placeholder tokens sit in the prompt, and a content hash.

Each family's image input is one module of `FAMILIES` (keyed by its vision config's `kind`),
with the same four functions: `prepare_image` (one image as the checkpoint's processor prepares
it), `expand` (the prompt's image tokens replaced by each image's run of placeholders, no image
read: `/tokenize`), `build` (the prompt expanded and the prepared images placed at their runs)
and `check` (the engine's: the images fit the model and sit over their runs); `max_run` (the
most placeholders one image takes: the encoder cache's size); and `PROCESSOR_KWARGS`, the processor settings `--mm-processor-kwargs` may set (with
`with_processor_kwargs` where there are any: `processor_kwargs.py`). The functions here add
what every family shares: the per-prompt image limit, `multi_modal_data`'s shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType, ModuleType

from pagoda.runtime.multimodal import (
    fixed_inputs,
    idefics3_inputs,
    internvl_inputs,
    llama4_inputs,
    llava_next_inputs,
    pixtral_inputs,
    qwen2_vl_inputs,
)
from pagoda.runtime.multimodal.image_inputs import ImageInput, MultiModalInputs, pixels_hash
from PIL import Image

__all__ = ["FAMILIES", "ImageInput", "MultiModalInputs", "pixels_hash"]

# a vision config's `kind` -> its family's image-input module
FAMILIES: Mapping[str, ModuleType] = MappingProxyType(
    {
        "llava": fixed_inputs,  # LLaVA 1.5: one CLIP crop, a fixed run
        "gemma3": fixed_inputs,  # Gemma 3: its marker's text around a fixed run
        "qwen2_vl": qwen2_vl_inputs,  # Qwen2-VL / 2.5-VL: a run per image's size, M-RoPE
        "qwen2_5_vl": qwen2_vl_inputs,
        "qwen3_vl": qwen2_vl_inputs,  # Qwen3-VL (-MoE): Qwen2-VL's runs and M-RoPE positions
        "idefics3": idefics3_inputs,  # Idefics3 / SmolVLM: tiles and a global image, each a run
        "llava_next": llava_next_inputs,  # LLaVA-NeXT: anyres crops, a run per image's size
        "llava_onevision": llava_next_inputs,  # LLaVA-OneVision: the same, its grid capped
        "pixtral": pixtral_inputs,  # Mistral 3, LLaVA-Pixtral: a run per image's size, row breaks
        "internvl": internvl_inputs,  # InternVL 3 / 3.5: tiles and a thumbnail, one run
        "llama4": llama4_inputs,  # Llama 4: tiles and a global tile, each a run of <|patch|>
    }
)


def family(vision: object) -> ModuleType:
    """The image-input module of `vision` (a family's vision config)."""
    return FAMILIES[vision.kind]  # type: ignore[attr-defined]


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


def max_run(vision) -> int:
    """The most placeholder tokens (feature rows) one image of `vision`'s family takes."""
    return family(vision).max_run(vision)


def image_list(data: object) -> list:
    """`multi_modal_data["image"]`: one image or a list of them."""
    return list(data) if isinstance(data, (list, tuple)) else [data]


def expand(token_ids: Sequence[int], num_images: int, vision) -> tuple[list[int], list[int]]:
    """The prompt with each image token replaced by its run (no image read), and each run's
    first position; ValueError where the family's runs depend on the images themselves."""
    return family(vision).expand(token_ids, num_images, vision)


def prepare_image(image: object, vision) -> object:
    """One image as the checkpoint's processor prepares it (what `build` takes)."""
    return family(vision).prepare_image(image, vision)


def build(token_ids: Sequence[int], prepared: Sequence[object],
          vision) -> tuple[list[int], MultiModalInputs]:  # fmt: skip
    """The prompt expanded, and the prepared images placed at their runs."""
    return family(vision).build(token_ids, prepared, vision)


def from_images(
    token_ids: Sequence[int], images: Sequence[object], vision
) -> tuple[list[int], MultiModalInputs]:
    """`build` over PIL images, each preprocessed as the checkpoint's processor does."""
    return build(token_ids, [prepare_image(im, vision) for im in images], vision)


def reads_videos(vision) -> bool:
    """Whether `vision`'s family reads videos (its module's `reads_videos`; none: no)."""
    reads = getattr(family(vision), "reads_videos", None)
    return reads is not None and reads(vision)


def prepare_video(video: object, vision) -> object:
    """One video as the checkpoint's video processor prepares it (what `build` takes);
    ValueError for a family that reads no videos (one without `prepare_video`)."""
    if not reads_videos(vision):
        raise ValueError(f"this model ({vision.kind}) reads no videos: multi_modal_data's "
                         "'video' is refused")  # fmt: skip
    return family(vision).prepare_video(video, vision)


def from_data(token_ids: Sequence[int], data: object, vision) -> tuple[list[int], MultiModalInputs]:
    """vLLM's `multi_modal_data` ({"image": a PIL image or a list of them, "video": a video
    or a list of them}) over a prompt's token ids; ValueError for a model without images,
    another modality, or a bad image or video."""
    if vision is None:
        raise ValueError("this model does not read images: multi_modal_data is not supported")
    if not isinstance(data, dict) or set(data) - {"image", "video"}:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"multi_modal_data must be {{'image': image or list of images, "
                         f"'video': video or list of videos}}; got {keys}")  # fmt: skip
    images = [prepare_image(im, vision) for im in image_list(data.get("image", []))]
    videos = [prepare_video(v, vision) for v in video_list(data.get("video", []))]
    return build(token_ids, images + videos, vision)


def video_list(data: object) -> list:
    """`multi_modal_data["video"]`: one video (an array, a list of PIL images, or either with
    its metadata as a tuple) or a list of them."""
    if isinstance(data, list) and data and not isinstance(data[0], Image.Image):
        return data
    return [] if isinstance(data, list) and not data else [data]


def check(token_ids: Sequence[int], mm: MultiModalInputs, vision, limit: int,
          step_tokens: int | None = None, video_limit: int = 0) -> None:  # fmt: skip
    """ValueError unless `mm` fits the model and the prompt: a model that reads images, at most
    `limit` of them and `video_limit` videos, each of the tower's shape over a run of image
    (video) tokens in the prompt."""
    if vision is None:
        raise ValueError("this model does not read images (multi_modal_data / image parts)")
    if not isinstance(mm, MultiModalInputs):
        raise ValueError("multi_modal must be a MultiModalInputs")
    if mm.num_images > limit:
        raise ValueError(f"at most {limit} image(s) per prompt (--limit-mm-per-prompt), got "
                         f"{mm.num_images}")  # fmt: skip
    if mm.num_videos > video_limit:
        raise ValueError(f"at most {video_limit} video(s) per prompt (--limit-mm-per-prompt), "
                         f"got {mm.num_videos}")  # fmt: skip
    family(vision).check(token_ids, mm, vision, step_tokens)
