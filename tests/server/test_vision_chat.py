"""`pagoda serve` on a tiny LLaVA 1.5 (tests/runtime/llava_testlib.py) through the `openai` SDK:
a chat with a base64 image renders as transformers' processor renders it (`apply_chat_template`
over content parts, `<image>` expanded to the image's rows) and answers transformers' greedy
tokens; an image fetched from a local http server reads the same; bad images, bad URLs,
unreachable hosts and images past --limit-mm-per-prompt are 400s with OpenAI-style bodies, and
the server answers the next request."""

from __future__ import annotations

import base64
import http.server
import threading

import httpx
import openai
import pytest
from llava_testlib import hf_generate, image, make_tiny_llava, png_bytes
from server_testlib import TINY_SERVE, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
NEW = 5
IMAGE = image(0)
PNG = png_bytes(IMAGE)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args):
        pass


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _chat(client, messages, extra: dict | None = None, **kw):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=messages, max_tokens=NEW, temperature=0,
        extra_body={"ignore_eos": True, **(extra or {})}, **kw,
    )  # fmt: skip


def _refused(client, messages, param: str, code: str) -> str:
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages)
    body = e.value.body
    assert (body["param"], body["code"]) == (param, code), body
    return body["message"]


def test_image_chats_answer_transformers_tokens(tmp_path):
    model, processor = make_tiny_llava(tmp_path)
    hf_messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w7 w8"}]}
    ]
    text = processor.apply_chat_template(hf_messages, add_generation_prompt=True)
    ids = processor(text=text, images=[IMAGE])["input_ids"][0]
    want = hf_generate(model, processor, list(ids), [IMAGE], NEW)
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{site.server_address[1]}/cat.png"
    limit = ("--limit-mm-per-prompt", '{"image": 1}')
    try:
        with openai_client("--model", str(tmp_path), *TINY_SERVE, *limit) as client:
            for source in (DATA_URL, url):
                got = _chat(client, _user(_image_part(source), {"type": "text", "text": "w7 w8"}),
                            logprobs=True)  # fmt: skip
                assert got.usage.prompt_tokens == len(ids)
                tokens = [int(t.token.removeprefix("w")) for t in got.choices[0].logprobs.content]
                assert tokens == want
            text_only = _chat(client, [{"role": "user", "content": "w7 w8"}])
            assert text_only.usage.prompt_tokens == 4  # w3 w7 w8 w5: no image, no placeholder
            shown = httpx.post(str(client.base_url).removesuffix("v1/") + "tokenize", json={
                "messages": _user(_image_part(gone := "http://127.0.0.1:9/cat.png"),
                                  {"type": "text", "text": "w7 w8"})}, timeout=30)  # fmt: skip
            assert shown.json()["tokens"] == list(ids)  # placeholders, no image read
            echoed = _chat(
                client,
                [*_user(_image_part(DATA_URL)), {"role": "assistant", "content": "w9"}],
                {"echo": True},
            )
            assert echoed.choices[0].message.content.startswith("w9")
            # the Responses API's input_image runs as chat's image_url part
            parts = [{"type": "input_text", "text": "w7 w8"}]
            said = client.responses.create(model=client.models.list().data[0].id, input=[
                {"role": "user", "content": [{"type": "input_image", "image_url": DATA_URL},
                                             *parts]}],
                max_output_tokens=NEW, temperature=0)  # fmt: skip
            plain = client.chat.completions.create(
                model=client.models.list().data[0].id,
                max_tokens=NEW,
                temperature=0,
                messages=_user(_image_part(DATA_URL), {"type": "text", "text": "w7 w8"}),
            )
            assert said.usage.input_tokens == len(ids)
            assert said.output_text == plain.choices[0].message.content
            # the Messages API's image blocks (a base64 source, a url source) as well
            b64 = {"type": "base64", "media_type": "image/png", "data": DATA_URL.split(",")[1]}
            for source in (b64, {"type": "url", "url": url}):
                r = httpx.post(str(client.base_url).removesuffix("v1/") + "v1/messages", json={
                    "model": client.models.list().data[0].id, "max_tokens": NEW,
                    "temperature": 0, "messages": [{"role": "user", "content": [
                        {"type": "image", "source": source}, {"type": "text", "text": "w7 w8"}]}]},
                    timeout=60)  # fmt: skip
                assert r.status_code == 200, r.text
                m = r.json()
                usage = m["usage"]  # the prompt's tokens: those read from the cache, the rest
                assert usage["input_tokens"] + usage["cache_read_input_tokens"] == len(ids)
                assert m["content"][0]["text"] == plain.choices[0].message.content
            bad = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
            param = "messages[0].content[0].image_url"
            assert "decoded" in _refused(client, _user(_image_part(bad)), param, "invalid_image")
            _refused(client, _user(_image_part("ftp://x/y.png")), param, "invalid_image_url")
            assert "fetched" in _refused(
                client, _user(_image_part(gone)), param, "invalid_image_url"
            )
            two = _user(_image_part(DATA_URL), _image_part(DATA_URL))
            assert "at most 1" in _refused(client, two, "messages", "too_many_images")
            again = _chat(client, _user(_image_part(DATA_URL), {"type": "text", "text": "w7 w8"}))
            assert again.choices[0].message.content == got.choices[0].message.content
    finally:
        site.shutdown()
