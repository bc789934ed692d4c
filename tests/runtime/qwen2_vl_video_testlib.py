"""Videos for the tiny Qwen2-VL family checkpoints (`qwen2_vl_testlib`): random uint8 frames,
a video encoded with PyAV, transformers' pixel values of a video, and its greedy tokens for
prompts holding images and videos. Imported by tests (not a conftest).

transformers' `Qwen2VLVideoProcessor` resizes with torchvision, which this project's CPU
environment lacks (its wheels are CUDA builds); the oracle here is `Qwen2VLImageProcessorPil`
run on each frame (PIL's resize, transformers' rescale, normalize and patch order), its two
copies of each frame in a patch replaced by the temporal patch's two frames."""

from __future__ import annotations

import numpy as np
import torch
from qwen2_vl_testlib import IMAGE_ID, PROCESSOR, VIDEO_ID

__all__ = ["VIDEO_ID", "decoded", "encode", "frames", "hf_generate_mm", "hf_video"]


def frames(seed: int, count: int, size: tuple[int, int]) -> np.ndarray:
    """`count` random RGB frames of `size` (height, width): uint8 [T, H, W, 3]."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, *size, 3), dtype=np.uint8)


def encode(video: np.ndarray, fmt: str = "mp4", codec: str = "mpeg4", rate: int = 10) -> bytes:
    """`video`'s frames encoded with PyAV (`fmt`: mp4 or webm; `codec`: mpeg4, libvpx, ...) at
    `rate` frames a second."""
    import io

    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.height, stream.width = video.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for f in video:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def decoded(data: bytes) -> np.ndarray:
    """Every frame of an encoded video, uint8 [T, H, W, 3] (PyAV)."""
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def hf_video(video: np.ndarray, processor=PROCESSOR) -> tuple[torch.Tensor, list[int]]:
    """(transformers' pixel_values_videos, video_grid_thw) of one video's frames."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    proc = Qwen2VLImageProcessorPil(**processor)
    per = [proc([Image.fromarray(f)], return_tensors="pt") for f in video]
    tp = proc.temporal_patch_size
    rows = [o["pixel_values"].reshape(o["pixel_values"].shape[0], 3, tp, -1)[:, :, 0] for o in per]
    rows += [rows[-1]] * (-len(rows) % tp)  # the last frame repeated to whole temporal patches
    _, h, w = per[0]["image_grid_thw"][0].tolist()
    pairs = [
        torch.stack(rows[i : i + tp], dim=2).reshape(h * w, -1) for i in range(0, len(rows), tp)
    ]
    return torch.cat(pairs), [len(pairs), h, w]


def hf_generate_mm(model, ids: list[int], images: list, videos: list, n: int,
                   seconds_per_grid: list[float] | None = None) -> list[int]:  # fmt: skip
    """transformers' greedy tokens after the expanded prompt `ids` holding `images` (PIL) and
    `videos` (uint8 frames; Qwen2.5-VL's `second_per_grid_ts`: `seconds_per_grid`).

    With `seconds_per_grid`, the model's forward on a cache, each token at its prompt's M-RoPE
    delta (the positions `get_rope_index` computes, as vLLM decodes): transformers' `generate`
    prefills with the spacing but decodes at the delta of an unspaced video."""
    t = torch.tensor([ids])
    kwargs = mm_kwargs(t, images, videos)
    if seconds_per_grid is None:
        with torch.no_grad():
            out = model.generate(input_ids=t, attention_mask=torch.ones_like(t),
                                 max_new_tokens=n, do_sample=False, **kwargs)  # fmt: skip
        return out[0, len(ids) :].tolist()
    from transformers import DynamicCache

    cache, model.model.rope_deltas = DynamicCache(config=model.config), None
    spacing = torch.tensor(seconds_per_grid)
    with torch.no_grad():
        logits = model(input_ids=t, second_per_grid_ts=spacing, cache=cache, use_cache=True,
                       **kwargs).logits  # fmt: skip
        out = [int(logits[0, -1].argmax())]
        delta = int(model.model.rope_deltas)
        for i in range(n - 1):
            pos = torch.full((3, 1, 1), len(ids) + i + delta)
            logits = model(input_ids=torch.tensor([out[-1:]]), position_ids=pos, cache=cache,
                           use_cache=True).logits  # fmt: skip
            out.append(int(logits[0, -1].argmax()))
    return out


def mm_kwargs(t: torch.Tensor, images: list, videos: list) -> dict:
    """transformers' multimodal inputs of the prompt `t` holding `images` and `videos`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    kwargs = {"mm_token_type_ids": (t == IMAGE_ID).int() + 2 * (t == VIDEO_ID).int()}
    if images:
        out = Qwen2VLImageProcessorPil(**PROCESSOR)(images, return_tensors="pt")
        kwargs |= {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    if videos:
        done = [hf_video(v) for v in videos]
        kwargs |= {"pixel_values_videos": torch.cat([p for p, _ in done]),
                   "video_grid_thw": torch.tensor([g for _, g in done])}  # fmt: skip
    return kwargs
