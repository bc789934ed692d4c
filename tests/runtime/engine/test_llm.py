"""Offline API end to end on the embedded model: outputs, sampling options, bad input."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(smol):
    return LLM(loaded=smol, max_model_len=512, kv_cache_memory=48 << 20, max_num_batched_tokens=256)


def test_chat_answers(llm):
    (out,) = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=12),
    )
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason in ("stop", "length")


def test_length_finish_and_token_ids(llm):
    (out,) = llm.generate(
        "Once upon a time", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )
    o = out.outputs[0]
    assert len(o.token_ids) == 5 and o.finish_reason == "length"
    assert o.text == llm.tokenizer.decode(o.token_ids)


def test_seed_reproducible(llm):
    p = SamplingParams(temperature=1.0, max_tokens=16, seed=42, ignore_eos=True)
    a = llm.generate(["The sea is", "Cats are"], p)
    b = llm.generate(["Cats are", "The sea is"], p)  # different batch order
    assert a[0].outputs[0].token_ids == b[1].outputs[0].token_ids
    c = llm.generate(
        "The sea is", SamplingParams(temperature=1.0, max_tokens=16, seed=43, ignore_eos=True)
    )
    assert c[0].outputs[0].token_ids != a[0].outputs[0].token_ids


def test_stop_strings_and_stop_token_ids(llm):
    (free,) = llm.generate(
        "Count: one, two, three,", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    )
    text = free.outputs[0].text
    stop = text.strip().split()[1]  # a word the model does produce
    (out,) = llm.generate(
        "Count: one, two, three,", SamplingParams(temperature=0, max_tokens=20, stop=[stop])
    )
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert stop not in out.outputs[0].text and text.startswith(out.outputs[0].text)
    tok = free.outputs[0].token_ids[2]
    (out,) = llm.generate(
        "Count: one, two, three,",
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[tok]),
    )
    assert out.outputs[0].token_ids == free.outputs[0].token_ids[:3]
    assert out.outputs[0].stop_reason == tok


def test_n_samples_share_prompt_blocks(smol):
    llm = LLM(loaded=smol, max_model_len=512, kv_cache_memory=48 << 20, enable_prefix_caching=False)
    prompt = list(range(1000, 1100))  # 100 tokens: 6 full blocks
    (out,) = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8)
    )
    assert len(out.outputs) == 3 and [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    # samples 2 and 3 reused the 96 cached prompt tokens of sample 1 although caching is off
    assert llm.engine.kv.prefix_hits == 2 * 96
    llm.engine.check_integrity()


def test_logprobs(llm):
    (out,) = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=3, logprobs=2))
    lps = out.outputs[0].logprobs
    assert len(lps) == 3
    for lp, tok in zip(lps, out.outputs[0].token_ids):  # vLLM's {token id: Logprob}
        assert len(lp) == 2 and next(iter(lp)) == tok  # the sampled token first
        assert lp[tok].rank == 1 and lp[tok].logprob <= 0  # greedy picks the most likely


@pytest.mark.parametrize(
    "prompt,params,field",
    [
        ("", SamplingParams(), "prompt"),
        ("x " * 600, SamplingParams(), "max_model_len"),
        ({"prompt_token_ids": [10**9]}, SamplingParams(), "token ids"),
    ],
)
def test_bad_input_raises_and_engine_keeps_serving(llm, prompt, params, field):
    engine = llm.engine
    engine.add_request(
        "inflight",
        llm.tokenizer.encode("A long story:"),
        SamplingParams(max_tokens=6, ignore_eos=True),
    )
    with pytest.raises(ValueError, match=field):
        llm.generate(prompt, params)
    done = []
    while engine.has_unfinished_requests():
        done += [d for d in engine.step() if d.finished]
    assert [d.request_id for d in done] == ["inflight"] and done[0].num_output_tokens == 6
    engine.check_integrity()


def test_abort_frees_blocks(llm):
    engine = llm.engine
    engine.add_request("a", list(range(200, 300)), SamplingParams(max_tokens=50))
    engine.step()
    assert engine.stats().num_free_blocks < engine.stats().num_blocks
    engine.abort_request("a")
    assert engine.stats().num_free_blocks == engine.stats().num_blocks
    assert not engine.has_unfinished_requests()


def test_kv_manager_records_peak_usage(llm):
    peak = llm.engine.kv.peak
    peak.reset()
    llm.generate(["The sea is", "Cats are"], SamplingParams(temperature=0, max_tokens=20))
    assert 0 < peak.blocks <= llm.engine.kv.num_blocks
    assert 0 < peak.tokens <= peak.slots and peak.slots % llm.config.cache.block_size == 0


def test_max_model_len_past_the_models_context_is_refused(smol):
    """As vLLM's LLM (and `pagoda serve`): RoPE past max_position_embeddings is untrained."""
    context = smol.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"max_model_len {context + 1} is more than the model's"):
        LLM(loaded=smol, max_model_len=context + 1, kv_cache_memory=8 << 20)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_row_with_non_finite_logits_ends_its_request_with_an_error(llm, temperature):
    """One request's logits turn NaN at its third token (poisoned in place by the runner's
    logits hook, then sampled by the real sampler): it ends with finish reason "error" and
    the two tokens it had; the others in the same batch give the tokens they give alone."""
    prompts = [{"prompt_token_ids": ids} for ids in ([1, 504, 3295], [2, 17, 9, 80], [7, 23])]
    p = SamplingParams(temperature=temperature, seed=3, max_tokens=6, ignore_eos=True)
    clean = llm.generate(prompts, p)
    bad = [2, 17, 9, 80]

    def poison(reqs, logits):
        for i, r in enumerate(reqs):
            if r.prompt_token_ids == bad and r.num_output_tokens == 2:
                with torch.inference_mode():  # the forward's output is an inference tensor
                    logits[i] = float("nan")

    llm.engine.runner.logits_hook = poison
    try:
        out = llm.generate(prompts, p)
    finally:
        llm.engine.runner.logits_hook = None
    failed = out[1].outputs[0]
    assert failed.finish_reason == "error"
    assert failed.token_ids == clean[1].outputs[0].token_ids[:2]
    for i in (0, 2):
        assert out[i].outputs[0].token_ids == clean[i].outputs[0].token_ids
        assert out[i].outputs[0].finish_reason == "length"
    llm.engine.check_integrity()  # the failed request's blocks went back to the pool
    assert not llm.engine.has_unfinished_requests()
