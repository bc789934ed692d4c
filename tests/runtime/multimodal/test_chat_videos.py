"""A chat video part's decode (`multimodal/chat_videos.py`): an mp4 and a webm encoded here
with PyAV decode to the frames PyAV reads, sampled as vLLM samples them (`--media-io-kwargs`'
num_frames and fps), at the rate of the frames kept; corrupt bytes, data that holds no video
and a video over the byte or frame cap are `ImageError`s (the server's 400s); the flag's JSON is
checked."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from pagoda.runtime.multimodal import chat_videos
from pagoda.runtime.multimodal.chat_images import ImageError
from pagoda.runtime.multimodal.chat_videos import VideoIO, decode, load, sample
from qwen2_vl_video_testlib import decoded, encode, frames

pytest.importorskip("av")
VIDEO = frames(0, 10, (32, 48))


@pytest.mark.parametrize("fmt, codec", [("mp4", "mpeg4"), ("webm", "libvpx")])
def test_a_video_decodes_to_its_sampled_frames(fmt, codec):
    data = encode(VIDEO, fmt, codec, rate=10)
    every = decoded(data)
    got, rate = decode(data, VideoIO(num_frames=4))
    assert np.array_equal(got, every[[0, 3, 6, 9]]) and rate == 4.0  # 4 of 10 frames a second
    got, rate = decode(data, VideoIO(num_frames=-1, fps=5))  # 1 s of video at 5 a second
    assert np.array_equal(got, every[sample(10, 10.0, VideoIO(num_frames=-1, fps=5))])
    assert len(got) == 5 and rate == 5.0
    url = f"data:video/{fmt};base64," + base64.b64encode(data).decode()
    frames_, meta = load(url, VideoIO(num_frames=2))
    assert np.array_equal(frames_, every[[0, 9]]) and meta == {"fps": 2.0}


def test_sampling_is_vllms():
    assert sample(10, 10.0, VideoIO()).tolist() == list(range(10))  # 32 asked: every frame
    assert sample(100, 25.0, VideoIO(num_frames=5)).tolist() == [0, 24, 49, 74, 99]
    assert sample(100, 25.0, VideoIO(num_frames=-1, fps=1)).tolist() == [0, 33, 66, 99]
    assert sample(3, 30.0, VideoIO(fps=1)).tolist() == [0]  # at least one frame


def test_what_is_not_a_video_is_an_image_error(monkeypatch):
    data = encode(VIDEO[:4])
    for bad in (data[: len(data) // 3][::-1], b"not a video", bytes(len(data))):
        with pytest.raises(ImageError, match=r"could not be decoded|no video stream") as e:
            decode(bad, VideoIO())
        assert e.value.code == "invalid_video"
    monkeypatch.setattr(chat_videos, "MAX_VIDEO_BYTES", len(data) - 1)
    with pytest.raises(ImageError, match="larger than") as e:
        load("data:video/mp4;base64," + base64.b64encode(data).decode(), VideoIO())
    assert e.value.code == "video_too_large"
    monkeypatch.setattr(chat_videos, "MAX_DECODED_FRAMES", 3)
    with pytest.raises(ImageError, match="more than 3 frames"):
        decode(data, VideoIO())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"audio": {}}, "takes {'video'"),
        ({"video": {"frames": 4}}, "takes num_frames and fps"),
        ({"video": {"num_frames": 0}}, "integer >= 1 or -1"),
        ({"video": {"fps": -2}}, "number > 0 or -1"),
    ],
)
def test_bad_media_io_kwargs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VideoIO.parse(kwargs)
    assert VideoIO.parse({"video": {"num_frames": 8, "fps": 2}}) == VideoIO(8, 2)
