"""Prompt logprobs over HTTP, against transformers: a `pagoda serve` of a tiny random float32
Llama (written by transformers), asked as lm-evaluation-harness's `local-completions` asks
(`echo` + `logprobs`, `max_tokens` 0 or 1, token-id prompts), with vLLM's `prompt_logprobs`
field on completions and chat, streamed and not, through the `openai` SDK; and the 400s."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from hf_oracle import make_tiny_llama
from server_testlib import ServerProcess

pytestmark = pytest.mark.e2e
pytest.importorskip("transformers")
TOL = 2e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_llama(path)
    srv = ServerProcess("--model", str(path), "--device", "cpu", "--dtype", "float32",
                        "--kv-cache-memory", "8MiB", "--max-num-batched-tokens", "16",
                        "--max-num-seqs", "8", "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        yield model, srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(tiny) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny[1].base}/v1", api_key="unused", max_retries=0)


def scores(model, ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax over the whole sequence: row j scores token j + 1."""
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float().log_softmax(-1)


def words(ids: list[int]) -> str:
    return " ".join(f"w{t}" for t in ids)


PROMPTS = [[(7 * i + 3) % 300 for i in range(n)] for n in (3, 40)]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_lm_eval_loglikelihood_request(tiny, max_tokens):
    """What lm-eval's local-completions sends for loglikelihood: token-id prompts in a batch,
    echo, logprobs 1, temperature 0. The scores are transformers'; the first token's are null;
    with max_tokens 0 the prompt comes back alone (no completion token counted)."""
    model, srv = tiny
    body = {"prompt": PROMPTS, "echo": True, "logprobs": 1, "max_tokens": max_tokens,
            "temperature": 0, "seed": 1234}  # fmt: skip
    r = httpx.post(f"{srv.base}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] == (0 if max_tokens == 0 else 2)
    assert out["usage"]["prompt_tokens"] == sum(map(len, PROMPTS)), "echo counts each prompt once"
    for ids, choice in zip(PROMPTS, out["choices"]):
        lp = choice["logprobs"]
        n = len(ids) + max_tokens
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["tokens"][: len(ids)] == [f"w{t}" for t in ids]
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
        full = ids + ([int(lp["tokens"][-1][1:])] if max_tokens else [])
        ref = scores(model, full)
        for j in range(1, n):
            assert lp["token_logprobs"][j] == pytest.approx(float(ref[j - 1, full[j]]), abs=TOL)
            best = int(ref[j - 1].argmax())
            top = lp["top_logprobs"][j]
            assert f"w{best}" in top and f"w{full[j]}" in top and len(top) <= 2
        assert choice["text"].startswith(words(ids))
        if max_tokens == 0:
            assert choice["text"] == words(ids) and choice["finish_reason"] == "length"
        else:
            assert int(lp["tokens"][-1][1:]) == int(ref[-2].argmax()), "greedy"


def test_echo_logprobs_stream_equals_full(client):
    model = client.models.list().data[0].id
    kw = dict(prompt=words(PROMPTS[1]), echo=True, logprobs=2, max_tokens=4, temperature=0)
    full = client.completions.create(model=model, **kw).choices[0]
    text, tokens, values, offsets, tops = "", [], [], [], []
    for chunk in client.completions.create(model=model, stream=True, **kw):
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens
                values += c.logprobs.token_logprobs
                offsets += c.logprobs.text_offset
                tops += c.logprobs.top_logprobs
    assert text == full.text
    assert tokens == full.logprobs.tokens and offsets == full.logprobs.text_offset
    assert values == full.logprobs.token_logprobs and tops == full.logprobs.top_logprobs
    assert len(tokens) == len(PROMPTS[1]) + 4 and values[0] is None


def check_vllm_shape(model, ids: list[int], got: list, k: int) -> None:
    ref = scores(model, ids)
    assert len(got) == len(ids) and got[0] is None
    for j in range(1, len(ids)):
        entry, row = got[j], ref[j - 1]
        assert next(iter(entry)) == str(ids[j])
        own = entry[str(ids[j])]
        assert own["logprob"] == pytest.approx(float(row[ids[j]]), abs=TOL)
        t = ids[j]  # its place by value, ties by index (as the engine ranks them)
        assert own["rank"] == int((row > row[t]).sum() + (row[: t + 1] == row[t]).sum())
        assert own["decoded_token"] == f"w{ids[j]}"
        top = row.topk(k)
        for rank, (t, v) in enumerate(zip(top.indices.tolist(), top.values.tolist()), 1):
            assert entry[str(t)]["logprob"] == pytest.approx(v, abs=TOL)
            assert entry[str(t)]["rank"] == rank or t == ids[j]
        assert len(entry) in (k, k + 1)


def test_prompt_logprobs_field_on_completions_and_chat(tiny, client):
    """vLLM's `prompt_logprobs`: per choice on completions (n = 2: both), on the response in
    chat (the rendered conversation's tokens: `w3 <content> w4`)."""
    model, _ = tiny
    name = client.models.list().data[0].id
    out = client.completions.create(model=name, prompt=words(PROMPTS[1]), max_tokens=2, n=2,
                                    temperature=0, extra_body={"prompt_logprobs": 2})  # fmt: skip
    for c in out.choices:
        check_vllm_shape(model, PROMPTS[1], c.model_extra["prompt_logprobs"], 2)
        assert c.logprobs is None
    plain = client.completions.create(model=name, prompt="w5 w6", max_tokens=2)
    assert "prompt_logprobs" not in plain.choices[0].model_extra
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "w10 w11 w12"}], max_tokens=2,
        extra_body={"prompt_logprobs": 1},
    )  # fmt: skip
    check_vllm_shape(model, [3, 10, 11, 12, 4], chat.model_extra["prompt_logprobs"], 1)


