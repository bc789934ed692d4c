"""The videos of chat content parts (`{"type": "video_url", "video_url": {"url": ...}}`) read
into frames in the API process (torch-free): `data:` URLs (base64) or http(s) URLs fetched as
image parts are (`chat_images.read_url`, a cap of `MAX_VIDEO_BYTES`), decoded with PyAV
(FFmpeg: mp4, webm, ...), and frames sampled as vLLM's video loader samples them:

- `VideoIO`: vLLM's `--media-io-kwargs '{"video": {"num_frames": N, "fps": F}}'`: at most
  `num_frames` frames (default 32; -1: every frame), and at most `fps` a second of video
  where given; the fewer of the two.
- `sample`: the frames kept: all of them where as many are asked, else `num` indices spread
  evenly over [0, total - 1] (NumPy's linspace, truncated).
- `load`: a video's frames, uint8 [T, H, W, 3], and the rate they sample it at (frames kept
  per second of video: Qwen2.5-VL's temporal positions read it).

Whatever fails (undecodable bytes, no video stream, too many frames or pixels) is a
`chat_images.ImageError` (code `invalid_video` or `video_too_large`): the server answers a 400
naming the part.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.chat_images import ImageError, read_url
from pagoda.runtime.multimodal.image_processing import MAX_IMAGE_PIXELS

MAX_VIDEO_BYTES = 64 << 20  # one video's encoded bytes
MAX_DECODED_FRAMES = 36_000  # frames a video may hold (20 minutes at 30 fps): decoding is paid
DEFAULT_NUM_FRAMES = 32  # vLLM's default frames per video


@dataclass(frozen=True)
class VideoIO:
    """How a video is sampled: at most `num_frames` frames (-1: all) and `fps` a second (-1:
    no rate cap)."""

    num_frames: int = DEFAULT_NUM_FRAMES
    fps: float = -1.0

    def __post_init__(self) -> None:
        n, f = self.num_frames, self.fps
        if isinstance(n, bool) or not isinstance(n, int) or not (n == -1 or n >= 1):
            raise ValueError(f"media_io_kwargs' video num_frames must be an integer >= 1 or -1, "
                             f"got {n!r}")  # fmt: skip
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (f == -1 or f > 0):
            raise ValueError(f"media_io_kwargs' video fps must be a number > 0 or -1, got {f!r}")

    @classmethod
    def parse(cls, kwargs: Any) -> VideoIO:
        """vLLM's `--media-io-kwargs` (a dict, e.g. {"video": {"num_frames": 16}}; None: the
        defaults); ValueError, one line, for another modality or key."""
        if kwargs is None:
            return cls()
        if not isinstance(kwargs, dict) or set(kwargs) - {"video"}:
            raise ValueError(f"media_io_kwargs takes {{'video': {{'num_frames': N, 'fps': F}}}}, "
                             f"got {kwargs!r}")  # fmt: skip
        video = kwargs.get("video") or {}
        if not isinstance(video, dict) or set(video) - {"num_frames", "fps"}:
            raise ValueError(f"media_io_kwargs' video takes num_frames and fps, got {video!r}")
        return cls(**video)


def sample(total: int, fps: float, io_: VideoIO) -> np.ndarray:
    """The indices of the frames kept of `total` at `fps` frames a second (vLLM's)."""
    n = total
    if io_.num_frames > 0:
        n = min(n, io_.num_frames)
    if io_.fps > 0 and fps > 0:
        n = min(n, int(total / fps * io_.fps))
    n = max(1, n)
    if n == total:
        return np.arange(total)
    return np.linspace(0, total - 1, n, dtype=int)


def decode(data: bytes, io_: VideoIO) -> tuple[np.ndarray, float]:
    """(uint8 frames [T, H, W, 3] sampled by `io_`, frames kept per second of video; 0: the
    container states no rate). Two passes: the frames counted, then the kept ones converted
    (a video's decoded frames are never all held)."""
    import av

    try:
        total, rate = _count(av, data)
        keep = sample(total, rate, io_)
        wanted, out = set(keep.tolist()), []
        with av.open(io.BytesIO(data), mode="r") as container:
            for i, frame in enumerate(container.decode(container.streams.video[0])):
                if i in wanted:
                    out.append(frame.to_ndarray(format="rgb24"))
    except ImageError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, IndexError) as e:
        raise ImageError(f"the video could not be decoded ({type(e).__name__})",
                         "invalid_video") from None  # fmt: skip
    if len(out) != len(keep):
        raise ImageError("the video decoded to another number of frames twice", "invalid_video")
    return np.stack(out), rate * len(keep) / total


def _count(av: Any, data: bytes) -> tuple[int, float]:
    """(the video stream's decodable frames, its frame rate; 0 where unstated); ImageError for
    none, too many, or frames over `MAX_IMAGE_PIXELS`."""
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.video:
            raise ImageError("the data holds no video stream", "invalid_video")
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate or 0)
        total = 0
        for frame in container.decode(stream):
            if frame.width * frame.height > MAX_IMAGE_PIXELS:
                raise ImageError(f"the video's frames have {frame.width}x{frame.height} pixels, "
                                 f"more than {MAX_IMAGE_PIXELS}", "video_too_large")  # fmt: skip
            total += 1
            if total > MAX_DECODED_FRAMES:
                raise ImageError(f"the video has more than {MAX_DECODED_FRAMES} frames",
                                 "video_too_large")  # fmt: skip
    if total == 0:
        raise ImageError("the video holds no decodable frame", "invalid_video")
    return total, rate


def load(url: str, io_: VideoIO) -> object:
    """The video a `video_url` part names, sampled by `io_`: its frames, with their rate as
    vLLM's metadata where the container states one (`qwen2_vl_video.frames_of`'s forms)."""
    frames, rate = decode(read_url(url, MAX_VIDEO_BYTES, what="video"), io_)
    return (frames, {"fps": rate}) if rate > 0 else frames
