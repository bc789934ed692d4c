"""`pagoda serve` on a tiny Qwen2-VL (tests/runtime/qwen2_vl_testlib.py) through the `openai`
SDK: a chat with a base64 image renders `<|vision_start|><|image_pad|><|vision_end|>`, the pad
expanded to the image's own run, and answers transformers' greedy tokens; a text-only chat
after it too; `/tokenize` of messages with an image is a 400 (the run depends on the image)."""

from __future__ import annotations

import base64

import pytest
from qwen2_vl_testlib import END, IMAGE_ID, START, hf_generate, make_tiny_qwen2_vl
from server_testlib import check_image_chat

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5
SPECIAL = {"<|image_pad|>": IMAGE_ID, "<|vision_start|>": START, "<|vision_end|>": END}


def _id(token: str) -> int:
    return SPECIAL.get(token) or int(token.removeprefix("w"))


def _image():
    import io

    import numpy as np
    from PIL import Image

    im = Image.fromarray(np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8))
    out = io.BytesIO()
    im.save(out, format="PNG")
    return im, "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_an_image_chat_answers_transformers_tokens(tmp_path):
    model = make_tiny_qwen2_vl(tmp_path)
    im, url = _image()
    # w3 <|vision_start|> <|image_pad|> x 24 (64 x 96 px: 4 x 6 merged) <|vision_end|> w7 w8 w5
    ids = [3, START] + [IMAGE_ID] * 24 + [END, 7, 8, 5]
    want = hf_generate(model, ids, [im], NEW)
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w7 w8"}]
    check_image_chat(tmp_path, parts, ids, want, _id)
