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


def test_an_all_greedy_step_takes_its_tokens_from_the_lm_head(smol):
    """Where the LM head fuses argmax (float32 over GGUF blocks: `qgemm`), a step whose rows are
    all greedy and read no logits gets its tokens from it, without writing logits; the tokens
    are those of the logits path (taken when a row samples, asks logprobs, or is observed)."""
    llm = LLM(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    runner = llm.engine.runner
    if not runner.model.lm_head.fuses_argmax:
        pytest.skip("no fused-argmax LM head here (qgemm needs AVX2 + FMA and a compiler)")
    calls: list[bool] = []
    forward = runner.model.forward

    def spy(*args, **kwargs):
        calls.append(args[-1])  # greedy
        return forward(*args, **kwargs)

    runner.model.forward = spy
    prompts = ["The capital of France is", "Write a haiku about autumn leaves falling"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert calls and all(calls)

    calls.clear()
    with_lp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    outs = llm.generate(prompts, [params, with_lp])
    assert [o.outputs[0].token_ids for o in outs] == fused and not any(calls)

    calls.clear()
    runner.logits_observer = lambda reqs, logits: None
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == fused
    assert not any(calls)
    runner.logits_observer = None

    calls.clear()
    sampled = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, seed=1)
    outs = llm.generate(prompts, [params, sampled])
    assert outs[0].outputs[0].token_ids == fused[0] and not any(calls)
    llm.engine.check_integrity()
