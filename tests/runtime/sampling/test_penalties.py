"""Sparse penalties (`penalties`): the same logits as the dense OpenAI/vLLM formulas over
[N, V] counts and masks, put back exactly afterwards, and per-request counts that stay right as
tokens arrive a few at a time."""

from __future__ import annotations

import random

import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.penalties import Penalties, SeenTokens
from pagoda.runtime.sampling.sampler import SamplingBatch, sample

V = 300


def dense_reference(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
    """Repetition over prompt and output, then frequency and presence over output counts."""
    out = logits.clone()
    for i, r in enumerate(reqs):
        p = r.params
        counts = torch.bincount(torch.tensor(r.output_token_ids, dtype=torch.long), minlength=V)
        seen = counts > 0
        seen[r.prompt_token_ids] = True
        x = out[i]
        rep = torch.tensor(p.repetition_penalty)
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
        out[i] = x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
    return out


def make_requests(seed: int) -> list[Request]:
    rng = random.Random(seed)
    params = [
        SamplingParams(frequency_penalty=0.7, presence_penalty=0.4),
        SamplingParams(temperature=0.8),  # no penalty: untouched
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.5, presence_penalty=1.5),
    ]
    reqs = []
    for i, p in enumerate(params):
        prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 40))]
        r = Request(f"r{i}", prompt, p)
        for _ in range(rng.randrange(0, 60)):  # repeats, and tokens of the prompt
            r.append_token(rng.choice(prompt) if rng.random() < 0.3 else rng.randrange(V // 4))
        reqs.append(r)
    return reqs


def test_same_logits_as_the_dense_formulas_and_restored_exactly():
    for seed in range(5):
        reqs = make_requests(seed)
        logits = torch.randn(len(reqs), V) * 3
        before = logits.clone()
        restore = Penalties.build(reqs).apply(logits)
        torch.testing.assert_close(logits, dense_reference(before, reqs), rtol=0, atol=1e-6)
        restore()
        assert torch.equal(logits, before)


def test_counts_follow_tokens_arriving_a_few_at_a_time():
    rng = random.Random(1)
    r = Request("r", [3, 4, 5], SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5))
    for _ in range(30):
        for _ in range(rng.randrange(0, 4)):
            r.append_token(rng.randrange(12))
        b = Penalties.build([r])
        got = dict(zip(b.out_tokens.tolist(), b.out_counts.tolist()))
        want = torch.bincount(torch.tensor(r.output_token_ids or [0]), minlength=12)
        want = {t: float(c) for t, c in enumerate(want.tolist()) if c and r.output_token_ids}
        assert got == want
        assert sorted(b.rep_tokens.tolist()) == sorted({3, 4, 5, *r.output_token_ids})
    r.token_ids = r.token_ids[:5]  # an output that got shorter is counted afresh
    b = Penalties.build([r])
    assert sorted(b.out_tokens.tolist()) == sorted(set(r.output_token_ids))


def test_seen_tokens_without_repetition_keep_no_prompt():
    s = SeenTokens([1, 2, 3], repetition=False)
    s.update([1, 2, 3, 9, 9], 3)
    assert s.n_rep == 0 and s.tok[: s.n].tolist() == [9] and s.cnt[: s.n].tolist() == [2.0]


def test_sample_penalises_the_choice_not_the_logprobs_nor_the_callers_logits():
    """Greedy with a strong presence penalty moves off the generated token; the logprobs are
    the model's (before penalties), and the float32 logits passed in are left as they were."""
    logits = torch.full((1, V), -5.0)
    logits[0, 7], logits[0, 8] = 4.0, 3.0  # 4 - 2 < 3
    r = Request("r", [1], SamplingParams(temperature=0, presence_penalty=2.0, logprobs=2))
    r.append_token(7)
    before = logits.clone()
    out = sample(logits, SamplingBatch.build([r], V, torch.device("cpu")))
    assert out.token_ids.tolist() == [8]
    assert torch.equal(logits, before)
    lp = before.log_softmax(-1)
    assert torch.allclose(out.logprobs, lp[0, 8:9]) and out.top_ids[0].tolist() == [7, 8]


def test_engine_repetition_penalty_matches_transformers(tmp_path):
    """Steps of a batch reuse their sampling batch and bring only the penalties up to date: greedy
    decoding with a repetition penalty picks transformers' tokens, request by request."""
    from hf_oracle import make_tiny_llama
    from pagoda.runtime import LLM

    model = make_tiny_llama(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    prompts = [[(7 * i + 3 * k) % 300 for i in range(n)] for k, n in ((1, 5), (2, 9), (3, 14))]
    params = SamplingParams(temperature=0, repetition_penalty=1.8, max_tokens=24, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, out in zip(prompts, outs):
        ref = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, repetition_penalty=1.8,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        assert out.outputs[0].token_ids == ref[0, len(prompt) :].tolist()
