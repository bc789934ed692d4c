"""`pagoda serve` on a tiny LLaVA-NeXT and a tiny LLaVA-OneVision
(tests/runtime/llava_next_testlib.py) through the `openai` SDK: a chat with two base64 images
of other sizes renders as the chat template and the processor write it (each `<image>`
expanded to its own image's count) and answers transformers' greedy tokens; a text-only chat
after it too; `/tokenize` of messages with images answers the same ids (the images read: each run depends
on its image)."""

from __future__ import annotations

import base64

import pytest
from llava_next_testlib import (
    IMAGE_ID,
    expanded,
    hf_generate,
    make_tiny_llava_next,
    make_tiny_llava_onevision,
    picture,
)
from llava_testlib import TEMPLATE, png_bytes
from server_testlib import TINY_SERVE, check_image_chat, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5
IMAGES = [picture(0, (40, 52)), picture(1, (64, 30))]


def _id(token: str) -> int:
    return IMAGE_ID if token == "<image>" else int(token.removeprefix("w"))


def _url(im) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(im)).decode()


@pytest.mark.parametrize("make", [make_tiny_llava_next, make_tiny_llava_onevision])
def test_an_image_chat_answers_transformers_tokens(tmp_path, make):
    model, processor = make(tmp_path)
    parts = [{"type": "image_url", "image_url": {"url": _url(im)}} for im in IMAGES]
    parts.append({"type": "text", "text": "w7 w8"})
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                           {"type": "text", "text": "w7 w8"}]}]  # fmt: skip
    tok = processor.tokenizer
    text = tok.apply_chat_template(theirs, chat_template=TEMPLATE, tokenize=False,
                                  add_generation_prompt=True)  # fmt: skip
    ids = expanded(processor, tok(text)["input_ids"], IMAGES)
    want = hf_generate(model, processor, ids, IMAGES, NEW)
    with openai_client("--model", str(tmp_path), *TINY_SERVE) as client:
        check_image_chat(client, parts, ids, want, _id)
