"""Random traffic against a small KV pool: preemption, prefix sharing, n > 1, aborts and stop
conditions all interleave. Every request must finish (or be aborted) with well-formed output,
and the block pool's integrity check must hold after every step."""

from __future__ import annotations

import random

import pytest
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    make_tiny_llama(path)
    return load_model(str(path))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_random_traffic_keeps_the_cache_consistent(tiny, seed, caching, async_scheduling):
    rng = random.Random(seed)
    rng_min = random.Random(seed + 100)  # min_tokens: a stream of its own (the traffic stays)
    llm = LLM(
        loaded=tiny,
        dtype="float32",
        num_blocks_override=24,
        block_size=8,
        max_num_seqs=6,
        max_num_batched_tokens=40,
        max_model_len=120,
        enable_prefix_caching=caching,
        async_scheduling=async_scheduling,
    )
    engine = llm.engine
    shared = [rng.randrange(3, 300) for _ in range(20)]
    live: dict[str, SamplingParams] = {}
    got: dict[tuple[str, int], list[int]] = {}
    finished: dict[tuple[str, int], str] = {}
    for step in range(400):
        if rng.random() < 0.3 and len(live) < 10:
            rid = f"r{step}"
            prompt = shared[: rng.randrange(0, 20)] + [
                rng.randrange(3, 300) for _ in range(rng.randrange(1, 40))
            ]
            max_tokens = rng.randrange(1, 30)
            params = SamplingParams(
                n=rng.choice([1, 1, 2, 3]),
                max_tokens=max_tokens,
                min_tokens=rng_min.choice([0, 0, rng_min.randrange(0, max_tokens + 1)]),
                temperature=rng.choice([0.0, 0.8]),
                top_k=rng.choice([-1, 5]),
                seed=rng.choice([None, 7]),
                stop_token_ids=rng.choice([(), (rng.randrange(3, 300),)]),
                ignore_eos=rng.random() < 0.5,
                logprobs=rng.choice([None, 2]),
            )
            engine.add_request(rid, prompt, params)
            live[rid] = params
        if live and rng.random() < 0.05:
            rid = rng.choice(sorted(live))
            engine.abort_request(rid)
            for i in range(live.pop(rid).n):
                finished.setdefault((rid, i), "abort")
        for d in engine.step():
            key = (d.request_id, d.index)
            assert key not in finished, "output after finish"
            got.setdefault(key, []).extend(d.new_token_ids)
            assert len(d.new_logprobs) == (
                len(d.new_token_ids) if live[d.request_id].logprobs is not None else 0
            )
            if d.finished:
                finished[key] = d.finish_reason
                p = live[d.request_id]
                assert len(got[key]) == d.num_output_tokens <= p.max_tokens
                stops = {*p.stop_token_ids, *(() if p.ignore_eos else (2,))}  # EOS: 2
                assert not stops & set(got[key][: p.min_tokens])  # min_tokens held them back
                if all((d.request_id, i) in finished for i in range(live[d.request_id].n)):
                    live.pop(d.request_id)
        engine.check_integrity()
        if step > 300 and not live:
            break
    while engine.has_unfinished_requests():
        for d in engine.step():
            finished[(d.request_id, d.index)] = d.finish_reason
        engine.check_integrity()
    assert set(finished.values()) <= {"stop", "length", "abort"}
    assert engine.stats().num_free_blocks == engine.stats().num_blocks
    assert engine.scheduler.num_preemptions > 0  # the pool is small enough to force them
