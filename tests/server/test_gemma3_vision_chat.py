"""`pagoda serve` on a tiny Gemma 3 with images (tests/runtime/gemma3_vision_testlib.py)
through the `openai` SDK: a chat with a base64 image renders as transformers' Gemma3Processor
renders it (`<start_of_image>` expanded, its newlines merged with the template's) and answers
transformers' greedy tokens (the image's tokens attending both ways); a second image past
--limit-mm-per-prompt is a 400 and the server answers the next request."""

from __future__ import annotations

import base64

import openai
import pytest
from gemma3_vision_testlib import hf_generate, make_tiny_gemma3
from llava_testlib import image, png_bytes
from server_testlib import TINY_SERVE, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5
IMAGE = image(0)
DATA_URL = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()


def _chat(client, content: list[dict]):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": content}],
        max_tokens=NEW, temperature=0, logprobs=True, extra_body={"ignore_eos": True},
    )  # fmt: skip


def test_image_chat_answers_transformers_tokens(tmp_path):
    model, processor = make_tiny_gemma3(tmp_path)
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w7 w8"}]}]
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    ids = list(processor(text=text, images=[IMAGE])["input_ids"][0])
    want = processor.tokenizer.convert_ids_to_tokens(hf_generate(model, processor, ids, [IMAGE],
                                                                 NEW))  # fmt: skip
    part = {"type": "image_url", "image_url": {"url": DATA_URL}}
    words = {"type": "text", "text": "w7 w8"}
    limit = ("--limit-mm-per-prompt", '{"image": 1}')
    with openai_client("--model", str(tmp_path), *TINY_SERVE, *limit) as client:
        got = _chat(client, [part, words])
        assert got.usage.prompt_tokens == len(ids)
        assert [t.token for t in got.choices[0].logprobs.content] == want
        with pytest.raises(openai.BadRequestError) as e:
            _chat(client, [part, part, words])
        assert "at most 1 image" in e.value.body["message"]
        again = _chat(client, [part, words])
        assert [t.token for t in again.choices[0].logprobs.content] == want
