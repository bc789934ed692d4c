"""A real `pagoda serve` driven with the official `openai` SDK, sync and async.

Greedy output must equal the offline `LLM` for the same prompt (same dtype on both sides), and
usage must equal the tokenizer's counts.
"""

from __future__ import annotations

import openai
import pytest
from pagoda.runtime import SamplingParams

MODEL = "smollm2-135m"
pytestmark = pytest.mark.e2e


@pytest.fixture
def aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-9")
    assert e.value.code == "model_not_found" and e.value.param == "model"
    assert e.value.type == "invalid_request_error"  # OpenAI's type for an unknown model


def test_chat_greedy_equals_offline_with_usage(client, offline):
    # A system prompt of its own: no prefix-cache hit on blocks other tests computed in batches
    # (bf16 results of a row can depend on the batch it was computed in).
    messages = [
        {"role": "system", "content": "Answer in one short line."},
        {"role": "user", "content": "Name three colours of the rainbow."},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    ref = offline.chat(messages, SamplingParams(max_tokens=20, temperature=0))[0]
    assert r.choices[0].message.content == ref.outputs[0].text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ref.outputs[0].finish_reason
    prompt = offline.tokenizer.apply_chat_template(messages)
    assert r.usage.prompt_tokens == len(offline.tokenizer.encode(prompt, add_special_tokens=False))
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.id.startswith("chatcmpl-") and r.created > 0 and r.model == MODEL


def test_chat_options_render_as_offline_chat(client, offline):
    """`LLM.chat`'s rendering options give the prompt the server renders for the same request:
    text parts, a developer message (a system message for this template), a reply that
    continues the last message, no generation prompt."""
    messages = [
        {"role": "developer", "content": "Reply in French."},
        {"role": "user", "content": [{"type": "text", "text": "Greet me."},
                                     {"type": "text", "text": "Briefly."}]},
        {"role": "assistant", "content": "Bonjour, je"},
    ]  # fmt: skip
    params = SamplingParams(max_tokens=6, temperature=0)
    for kw in ({"continue_final_message": True}, {"add_generation_prompt": False}):
        r = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=0, extra_body=kw
        )
        (ref,) = offline.chat(messages, params, **kw)
        assert r.usage.prompt_tokens == len(ref.prompt_token_ids), kw
        assert r.choices[0].message.content == ref.outputs[0].text, kw


def test_completion_greedy_equals_offline_with_usage(client, offline):
    prompt = "The history of computing is a story of"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    ref = offline.generate(prompt, SamplingParams(max_tokens=16, temperature=0))[0]
    assert r.choices[0].text == ref.outputs[0].text
    assert r.usage.prompt_tokens == len(offline.tokenizer.encode(prompt))
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids) == 16
    assert r.choices[0].finish_reason == "length" and r.id.startswith("cmpl-")


async def test_async_chat_stream_equals_non_stream(aclient):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12)
    # Both calls below find the prompt's full blocks in the prefix cache, so they compute the
    # same rows: in bfloat16 on AMX CPUs the GEMM's rounding depends on the row count
    # (docs/runtime.md, "What is guaranteed"), and a cold call prefills more rows at once.
    await aclient.chat.completions.create(**kw, temperature=0)
    full = await aclient.chat.completions.create(**kw, temperature=0)
    stream = await aclient.chat.completions.create(
        **kw, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    text, finish, usage, roles = "", None, None, []
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        delta = chunk.choices[0].delta
        roles += [delta.role] if delta.role else []
        text += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant"]
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_sync_completion_stream(client):
    kw = dict(model=MODEL, prompt="Rivers carve valleys", max_tokens=10, temperature=0)
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.id == chunks[0].id for c in chunks)


async def test_async_completion_stream_usage(aclient):
    stream = await aclient.completions.create(
        model=MODEL, prompt="Farmers", max_tokens=5, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [c async for c in stream]
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].choices == []


def test_n2_and_seed_reproducible(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, n=2, seed=7)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == 24 or all(c.finish_reason for c in a.choices)
    msgs = [{"role": "user", "content": "Tell me a story."}]
    c1 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, seed=3, n=2)
    c2 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, seed=3, n=2)
    assert [c.message.content for c in c1.choices] == [c.message.content for c in c2.choices]
    assert len(c1.choices) == 2


def test_stop_string(client):
    kw = dict(model=MODEL, prompt="The delta is fertile because", max_tokens=24, temperature=0)
    text = client.completions.create(**kw).choices[0].text
    word = next(w for w in text.split()[2:] if w.isalpha() and len(w) > 2)
    cut = client.completions.create(**kw, stop=[word, "zzzz"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(word)]


def test_logprobs_chat_and_completion(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob, abs=1e-4)  # greedy
        assert bytes(item.bytes).decode("utf-8", "replace")
    c = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=2
    ).choices[0]
    assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == 4
    assert all(len(t) >= 2 for t in c.logprobs.top_logprobs)
    assert "".join(c.logprobs.tokens) == c.text


def test_vllm_extras(client):
    r = client.completions.create(
        model=MODEL, prompt="Count: one two", max_tokens=8, temperature=0.7,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "ignore_eos": True},
        presence_penalty=0.5, frequency_penalty=0.5, top_p=0.9, user="tester",
    )  # fmt: skip
    assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
