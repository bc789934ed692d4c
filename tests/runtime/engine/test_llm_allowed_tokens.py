"""allowed_token_ids through the offline LLM and the embedded model: every generated token is
one of the listed ids, and a batch-mate that does not restrict keeps its greedy tokens."""

from __future__ import annotations

import pytest
from pagoda.runtime import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(smol):
    return LLM(loaded=smol, max_model_len=256, kv_cache_memory=24 << 20)


def test_greedy_tokens_are_allowed_ones_and_batch_mates_unchanged(llm):
    tok = llm.get_tokenizer()
    allowed = sorted({t for w in (" red", " green", " blue", ",", " and") for t in
                      tok.encode(w, add_special_tokens=False)})  # fmt: skip
    free = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = ["My favourite colours are", "The capital of France is"]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, free)]
    held = free.clone(allowed_token_ids=allowed)
    outs = llm.generate(prompts, [held, free])
    got = outs[0].outputs[0].token_ids
    assert len(got) == 8 and set(got) <= set(allowed)
    assert got != alone[0]  # it did restrict: the free output uses other tokens
    assert outs[1].outputs[0].token_ids == alone[1]
    sampled = llm.generate(prompts[:1], held.clone(temperature=1.0, seed=5))[0]
    assert set(sampled.outputs[0].token_ids) <= set(allowed)


def test_bad_values_are_refused(llm):
    vocab = len(llm.get_tokenizer())
    for bad in ([], [vocab + 5], [-1]):
        with pytest.raises(ValueError, match="allowed_token_ids"):
            llm.generate("Hi", SamplingParams(max_tokens=1, allowed_token_ids=bad))
    p = SamplingParams(max_tokens=1)
    p.allowed_token_ids = []  # mutable, checked on receipt
    with pytest.raises(ValueError, match="allowed_token_ids"):
        llm.generate("Hi", p)


def test_min_tokens_with_stop_ids_covering_the_vocabulary_is_refused(llm):
    """min_tokens bans the stop tokens; stop_token_ids that with EOS cover the whole vocabulary
    left no finite logit and token 0 (a banned stop token) was drawn. Refused at the request
    (the offline LLM and `EngineInfo.validate`, the server's check); one token left is served."""
    from pagoda.runtime.engine.info import EngineInfo
    from pagoda.runtime.sampling.params import ParamError

    mc = llm.engine.model_config
    vocab, eos = mc.vocab_size, set(mc.eos_token_ids)
    free = 100  # not EOS: the one token the request below may generate
    assert free not in eos
    stops = [t for t in range(vocab) if t not in eos and t != free]
    p = SamplingParams(temperature=0, max_tokens=2, min_tokens=2, stop_token_ids=stops)
    out = llm.generate("Hi", p)[0].outputs[0]
    assert out.token_ids[0] == free
    info = EngineInfo("m", 256, vocab, llm.engine.tokenizer)
    for bad in (p.clone(stop_token_ids=[*stops, free]),
                p.clone(stop_token_ids=[*stops, free, *eos], ignore_eos=True)):  # fmt: skip
        with pytest.raises(ValueError, match="min_tokens"):
            llm.generate("Hi", bad)
        with pytest.raises(ParamError) as e:
            info.validate([1, 2], bad)
        assert e.value.field == "stop_token_ids"
    info.validate([1, 2], p.clone(stop_token_ids=[*stops, free], ignore_eos=True))
