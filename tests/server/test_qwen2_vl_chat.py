"""`pagoda serve` on a tiny Qwen2-VL and a tiny Qwen3-VL (tests/runtime/qwen2_vl_testlib.py,
qwen3_vl_testlib.py) through the `openai` SDK: a chat with a base64 image renders
`<|vision_start|><|image_pad|><|vision_end|>`, the pad expanded to the image's own run, and
answers transformers' greedy tokens; a text-only chat after it too; `/tokenize` of messages with
an image answers the chat's prompt ids (the image read: its run depends on it). Qwen2-VL's
server runs with `--mm-processor-kwargs '{"max_pixels": 4096}'`: its runs at those bounds, a
request's `mm_processor_kwargs` (max_pixels) giving the image another run and transformers'
tokens with the same kwargs, in chat, `/v1/responses` (an `input_image`) and `/tokenize` alike;
an unknown key a 400 from each (the flag's: refused before the server binds)."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import qwen2_vl_testlib
import qwen3_vl_testlib
from qwen2_vl_testlib import END, IMAGE_ID, START, hf_generate
from server_testlib import TINY_SERVE, check_image_chat, openai_client

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


# each family's tiny checkpoint and its processor (both: 8 px patches, 256 to 16384 pixels)
# (Qwen2-VL's chat: `test_mm_processor_kwargs_from_the_flag_and_the_request`)
FAMILIES = {
    "qwen3_vl": (qwen3_vl_testlib.make_tiny_qwen3_vl, qwen3_vl_testlib.PROCESSOR),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_an_image_chat_answers_transformers_tokens(tmp_path, family):
    make, processor = FAMILIES[family]
    model = make(tmp_path)
    im, url = _image()
    # w3 <|vision_start|> <|image_pad|> x 24 (64 x 96 px: 4 x 6 merged) <|vision_end|> w7 w8 w5
    ids = [3, START] + [IMAGE_ID] * 24 + [END, 7, 8, 5]
    want = hf_generate(model, ids, [im], NEW, processor)
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w7 w8"}]
    with openai_client("--model", str(tmp_path), *TINY_SERVE) as client:
        check_image_chat(client, parts, ids, want, _id)


def test_mm_processor_kwargs_from_the_flag_and_the_request(tmp_path):
    model = qwen2_vl_testlib.make_tiny_qwen2_vl(tmp_path)
    im, url = _image()
    # --mm-processor-kwargs: w3 <|vision_start|> <|image_pad|> x 12 (48 x 64 px at 4096 pixels
    # at most: 3 x 4 merged) <|vision_end|> w7 w8 w5
    flag = {"max_pixels": 4096}
    ids = [3, START] + [IMAGE_ID] * 12 + [END, 7, 8, 5]
    want = hf_generate(model, ids, [im], NEW, **flag)
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w7 w8"}]
    with pytest.raises(ValueError, match="'do_resize' is not a setting of the qwen2_vl image"):
        _preflight(tmp_path, '{"do_resize": false}')  # (`pagoda serve`: one line, exit 2)
    with openai_client("--model", str(tmp_path), *TINY_SERVE, "--mm-processor-kwargs",
                       json.dumps(flag)) as client:  # fmt: skip
        name = client.models.list().data[0].id
        got = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": parts}], max_tokens=NEW,
            temperature=0, logprobs=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert got.usage.prompt_tokens == len(ids)
        assert [_id(t.token) for t in got.choices[0].logprobs.content] == want
        text = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "w7 w8"}], max_tokens=NEW,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert text.usage.prompt_tokens == 4
        # a request's own processor settings over the flag's: 32 x 48 px, 2 x 3 merged
        small = {"max_pixels": 2048}
        ids = [3, START] + [IMAGE_ID] * 6 + [END, 7, 8, 5]
        got = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": parts}], max_tokens=NEW,
            temperature=0, logprobs=True,
            extra_body={"ignore_eos": True, "mm_processor_kwargs": small},
        )  # fmt: skip
        assert got.usage.prompt_tokens == len(ids)
        want = hf_generate(model, ids, [im], NEW, **small)
        assert [_id(t.token) for t in got.choices[0].logprobs.content] == want
        _check_responses(client, name, url, small, ids)
        messages = [{"role": "user", "content": parts}]
        tokenize = str(client.base_url).removesuffix("v1/") + "tokenize"
        shown = httpx.post(tokenize, json={"messages": messages}, timeout=30)
        assert shown.status_code == 200, shown.text
        assert shown.json()["tokens"] == [3, START] + [IMAGE_ID] * 12 + [END, 7, 8, 5]  # the flag's
        shown = httpx.post(tokenize, json={"messages": messages, "mm_processor_kwargs": small},
                           timeout=30)  # fmt: skip
        assert shown.status_code == 200, shown.text
        assert shown.json()["tokens"] == ids
        bad_kwargs = {"do_resize": False}
        for path, body in (
            ("v1/chat/completions", {"model": name, "messages": messages, "max_tokens": 1}),
            (
                "v1/responses",
                {"model": name, "input": _responses_input(url), "max_output_tokens": 1},
            ),
            ("tokenize", {"messages": messages}),
        ):
            bad = httpx.post(tokenize.removesuffix("tokenize") + path, timeout=30,
                             json={**body, "mm_processor_kwargs": bad_kwargs})  # fmt: skip
            assert bad.status_code == 400, (path, bad.text)
            error = bad.json()["error"]
            assert error["param"] == "mm_processor_kwargs" and "'do_resize'" in error["message"]


def _responses_input(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_image", "image_url": url},
                                         {"type": "input_text", "text": "w7 w8"}]}]  # fmt: skip


def _check_responses(client, name: str, url: str, kwargs: dict, ids: list[int]) -> None:
    """`/v1/responses` with an `input_image` and `mm_processor_kwargs`: the image's run at those
    settings (the prompt `ids`), and the answer chat gives the same request, greedy."""
    got = client.responses.create(model=name, input=_responses_input(url), max_output_tokens=NEW,
                                  temperature=0, extra_body={"mm_processor_kwargs": kwargs})  # fmt: skip
    assert got.usage.input_tokens == len(ids)
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w7 w8"}]}],
        max_tokens=NEW, temperature=0, extra_body={"mm_processor_kwargs": kwargs},
    )  # fmt: skip
    assert got.output_text == chat.choices[0].message.content
    assert chat.usage.prompt_tokens == len(ids) and got.output_text


def _preflight(path, kwargs: str):
    """`pagoda serve`'s checks before it binds, with --mm-processor-kwargs `kwargs`."""
    from pagoda.runtime import options
    from pagoda.runtime.server.cli import build_parser, server_config
    from pagoda.runtime.server.launch import preflight

    args = build_parser().parse_args(["--model", str(path), *TINY_SERVE,
                                      "--mm-processor-kwargs", kwargs])  # fmt: skip
    return preflight(server_config(args), options.engine_kwargs(vars(args)))
