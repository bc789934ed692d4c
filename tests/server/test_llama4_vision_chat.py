"""`pagoda serve` on a tiny Llama 4 reading images (tests/runtime/llama4_vision_testlib.py)
through the `openai` SDK: a chat with two base64 images (2 x 2 tiles and a global one; one
tile) reads as transformers' `Llama4Processor` renders it (the prompt's ids, seen through
vLLM's `prompt_logprobs`, are its `input_ids`) and answers transformers' greedy tokens; a
request's `mm_processor_kwargs` (max_patches 1) is read as the processor at that setting, an
unknown key of it is a 400; three images past --limit-mm-per-prompt are a 400; `/tokenize` of
messages with images answers the processor's ids (the images read: their tiles depend on their
sizes)."""

from __future__ import annotations

import httpx
import openai
import pytest
from idefics3_testlib import check_chat, image_part
from llama4_vision_testlib import hf_generate, hf_inputs, image, make_processor, make_tiny
from server_testlib import TINY_SERVE, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5


def _want(model, processor, messages, ims) -> tuple[list[int], list[int]]:
    """The processor's prompt ids and transformers' greedy tokens for `messages` (its parts)."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = hf_inputs(processor, text, ims)
    return inputs["input_ids"][0].tolist(), hf_generate(model, inputs, NEW)


def test_image_chats_read_as_the_processor_writes_them(tmp_path):
    model, processor = make_tiny(tmp_path)
    ims = [image(0, (100, 130)), image(2, (20, 25))]
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"},
                                           {"type": "image"}]}]  # fmt: skip
    ours = [{"role": "user", "content": [image_part(ims[0]), {"type": "text", "text": "Hi"},
                                         image_part(ims[1])]}]  # fmt: skip
    ids, tokens = _want(model, processor, theirs, ims)
    one_ids, one_tokens = _want(model, make_processor(max_patches=1), theirs, ims)
    limit = ("--limit-mm-per-prompt", '{"image": 2}')
    with openai_client("--model", str(tmp_path), *TINY_SERVE, *limit) as client:
        name = client.models.list().data[0].id
        check_chat(client, ours, ids, tokens, processor.tokenizer)
        check_chat(client, ours, one_ids, one_tokens, processor.tokenizer,
                   mm_processor_kwargs={"max_patches": 1})  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="not a setting of the llama4"):
            client.chat.completions.create(model=name, messages=ours, max_tokens=NEW,
                                           extra_body={"mm_processor_kwargs": {"size": 3}})  # fmt: skip
        three = [{"role": "user", "content": [image_part(ims[1])] * 3}]
        with pytest.raises(openai.BadRequestError, match="at most 2"):
            client.chat.completions.create(model=name, messages=three, max_tokens=NEW)
        shown = httpx.post(str(client.base_url).removesuffix("v1/") + "tokenize",
                           json={"messages": ours}, timeout=30)  # fmt: skip
        assert shown.status_code == 200, shown.text  # (the images read: tiles by their sizes)
        assert shown.json()["tokens"] == ids
