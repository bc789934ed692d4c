"""vLLM's `bad_words` extra through `pagoda serve` and the `openai` SDK (`extra_body`): a word
the free greedy output contains is gone, on completions and chat; bad values are 400s naming
the field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
USER = [{"role": "user", "content": "Name a colour and say why you like it."}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def _words(text: str) -> list[str]:
    return [w.strip(".,!?;:\"'") for w in text.split() if w.strip(".,!?;:\"'")]


def test_completions_and_chat_leave_banned_words_out(client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0)
    free = client.completions.create(**kw).choices[0].text
    banned = _words(free)[:2]
    text = client.completions.create(**kw, extra_body={"bad_words": banned}).choices[0].text
    assert text != free and not set(banned) & set(_words(text)), (banned, free, text)
    kw = dict(model=MODEL, messages=USER, max_tokens=16, temperature=0)
    free = client.chat.completions.create(**kw).choices[0].message.content
    banned = _words(free)[:1]
    r = client.chat.completions.create(**kw, extra_body={"bad_words": banned})
    assert banned[0] not in _words(r.choices[0].message.content), (banned, free, r)


@pytest.mark.parametrize(("value", "word"), [([""], "non-empty"), ("Paris", "list"),
                                             ([1], "string"), (["x"] * 301, "300")])  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_values_are_400s(server, path, value, word):
    body = {"model": MODEL, "max_tokens": 1, "bad_words": value}
    body.update({"prompt": "x"} if path == "/v1/completions" else {"messages": USER})
    r = httpx.post(f"{server.base}{path}", content=json.dumps(body),
                   headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith("bad_words") and word in err["message"], err
