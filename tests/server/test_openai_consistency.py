"""Responses as an `openai` SDK user reads them, checked against each other: a stream's deltas,
logprobs and offsets against the same non-streamed request, usage against single requests,
logprob tables against the chosen tokens, and how messages are rendered."""

from __future__ import annotations

import pytest
import structured_testlib

MODEL = "smollm2-135m"
pytestmark = pytest.mark.e2e


def test_completion_stream_logprobs_equal_full_with_held_back_text(client):
    """A stop string that never matches still holds text back while streaming; `text_offset`
    must go on from the tokens' text (as in the full response), not from the text sent."""
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
              logprobs=2, stop=["zzzzqq"])  # fmt: skip
    client.completions.create(**kw)  # both calls below then prefill the same rows (AMX bf16)
    full = client.completions.create(**kw).choices[0]
    text, tokens, offsets = "", [], []
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens
                offsets += c.logprobs.text_offset
    assert text == full.text and tokens == full.logprobs.tokens
    assert offsets == full.logprobs.text_offset
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_characters_split_across_tokens_stream_whole(client, temperature):
    """Emoji take several byte-level tokens: no delta may carry half of one (U+FFFD), and the
    deltas must add up to the full response (greedy, and sampled with a seed). Only an output
    cut by max_tokens inside a character ends in U+FFFD, as decoding its tokens reads it."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Write five emoji: \U0001f600"}],
              max_tokens=16, temperature=temperature, seed=7)  # fmt: skip
    client.chat.completions.create(**kw)  # warm: both calls below prefill the same rows
    choice = client.chat.completions.create(**kw).choices[0]
    full = choice.message.content
    deltas = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**kw, stream=True)
        if c.choices
    ]
    assert any(ord(ch) > 0x7F for ch in full)  # the case is exercised
    assert "".join(deltas) == full
    cut = full.endswith("\ufffd") and choice.finish_reason == "length"
    assert not any("\ufffd" in d for d in deltas[:-1])
    assert "\ufffd" not in (deltas[-1].rstrip("\ufffd") if cut else deltas[-1])


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_tokens_never_leaks_into_a_stream(client, include):
    """A stop string that spans tokens: the stream holds its start back and ends where the full
    response ends (with or without the stop string), for every choice of n=2."""
    prompt = "The capital of France is"
    base = dict(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    client.completions.create(**base)  # warm: every call below prefills the same rows
    text = client.completions.create(**base).choices[0].text
    stop = text[3:9]  # " Paris.\n\nThe ...": ends inside the text, spans tokens
    assert len(stop) == 6 and text.index(stop) == 3
    kw = dict(base, n=2, stop=[stop], extra_body={"include_stop_str_in_output": include})
    full = client.completions.create(**kw)
    streamed: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
            assert stop not in streamed[c.index] or include
            finish[c.index] = c.finish_reason or finish.get(c.index)
    expected = text[:3] + (stop if include else "")
    for c in full.choices:
        assert c.text == streamed[c.index] == expected
        assert c.finish_reason == finish[c.index] == "stop"


def test_echo_of_token_ids_equals_echo_of_their_text(client):
    """A prompt of token ids is echoed whole: its special tokens were dropped
    ("<|im_start|>user\nHi" came back as "user\nHi")."""
    text = "<|im_start|>user\nHi"
    kw = dict(model=MODEL, max_tokens=1, temperature=0, echo=True)
    by_text = client.completions.create(prompt=text, **kw).choices[0].text
    ids = structured_testlib.smol_tokenizer().encode(text, add_special_tokens=False)
    by_ids = client.completions.create(prompt=ids, **kw).choices[0].text
    assert by_text.startswith(text) and by_ids == by_text


def test_developer_role_is_system_for_a_template_without_it(client):
    """SmolLM2's template knows no `developer` role: such a message must be rendered as the
    system message (not as a strange turn after the template's default system prompt)."""

    def prompt_tokens(role: str) -> int:
        messages = [
            {"role": role, "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
        ]
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
        return r.usage.prompt_tokens

    assert prompt_tokens("developer") == prompt_tokens("system")


def test_text_parts_are_joined_one_per_line(client):
    """Content given as text parts reads as the parts on separate lines, as vLLM renders it
    (joined with nothing, "Summarize:" and "The text" ran together)."""

    def prompt_tokens(content) -> int:
        messages = [{"role": "user", "content": content}]
        return client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=1
        ).usage.prompt_tokens

    parts = [{"type": "text", "text": "Summarize:"}, {"type": "text", "text": "The text"}]
    assert prompt_tokens(parts) == prompt_tokens("Summarize:\nThe text")
    assert prompt_tokens("Summarize:\nThe text") != prompt_tokens("Summarize:The text")


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_of_a_batch_add_up_over_its_prompts(client, stream):
    """`prompt_tokens` sums the batch's prompts; so must `cached_tokens` (it was the largest
    prompt's alone)."""
    prompt = "The history of the old harbour town is long and complicated. " * 6
    single = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    single = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)  # now cached
    cached = single.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    kw = dict(model=MODEL, prompt=[prompt, prompt], max_tokens=1)
    if stream:
        chunks = list(
            client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        )
        usage = chunks[-1].usage
    else:
        usage = client.completions.create(**kw).usage
    assert usage.prompt_tokens == 2 * single.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == 2 * cached


def test_legacy_logprobs_name_utf8_fragments_by_their_bytes(client):
    """Emoji and CJK take several byte-level tokens each; keyed by their decoded text (all
    "\ufffd") the alternatives overwrote each other and the chosen token's logprob."""
    r = client.completions.create(model=MODEL, prompt="Emoji: \U0001f600\U0001f603\U0001f604",
                                  max_tokens=6, temperature=0, logprobs=5)  # fmt: skip
    lp = r.choices[0].logprobs
    assert any(t.startswith("bytes:") for t in lp.tokens)
    raw = b""
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 5 and top[token] == pytest.approx(
            value, abs=1e-5
        )  # chosen: in the top 5
        assert "\ufffd" not in token
        if token.startswith("bytes:"):
            raw += bytes.fromhex(token[len("bytes:") :].replace("\\x", ""))
        else:
            raw += token.encode()
    assert raw.decode() == r.choices[0].text
