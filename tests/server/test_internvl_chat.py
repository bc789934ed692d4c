"""`pagoda serve` on a tiny InternVL (tests/runtime/internvl_testlib.py) through the `openai`
SDK, started with `--mm-processor-kwargs '{"max_patches": 2}'`: a chat with two base64 images
reads as transformers' `InternVLProcessor` writes it at those bounds (the prompt's ids, seen
through vLLM's `prompt_logprobs`, are its `input_ids`) and answers transformers' greedy tokens;
a request's own `mm_processor_kwargs` (max_patches 4: the landscape image's 2 x 2 tiles and
thumbnail) does the same at its bounds; images past --limit-mm-per-prompt are a 400;
`/tokenize` of messages with images reads them (the tiles depend on each image's size)."""

from __future__ import annotations

import httpx
import openai
import pytest
from internvl_testlib import (
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
    model, processor = make_tiny(tmp_path)
    ims = [image(0, (40, 52)), image(1, (70, 30))]
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"},
                                           {"type": "image"}]}]  # fmt: skip
    text = processor.tokenizer.apply_chat_template(theirs, add_generation_prompt=True,
                                                   tokenize=False)  # fmt: skip
    ours = [{"role": "user", "content": [image_part(ims[0]), {"type": "text", "text": "Hi"},
                                         image_part(ims[1])]}]  # fmt: skip
    flags = ("--limit-mm-per-prompt", '{"image": 2}', "--mm-processor-kwargs",
             '{"max_patches": 2}')  # fmt: skip
    with openai_client("--model", str(tmp_path), *TINY_SERVE, *flags) as client:
        name = client.models.list().data[0].id
        flag_ids = None
        for kw in ({}, {"max_patches": 4}):
            want = hf_inputs(processor, text, ims, max_patches=kw.get("max_patches", 2))
            ids = want["input_ids"][0].tolist()
            flag_ids = flag_ids or ids
            got = client.chat.completions.create(
                model=name, messages=ours, max_tokens=NEW, temperature=0, logprobs=True,
                extra_body={"ignore_eos": True, "prompt_logprobs": 0, "mm_processor_kwargs": kw},
            )  # fmt: skip
            assert got.usage.prompt_tokens == len(ids)
            prompt = got.model_extra["prompt_logprobs"]
            assert prompt[0] is None and [int(next(iter(e))) for e in prompt[1:]] == ids[1:]
            assert logprob_ids(processor.tokenizer, got.choices[0].logprobs.content) == hf_generate(
                model, want, NEW)  # fmt: skip
        three = [{"role": "user", "content": [image_part(ims[0])] * 3}]
        with pytest.raises(openai.BadRequestError, match="at most 2"):
            client.chat.completions.create(model=name, messages=three, max_tokens=NEW)
        shown = httpx.post(str(client.base_url).removesuffix("v1/") + "tokenize",
                           json={"messages": ours}, timeout=30)  # fmt: skip
        assert shown.status_code == 200, shown.text  # (the images read: tiles by their sizes)
        assert shown.json()["tokens"] == flag_ids
