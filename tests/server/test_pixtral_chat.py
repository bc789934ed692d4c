"""`pagoda serve` on a tiny Mistral 3 (tests/runtime/pixtral_testlib.py) through the `openai`
SDK: a chat with a base64 image part renders `[IMG]`, expanded to the image's rows of `[IMG]`
with `[IMG_BREAK]` / `[IMG_END]`, and answers transformers' greedy tokens; a text-only chat after
it too; `/tokenize` of messages with an image reads it (the run depends on the image)."""

from __future__ import annotations

import base64
import io

import pytest
from pixtral_testlib import BREAK, END, IMAGE_ID, MARKS, hf_generate, image, make_tiny_pixtral
from server_testlib import TINY_SERVE, check_image_chat, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5


def _id(token: str) -> int:
    return MARKS.get(token) or int(token.removeprefix("w"))


def test_an_image_chat_answers_transformers_tokens(tmp_path):
    model = make_tiny_pixtral(tmp_path, "mistral3")
    im = image(0, (50, 70))  # 48 x 64 px: 3 rows of 4 merged patches
    out = io.BytesIO()
    im.save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    run = ([IMAGE_ID] * 4 + [BREAK]) * 3
    run[-1] = END
    ids = [3, 7, *run, 8, 5]  # w3 w7 [IMG] w8 w5, the image's run expanded
    want = hf_generate(model, "mistral3", ids, [im], NEW)
    parts = [{"type": "text", "text": "w7"}, {"type": "image_url", "image_url": {"url": url}},
             {"type": "text", "text": "w8"}]  # fmt: skip
    with openai_client("--model", str(tmp_path), *TINY_SERVE) as client:
        check_image_chat(client, parts, ids, want, _id)
