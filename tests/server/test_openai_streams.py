"""Streams as an `openai` SDK user sees them, checked against the same non-streamed request:
the concatenated deltas, logprobs and offsets must equal the full response's."""

from __future__ import annotations

import openai
import pytest

MODEL = "smollm2-135m"
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def test_completion_stream_logprobs_equal_full_with_held_back_text(client):
    """A stop string that never matches still holds text back while streaming; `text_offset`
    must go on from the tokens' text (as in the full response), not from the text sent."""
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
              logprobs=2, stop=["zzzzqq"])  # fmt: skip
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
