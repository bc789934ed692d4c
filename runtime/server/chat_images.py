"""A chat request's image and video parts → the engine's image inputs, in the API process
(torch-free): each part's image read (`multimodal.chat_images`: data URL or fetched; a video's
frames decoded and sampled by `multimodal.chat_videos`), preprocessed as the checkpoint's
processor does, and the rendered prompt's image tokens expanded to each image's
placeholder run (`multimodal.inputs.build`). Any failure is a 400 naming the part; the engine
never sees a request whose images could not be read."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.multimodal import chat_videos, inputs, processor_kwargs
from pagoda.runtime.multimodal.chat_images import ImageError, load
from pagoda.runtime.multimodal.chat_videos import VideoIO
from pagoda.runtime.multimodal.image_inputs import RunsNeedImages
from pagoda.runtime.server.protocol import APIError


def request_vision(vision: Any, kwargs: dict[str, Any] | None) -> Any:
    """The vision config a request's images are preprocessed with: its `mm_processor_kwargs`
    over the server's (`vision`, --mm-processor-kwargs applied); a 400 for a key the model's
    processor does not read (or a model without images), or a bad value."""
    try:
        return processor_kwargs.apply(vision, kwargs, "mm_processor_kwargs")
    except ValueError as e:
        raise APIError(400, str(e), param="mm_processor_kwargs", code="invalid_value") from None


def prompt_images(ids: list[int], parts: list[tuple[str, str, str]], vision: Any,
                  video_io: VideoIO | None = None) -> tuple[list[int], inputs.MultiModalInputs]:  # fmt: skip
    """(the prompt's ids with the images' and videos' placeholders, the images) of `parts`
    ((param, url, "image" or "video") each, in prompt order) over the rendered prompt's token
    ids `ids`; videos sampled by `video_io` (--media-io-kwargs)."""
    prepared = []
    for param, url, kind in parts:
        try:
            if kind == "video":
                prepared.append(inputs.prepare_video(chat_videos.load(url, video_io or VideoIO()),
                                                     vision))  # fmt: skip
            else:
                prepared.append(inputs.prepare_image(load(url), vision))
        except ImageError as e:
            raise APIError(400, f"{param}: {e}", param=f"{param}.{kind}_url",
                           code=e.code) from None  # fmt: skip
        except ValueError as e:  # (preprocessing: an image or video it cannot convert)
            raise APIError(400, f"{param}: {e}", param=f"{param}.{kind}_url",
                           code=f"invalid_{kind}") from None  # fmt: skip
    try:
        return inputs.build(ids, prepared, vision)
    except ValueError as e:
        raise _misrendered(e) from None


def reads_videos(vision: Any) -> bool:
    """Whether the model reads video parts (`inputs.reads_videos`)."""
    return inputs.reads_videos(vision)


def placeholders(ids: list[int], parts: list[tuple[str, str, str]], vision: Any) -> list[int]:
    """The prompt's ids with its images' placeholders (`/tokenize`): no image read where the
    family's runs are fixed; where they depend on each image (Qwen2-VL's, Qwen3-VL's,
    LLaVA-NeXT's, Idefics3's and InternVL's tiles: `RunsNeedImages`) the images of `parts` are
    read and preprocessed as chat's, so the ids are those chat feeds the engine; a video is a
    400 (its run depends on its frames)."""
    try:
        if any(kind == "video" for _, _, kind in parts):
            raise ValueError("a video's placeholder run depends on its frames: it is counted "
                             "where the video is read")  # fmt: skip
        try:
            return inputs.expand(ids, len(parts), vision)[0]
        except RunsNeedImages:
            return prompt_images(ids, parts, vision)[0]
    except ValueError as e:
        raise _misrendered(e) from None


def _misrendered(e: ValueError) -> APIError:
    """The 400 of a template that rendered another number of image tokens than images."""
    return APIError(400, f"the chat template rendered the images' placeholders wrongly: {e}",
                    param="messages", code="invalid_value")  # fmt: skip
