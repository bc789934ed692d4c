"""`pagoda serve` on a tiny Idefics3 (tests/runtime/idefics3_testlib.py) through the `openai`
SDK: a chat with a base64 image reads as transformers' `Idefics3Processor` renders it (the
prompt's ids, seen through vLLM's `prompt_logprobs`, are its `input_ids`: each image's tiles
and the text around them) and answers transformers' greedy tokens; two images past
--limit-mm-per-prompt are a 400, one image of five tiles is not; `/tokenize` of messages with
images answers the processor's `input_ids` (the images read: the tiles depend on their sizes)."""

from __future__ import annotations

import httpx
import openai
import pytest
from idefics3_testlib import (
    hf_generate,
    hf_inputs,
    image,
    image_part,
    logprob_ids,
    make_tiny,
)
from server_testlib import TINY_SERVE, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5


def test_image_chats_read_as_the_processor_writes_them(tmp_path):
    model, processor = make_tiny(tmp_path, "idefics3")
    ims = [image(0, (40, 52)), image(1, (70, 30))]
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"},
                                           {"type": "image"}]}]  # fmt: skip
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    want = hf_inputs(processor, text, ims)
    ids = want["input_ids"][0].tolist()
    tokens = hf_generate(model, want, NEW)
    ours = [{"role": "user", "content": [image_part(ims[0]), {"type": "text", "text": "Hi"},
                                         image_part(ims[1])]}]  # fmt: skip
    limit = ("--limit-mm-per-prompt", '{"image": 2}')
    with openai_client("--model", str(tmp_path), *TINY_SERVE, *limit) as client:
        name = client.models.list().data[0].id
        got = client.chat.completions.create(
            model=name, messages=ours, max_tokens=NEW, temperature=0, logprobs=True,
            extra_body={"ignore_eos": True, "prompt_logprobs": 0},
        )  # fmt: skip
        assert got.usage.prompt_tokens == len(ids)
        prompt = got.model_extra["prompt_logprobs"]
        assert prompt[0] is None and [int(next(iter(e))) for e in prompt[1:]] == ids[1:]
        assert logprob_ids(processor.tokenizer, got.choices[0].logprobs.content) == tokens
        three = [{"role": "user", "content": [image_part(ims[0])] * 3}]
        with pytest.raises(openai.BadRequestError, match="at most 2"):
            client.chat.completions.create(model=name, messages=three, max_tokens=NEW)
        shown = httpx.post(str(client.base_url).removesuffix("v1/") + "tokenize",
                           json={"messages": ours}, timeout=30)  # fmt: skip
        assert shown.status_code == 200, shown.text
        assert shown.json()["tokens"] == ids
