"""Sampling and generation fields as a vLLM user relies on them, through `pagoda serve` and the
`openai` SDK: seeds of n samples, stop tokens kept by `include_stop_str_in_output` (vLLM's
detokenizer renders the stopping token then), `min_tokens`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import structured_testlib

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
# ends with <|im_end|> within 60 tokens on every CPU (greedy: "The capital of France is Paris.";
# "Say hi" ran past 60 tokens on an AVX-512 machine without AMX, whose bf16 rounding differs)
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tok():
    return structured_testlib.smol_tokenizer()


def _both(client, **kw) -> tuple[openai.types.CompletionChoice, str]:
    """The full response's choice and the text of the same request streamed, both sent at once
    (greedy: batched together, they give the tokens each gives alone)."""

    def streamed() -> str:
        chunks = client.completions.create(model=MODEL, temperature=0, stream=True, **kw)
        return "".join(c.text for chunk in chunks for c in chunk.choices)

    with ThreadPoolExecutor(1) as pool:
        text = pool.submit(streamed)
        full = client.completions.create(model=MODEL, temperature=0, **kw).choices[0]
        return full, text.result()


def test_the_largest_seed_serves_every_sample(client):
    """Sample i is seeded with seed + i (vLLM's rule); past the top of the range it wraps
    around rather than failing inside the engine (a 500)."""
    top = 2**64 - 1
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=3, seed=top)
    assert [c.finish_reason for c in r.choices] == ["length"] * 3
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=3, seed=top)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    wrapped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, seed=1)
    assert wrapped.choices[0].text == r.choices[2].text  # seed top + 2 wraps to 1


def test_include_stop_str_in_output_keeps_the_stop_token(client, tok):
    """vLLM renders the token that stopped the output (a stop_token_ids entry or EOS) only with
    `include_stop_str_in_output`; EOS shows as text with `skip_special_tokens: false`."""
    dot = tok.encode(".", add_special_tokens=False)
    kw = dict(prompt=PROMPT, max_tokens=20, extra_body={"stop_token_ids": dot})
    cut, _ = _both(client, **kw)
    assert cut.text == " Paris" and cut.stop_reason == dot[0]
    for stop in ([], ["zzqq"]):  # without and with stop strings (two paths in the engine)
        kw["extra_body"] = {"stop_token_ids": dot, "include_stop_str_in_output": True}
        full, streamed = _both(client, **kw, stop=stop)
        assert full.text == streamed == " Paris." and full.stop_reason == dot[0]
        eos = {"skip_special_tokens": False, "include_stop_str_in_output": True}
        full, streamed = _both(client, prompt=CHAT, max_tokens=60, stop=stop, extra_body=eos)
        assert full.finish_reason == "stop" and full.text == streamed
        assert full.text.endswith("<|im_end|>") and full.text.count("<|im_end|>") == 1
        plain, _ = _both(client, prompt=CHAT, max_tokens=60, stop=stop,
                         extra_body={"skip_special_tokens": False})  # fmt: skip
        assert plain.text + "<|im_end|>" == full.text


def test_min_tokens_holds_back_eos_stop_tokens_and_stop_strings(client, tok):
    """vLLM's min_tokens: no EOS or stop_token_ids among the first min_tokens tokens, and no stop
    string that ends in their text (one that ends later may start in it)."""
    free = client.completions.create(model=MODEL, prompt=CHAT, max_tokens=60, temperature=0)
    k = free.usage.completion_tokens - 1  # the EOS is token k
    assert free.choices[0].finish_reason == "stop" and free.choices[0].stop_reason is None
    met, _ = _both(client, prompt=CHAT, max_tokens=60, extra_body={"min_tokens": k})
    assert met.text == free.choices[0].text
    held, streamed = _both(client, prompt=CHAT, max_tokens=k + 6, extra_body={"min_tokens": k + 1})
    assert held.text.startswith(free.choices[0].text) and held.text == streamed
    assert len(held.text) > len(free.choices[0].text)

    ref = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0,
                                    logprobs=0).choices[0]  # fmt: skip
    tokens = ref.logprobs.tokens
    assert tokens[:3] == [" Paris", ".", "\n"]
    dot = tok.encode(".", add_special_tokens=False)
    r, _ = _both(client, prompt=PROMPT, max_tokens=3,
                 extra_body={"min_tokens": 2, "stop_token_ids": dot})  # fmt: skip
    assert r.text.startswith(" Paris") and "." not in r.text[:7]  # "." cannot be token 1
    for m, stop in ((1, ".\n"), (2, ".\n"), (3, "\n\n"), (2, "."), (10, "2"), (9, "2")):
        # the first occurrence that ends past the text of the first m tokens, if any
        shown = len("".join(tokens[:m]))
        at = next((i for i in range(len(ref.text)) if ref.text.startswith(stop, i)
                   and i + len(stop) > shown), None)  # fmt: skip
        r, streamed = _both(client, prompt=PROMPT, max_tokens=20, stop=[stop],
                            extra_body={"min_tokens": m})  # fmt: skip
        assert r.text == streamed == ref.text[:at], (m, stop)
        assert r.stop_reason == (stop if at is not None else None), (m, stop)


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
     ({"min_tokens": -1}, "min_tokens"),
     ({"min_tokens": 2, "response_format": {"type": "json_object"}}, "min_tokens"),
     ({"min_tokens": 2, "max_completion_tokens": 1}, "min_tokens")],
)  # fmt: skip
def test_min_tokens_out_of_range_is_a_400_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       extra_body=extra)  # fmt: skip
    assert e.value.body["param"] == param, e.value.body


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_count_each_choice_so_far(client, chat):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's usage so
    far (the role chunk none yet); the last chunk, with no choices, the request's total."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    kw = dict(model=MODEL, max_tokens=5, n=2, seed=3, stream=True, stream_options=opts,
              extra_body={"ignore_eos": True})  # fmt: skip
    if chat:
        chunks = list(client.chat.completions.create(
            messages=[{"role": "user", "content": "Say hi"}], **kw))  # fmt: skip
    else:
        chunks = list(client.completions.create(prompt=[PROMPT, "Hello there"], **kw))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 5 * (4 if not chat else 2)
    seen: dict[int, int] = {}
    prompts = {}
    for c in body:
        (choice,) = c.choices
        u = c.usage
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.completion_tokens >= seen.get(choice.index, 0)
        seen[choice.index] = u.completion_tokens
        prompts[choice.index] = u.prompt_tokens
        if choice.finish_reason is not None:
            assert u.completion_tokens == 5
    assert seen == {i: 5 for i in range(len(seen))} and len(seen) == (2 if chat else 4)
    per_prompt = [prompts[i] for i in range(0, len(seen), 2)]
    assert last.usage.prompt_tokens == sum(per_prompt)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, stream=True,
                                  stream_options={"continuous_usage_stats": True})  # fmt: skip
    assert e.value.body["param"] == "stream_options.continuous_usage_stats"
