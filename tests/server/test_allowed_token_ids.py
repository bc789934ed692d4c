"""vLLM's `allowed_token_ids` extra through `pagoda serve` and the `openai` SDK (`extra_body`):
only the listed tokens are generated, with structured outputs too (a grammar that allows none
of them keeps the grammar's tokens), and bad values are 400s naming the field."""

from __future__ import annotations

import pytest
import structured_testlib
from server_testlib import bad_field_error

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
USER = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def tok():
    return structured_testlib.smol_tokenizer()


def _ids(tok, *words: str) -> list[int]:
    return sorted({t for w in words for t in tok.encode(w, add_special_tokens=False)})


def test_completions_and_chat_generate_allowed_tokens_only(client, tok):
    allowed = _ids(tok, " red", " green", " blue", ",")
    r = client.completions.create(model=MODEL, prompt="My favourite colours are", max_tokens=6,
                                  temperature=0, logprobs=1,
                                  extra_body={"allowed_token_ids": allowed, "ignore_eos": True})  # fmt: skip
    got = tok.encode(r.choices[0].text, add_special_tokens=False)
    assert len(r.choices[0].logprobs.tokens) == 6 and set(got) <= set(allowed), got
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, temperature=0.8,
                                       seed=1, extra_body={"allowed_token_ids": allowed})  # fmt: skip
    got = tok.encode(r.choices[0].message.content, add_special_tokens=False)
    assert got and set(got) <= set(allowed), got


def test_with_structured_outputs(client, tok):
    """max_tokens leaves room: near the end of its budget the grammar forces its way out."""
    choices = ["red", "blue", "green"]
    only_blue = _ids(tok, "blue") + list(tok.eos_token_ids)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=64, temperature=0,
                                       extra_body={"structured_outputs": {"choice": choices},
                                                   "allowed_token_ids": only_blue})  # fmt: skip
    assert r.choices[0].message.content == "blue"
    none = _ids(tok, " zebra")  # the grammar allows none of them: the grammar's tokens win
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=64, temperature=0,
                                       extra_body={"structured_outputs": {"choice": choices},
                                                   "allowed_token_ids": none})  # fmt: skip
    assert r.choices[0].message.content in choices


@pytest.mark.parametrize(
    ("value", "word"),
    [([], "empty"), ([49152], "vocabulary"), ([-1], "non-negative"), ("5", "list"),
     (["7"], "integer")],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_values_are_400s(server, path, value, word):
    err = bad_field_error(server, path, "allowed_token_ids", value)
    assert err["param"].startswith("allowed_token_ids") and word in err["message"], err
