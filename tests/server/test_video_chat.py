"""`pagoda serve` on a tiny Qwen2-VL (tests/runtime/qwen2_vl_testlib.py) reading chat
`video_url` parts through the `openai` SDK: an mp4 (and a webm beside an image) encoded here
with PyAV, sent as base64 data URLs, decoded by the server (`multimodal/chat_videos.py`) and
sampled to `--media-io-kwargs`' 4 frames; the video's `<|video_pad|>` expanded to its run and
the answer transformers' greedy tokens of those frames (decoded here). A corrupt video, a video
over `--limit-mm-per-prompt`'s count and `/tokenize` of a video are 400s."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from qwen2_vl_testlib import END, IMAGE_ID, START, image, make_tiny_qwen2_vl
from qwen2_vl_video_testlib import VIDEO_ID, decoded, encode, frames, hf_generate_mm
from server_testlib import TINY_SERVE, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5
SPECIAL = {"<|image_pad|>": IMAGE_ID, "<|vision_start|>": START, "<|vision_end|>": END,
           "<|video_pad|>": VIDEO_ID}  # fmt: skip
FLAGS = ("--media-io-kwargs", '{"video": {"num_frames": 4}}',
         "--limit-mm-per-prompt", '{"image": 2, "video": 1}')  # fmt: skip


def _id(token: str) -> int:
    return SPECIAL.get(token) or int(token.removeprefix("w"))


def _url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _ask(client, parts: list[dict]):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": parts}],
        max_tokens=NEW, temperature=0, logprobs=True, extra_body={"ignore_eos": True},
    )  # fmt: skip


def _post(client, path: str, parts: list[dict]) -> httpx.Response:
    body = {"model": client.models.list().data[0].id, "max_tokens": 1,
            "messages": [{"role": "user", "content": parts}]}  # fmt: skip
    return httpx.post(str(client.base_url).removesuffix("v1/") + path, json=body, timeout=30)


def test_video_chats_answer_transformers_tokens(tmp_path):
    model = make_tiny_qwen2_vl(tmp_path)
    mp4 = encode(frames(0, 10, (32, 48)), "mp4", "mpeg4")  # 10 frames: 0, 3, 6 and 9 kept
    webm = encode(frames(1, 6, (16, 40)), "webm", "libvpx")  # 6 frames: 0, 1, 3 and 5
    im = image(2, (40, 56))
    seen_mp4, seen_webm = decoded(mp4)[[0, 3, 6, 9]], decoded(webm)[[0, 1, 3, 5]]
    video = {"type": "video_url", "video_url": {"url": _url(mp4, "video/mp4")}}
    # w3 <|vision_start|> <|video_pad|> x 12 (2 temporal patches of 32 x 48 px: 2 x 3 merged)
    # <|vision_end|> w7 w8 w5
    ids = [3, START] + [VIDEO_ID] * 12 + [END, 7, 8, 5]
    want = hf_generate_mm(model, ids, [], [seen_mp4], NEW)
    # the webm (16 x 40 px at 16 x 32: 1 x 2 merged, 2 temporal patches) and an image (40 x 56
    # px at 32 x 64: 2 x 4 merged)
    mixed = [{"type": "video_url", "video_url": {"url": _url(webm, "video/webm")}},
             {"type": "image_url", "image_url": {"url": _url(_png(im), "image/png")}},
             {"type": "text", "text": "w7 w8"}]  # fmt: skip
    mixed_ids = [3, START] + [VIDEO_ID] * 4 + [END, START] + [IMAGE_ID] * 8 + [END, 7, 8, 5]
    mixed_want = hf_generate_mm(model, mixed_ids, [im], [seen_webm], NEW)
    with openai_client("--model", str(tmp_path), *TINY_SERVE, *FLAGS) as client:
        got = _ask(client, [video, {"type": "text", "text": "w7 w8"}])
        assert got.usage.prompt_tokens == len(ids)
        assert [_id(t.token) for t in got.choices[0].logprobs.content] == want
        got = _ask(client, mixed)
        assert got.usage.prompt_tokens == len(mixed_ids)
        assert [_id(t.token) for t in got.choices[0].logprobs.content] == mixed_want
        corrupt = {"type": "video_url", "video_url": {"url": _url(mp4[: len(mp4) // 3][::-1], "video/mp4")}}  # fmt: skip
        bad = _post(client, "v1/chat/completions", [corrupt])
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_video", bad.text
        assert bad.json()["error"]["param"] == "messages[0].content[0].video_url"
        two = _post(client, "v1/chat/completions", [video, video])
        assert two.status_code == 400 and two.json()["error"]["code"] == "too_many_videos"
        assert _post(client, "tokenize", [video]).status_code == 400


def _png(im) -> bytes:
    import io

    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def test_the_sampled_frames_are_vllms():
    """(a plain check of the sampling the server test relies on)"""
    from pagoda.runtime.multimodal.chat_videos import VideoIO, sample

    assert sample(10, 10.0, VideoIO(num_frames=4)).tolist() == [0, 3, 6, 9]
    assert sample(6, 10.0, VideoIO(num_frames=4)).tolist() == [0, 1, 3, 5]
    assert np.array_equal(sample(3, 10.0, VideoIO(num_frames=4)), np.arange(3))