def test_completions_default_to_16_tokens(client):
    """No max_tokens (or null): 16, as OpenAI's legacy API and vLLM's CompletionRequest."""
    name = client.models.list().data[0].id
    for extra in ({}, {"max_tokens": None}):
        out = client.completions.create(model=name, prompt="w5 w6", extra_body={"ignore_eos": True},
                                        **extra)  # fmt: skip
        assert out.usage.completion_tokens == 16 and out.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": "2"}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"echo": True, "logprobs": 21}, "logprobs"),
        ({"echo": True, "logprobs": -1}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 0, "echo": True, "min_tokens": 1}, "min_tokens"),
    ],
)
def test_bad_values_are_400s(tiny, body, param):
    r = httpx.post(f"{tiny[1].base}/v1/completions", json={"prompt": "w5 w6", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert (
        r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    )
    if param == "prompt_logprobs" and "stream" not in body:
        r = httpx.post(f"{tiny[1].base}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "w5"}], **body}, timeout=30)  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ranks_are_computed_only_for_the_prompt_logprobs_field():
    """The server asks the engine for ranks (`logprob_ranks`) only where its response shows
    them: vLLM's `prompt_logprobs` entries; OpenAI's logprobs and echo's prompt scores have no
    rank, and each would cost a second pass over the row."""
    from pagoda.runtime.server.chat import ChatEndpoint
    from pagoda.runtime.server.completions import CompletionEndpoint
    from pagoda.runtime.server.protocol import ChatCompletionRequest, CompletionRequest

    def ranks(model, body) -> bool:
        endpoint = (
            ChatEndpoint(("m",))
            if model is ChatCompletionRequest
            else CompletionEndpoint(("m",), 1)
        )
        return endpoint.sampling_params(model.model_validate(body), {}).logprob_ranks

    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    assert not ranks(ChatCompletionRequest, chat)
    assert ranks(ChatCompletionRequest, {**chat, "prompt_logprobs": 0})
    echo = {"prompt": "hi", "echo": True, "logprobs": 2, "max_tokens": 0}
    assert not ranks(CompletionRequest, echo)
    assert ranks(CompletionRequest, {**echo, "prompt_logprobs": 1})
