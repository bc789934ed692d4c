"""vLLM's `bad_words` extra through `pagoda serve` and the `openai` SDK (`extra_body`): a word
the free greedy output contains is gone, on completions and chat; bad values are 400s naming
the field."""

from __future__ import annotations

import json

import pytest
import structured_testlib
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.sampling.bad_words import bad_words_token_ids
from pagoda.runtime.server.completions import CompletionEndpoint
from pagoda.runtime.server.serving import Serving
from server_testlib import bad_field_error

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
USER = [{"role": "user", "content": "Name a colour and say why you like it."}]


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
    err = bad_field_error(server, path, "bad_words", value)
    assert err["param"].startswith("bad_words") and word in err["message"], err


async def test_words_are_tokenized_before_the_engine_gets_them():
    """The server tokenizes the words on its worker thread and hands the engine their ids: a
    request of 300 long words (seconds of tokenizing) once held the engine's step loop, and
    every other stream, that long."""
    tok = structured_testlib.smol_tokenizer()
    info = EngineInfo(MODEL, 512, tok.model_vocab_size, tok)

    class Engine:  # what Serving.prepare asks of an AsyncEngine
        loaded_info = staticmethod(lambda: info)
        check_prompts = staticmethod(lambda *a: None)

    serving = Serving(Engine())  # type: ignore[arg-type]
    body = json.dumps({"prompt": "x", "max_tokens": 1, "bad_words": ["Paris", "the sea"]})
    try:
        job = await serving.prepare(CompletionEndpoint((MODEL,), 16), body.encode())
    finally:
        serving.close()
    want = bad_words_token_ids(["Paris", "the sea"], tok, tok.model_vocab_size)
    assert job.params.bad_words_token_ids == want
