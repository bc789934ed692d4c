"""Qwen2-VL's and Qwen2.5-VL's video side on the host (PIL + NumPy, no torch: the API process
runs it too): `Qwen2VLVideoProcessor`'s patches and grid of a video's frames.

- `frames_of`: vLLM's forms of a video (a NumPy uint8 array [T, H, W, 3], a list of PIL
  images, or either with its metadata as `(frames, {"fps": ...})`) → uint8 [T, H, W, 3] and the
  frames' rate (`DEFAULT_FPS` where none is given).
- `preprocess_video`: every frame resized to one size (`smart_resize` of the first frame's
  size, PIL's filter on each uint8 frame), rescaled and normalized, the frames padded to a
  multiple of `temporal_patch_size` with copies of the last, then `patchify`'s layout with the
  frames of each temporal patch side by side: float32 [t * h * w, 3 * T * P * P], grid (t, h, w).
- `Video`: a prepared video (its patches, grid and seconds per temporal patch: Qwen2.5-VL's
  M-RoPE spaces a video's temporal positions by `tokens_per_second` x those seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagoda.runtime.multimodal.image_processing import MAX_IMAGE_PIXELS, rescale_normalize
from pagoda.runtime.multimodal.qwen2_vl_processing import QwenImageProcessing, smart_resize
from PIL import Image

DEFAULT_FPS = 2.0  # a video's frame rate where none is given (qwen-vl-utils' and vLLM's)
MAX_FRAMES = 768  # Qwen2VLVideoProcessor's max_frames


@dataclass(frozen=True, eq=False)
class Video:
    """A prepared video: float32 patches [t * h * w, patch_dim], its grid (t, h, w) and the
    seconds one temporal patch spans (temporal_patch_size / fps)."""

    patches: np.ndarray
    grid: tuple[int, int, int]
    seconds_per_grid: float


def frames_of(video: object) -> tuple[np.ndarray, float]:
    """(uint8 frames [T, H, W, 3], frames per second) of a video in one of vLLM's forms;
    ValueError, one line, for anything else."""
    fps = DEFAULT_FPS
    if isinstance(video, tuple) and len(video) == 2 and isinstance(video[1], dict):
        video, meta = video
        fps = meta.get("fps", DEFAULT_FPS)
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
            raise ValueError(f"a video's metadata fps must be a positive number, got {fps!r}")
    if isinstance(video, (list, tuple)):
        if not video or not all(isinstance(f, Image.Image) for f in video):
            raise ValueError("a video as a list must be a non-empty list of PIL images")
        sizes = {f.size for f in video}
        if len(sizes) != 1:
            raise ValueError(f"a video's frames must share one size, got {sorted(sizes)}")
        video = np.stack([np.asarray(f.convert("RGB")) for f in video])
    if not isinstance(video, np.ndarray) or video.ndim != 4 or video.shape[-1] != 3:
        shape = getattr(video, "shape", type(video).__name__)
        raise ValueError(f"a video must be a uint8 array [frames, height, width, 3] or a list of "
                         f"PIL images, got {shape}")  # fmt: skip
    if video.dtype != np.uint8:
        raise ValueError(f"a video's frames must be uint8, got {video.dtype}")
    t, h, w, _ = video.shape
    if not 0 < t <= MAX_FRAMES or h * w == 0 or h * w > MAX_IMAGE_PIXELS:
        raise ValueError(f"a video must have 1 to {MAX_FRAMES} frames of at most "
                         f"{MAX_IMAGE_PIXELS} pixels, got {t} of {w}x{h}")  # fmt: skip
    return video, float(fps)


def preprocess_video(video: object, p: QwenImageProcessing) -> Video:
    """A video (`frames_of`'s forms) → its patches and grid, as `Qwen2VLVideoProcessor`
    computes them (`p`: the video processor's fields)."""
    frames, fps = frames_of(video)
    t, height, width, _ = frames.shape
    if p.do_resize:
        h, w = smart_resize(height, width, p.factor, p.min_pixels, p.max_pixels)
        if (h, w) != (height, width):
            frames = np.stack([np.asarray(Image.fromarray(f).resize((w, h), resample=p.resample))
                               for f in frames])  # fmt: skip
    elif height % p.factor or width % p.factor:
        raise ValueError(f"a video of {width}x{height} pixels is not a multiple of {p.factor} "
                         f"(do_resize is off)")  # fmt: skip
    pixels = rescale_normalize(np.moveaxis(frames, -1, 1), p)  # [t, 3, h, w]
    if pad := -t % p.temporal_patch_size:
        pixels = np.concatenate([pixels, np.repeat(pixels[-1:], pad, axis=0)])
    return Video(patchify_frames(pixels, p), _grid(pixels, p), p.temporal_patch_size / fps)


def _grid(pixels: np.ndarray, p: QwenImageProcessing) -> tuple[int, int, int]:
    frames, _, height, width = pixels.shape
    return frames // p.temporal_patch_size, height // p.patch_size, width // p.patch_size


def patchify_frames(pixels: np.ndarray, p: QwenImageProcessing) -> np.ndarray:
    """float32 frames [F, 3, H, W] (F a multiple of T) → [t * h * w, 3 * T * P * P]: temporal
    patches in order, each one's merge windows in row order, the patches of a window in row
    order, each patch (channel, frame, row, column)."""
    f, c, height, width = pixels.shape
    ps, m, tp = p.patch_size, p.merge_size, p.temporal_patch_size
    gt, gh, gw = f // tp, height // ps, width // ps
    x = pixels.reshape(gt, tp, c, gh // m, m, ps, gw // m, m, ps)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * ps * ps), dtype=np.float32)
