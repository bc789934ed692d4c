"""ModelRunner input preparation: which token each row carries and which rows sample.

One-token rows go through a fast path, and a one-token row is not always a decode: a prompt
chunked down to one token by the step budget is one too, and it must carry the token at its
position (not the request's last one) and must not sample until its prompt is done."""

from __future__ import annotations

import pytest
from pagoda.runtime import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_one_token_prefill_chunks_beside_decodes(smol):
    common = dict(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    prompt = list(range(100, 112))
    want = LLM(**common).generate([{"prompt_token_ids": prompt}], GREEDY)[0].outputs[0].token_ids

    llm = LLM(**common, max_num_seqs=4, max_num_batched_tokens=4, enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"d{i}", [7 + i, 8, 9], params)
    while any(r.num_computed_tokens == 0 for r in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()
    engine.add_request("long", prompt, GREEDY)
    got, one_token_chunks = [], 0
    while "long" in engine.outputs:
        long_req = engine.scheduler.requests.get("long")
        before = long_req.num_computed_tokens if long_req else None
        out = engine.step()
        if long_req is not None and before < len(prompt) - 1:
            one_token_chunks += long_req.num_computed_tokens - before == 1
        got += [t for o in out if o.request_id == "long" for t in o.new_token_ids]
    assert one_token_chunks >= len(prompt) - 2  # the budget left the prompt one token per step
    assert got == want
    engine.check_integrity()


def _head_llm(smol):
    """The embedded model in float32 (its LM head on qgemm where it builds), forward spied on:
    the list gets True for each step whose tokens came from the LM head."""
    llm = LLM(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    runner = llm.engine.runner
    if not runner.model.lm_head.fuses_sampling:
        pytest.skip("no LM head that samples here (qgemm needs AVX2 + FMA and a compiler)")
    calls: list[bool] = []
    forward = runner.model.forward

    def spy(*args, **kwargs):
        calls.append(args[-1] is not None)  # head sampling
        return forward(*args, **kwargs)

    runner.model.forward = spy
    return llm, calls


PROMPTS = ["The capital of France is", "Write a haiku about autumn leaves falling"]


def test_an_all_greedy_step_takes_its_tokens_from_the_lm_head(smol):
    """Where the LM head samples (float32 over GGUF blocks: `qgemm`), a step whose rows read
    no logits gets its tokens from it, without writing logits; the tokens are those of the
    logits path (taken when a row asks logprobs or filters, or the logits are observed)."""
    llm, calls = _head_llm(smol)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    fused = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert calls and all(calls)

    calls.clear()
    with_lp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    outs = llm.generate(PROMPTS, [params, with_lp])
    assert [o.outputs[0].token_ids for o in outs] == fused and not any(calls)

    calls.clear()
    llm.engine.runner.logits_hook = lambda reqs, logits: None
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == fused
    assert not any(calls)
    llm.engine.check_integrity()


def test_a_seeded_row_draws_the_same_tokens_whether_the_head_samples_or_not(smol):
    """Sampled rows too: the LM head draws them (no logits written) when no row filters or
    reads the logits; otherwise the logits are written and the same code draws the unfiltered
    rows from them, so a seeded request's tokens do not depend on its batch-mates."""
    llm, calls = _head_llm(smol)
    seeded = [
        SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=s) for s in (1, 2)
    ]
    fused = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, seeded)]
    assert calls and all(calls)
    other = llm.generate(PROMPTS[:1], seeded[1:])[0].outputs[0].token_ids
    assert fused[0] != other  # another seed, other tokens

    calls.clear()
    top_p = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, top_p=0.9, seed=5)
    outs = llm.generate(PROMPTS, [seeded[0], top_p])
    assert outs[0].outputs[0].token_ids == fused[0] and not any(calls)

    calls.clear()
    lp = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=2, logprobs=1)
    outs = llm.generate(PROMPTS, [seeded[0], lp])
    assert [o.outputs[0].token_ids for o in outs] == fused and not any(calls)

    calls.clear()
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    mixed = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, [greedy, seeded[1]])]
    assert mixed[1] == fused[1] and all(calls)
    llm.engine.runner.logits_hook = lambda reqs, logits: None
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, [greedy, seeded[1]])] == mixed
    llm.engine.check_integrity()
