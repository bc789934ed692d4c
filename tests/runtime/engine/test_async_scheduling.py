"""Async scheduling (step N+1 launched before step N is read back) changes when tokens are read,
never which: on the CPU, against the same engine without it — greedy, stop strings, seeded
sampling with n > 1 and logprobs, penalties (which run synchronously), length limits, aborts
and preemption. The random-traffic test (test_stress.py) runs it too."""

from __future__ import annotations

import pytest
from engine_testlib import summary
from pagoda.runtime import LLM, SamplingParams

PROMPTS = ["The capital of France is", "Write a haiku about rivers.", "1, 2, 3, 4,"]
PARAMS = [
    SamplingParams(temperature=0, max_tokens=12),
    SamplingParams(temperature=0, max_tokens=40, stop=[".", "\n"]),
    SamplingParams(temperature=0.8, max_tokens=10, n=2, seed=7, logprobs=2),
]


def _llm(smol, **kw) -> LLM:
    common = dict(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    return LLM(**{**common, **kw})


@pytest.fixture(scope="module")
def engines(smol):
    return _llm(smol), _llm(smol, async_scheduling=True)


def test_async_outputs_equal_sync_ones(engines):
    sync, async_ = engines
    assert not sync.engine.async_scheduling and async_.engine.async_scheduling
    want = summary(sync.generate(PROMPTS, PARAMS))
    assert summary(async_.generate(PROMPTS, PARAMS)) == want
    async_.engine.check_integrity()
    assert async_.engine.kv.num_free_blocks == async_.engine.kv.num_blocks


def test_penalized_requests_equal_sync_ones(engines):
    """Penalties count the tokens so far: while one runs, steps do not overlap."""
    sync, async_ = engines
    prompts = [*PROMPTS, "Name three colours:"]
    params = [*PARAMS, SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.5)]
    want = summary(sync.generate(prompts, params))
    assert summary(async_.generate(prompts, params)) == want


def test_min_tokens_lifts_its_mask_at_the_same_token(engines):
    """min_tokens counts the token in flight: a request whose EOS comes as token k (0-based)
    ends there with min_tokens = k, and goes on with k + 1, with and without async scheduling
    (a mask lifted one token late or early changes the first case or the second)."""
    prompt = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    sync, async_ = engines
    free = sync.generate(prompt, SamplingParams(temperature=0, max_tokens=60))[0].outputs[0]
    assert free.finish_reason == "stop" and free.stop_reason is None  # EOS
    k = len(free.token_ids) - 1
    for llm in engines:
        met = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=60, min_tokens=k))
        assert met[0].outputs[0].token_ids == free.token_ids
        held = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=k + 8,
                                                   min_tokens=k + 1))[0].outputs[0]  # fmt: skip
        assert held.token_ids[:k] == free.token_ids[:k] and len(held.token_ids) > k + 1
        assert free.token_ids[k] not in held.token_ids[: k + 1]
    params = [SamplingParams(temperature=0.8, max_tokens=k + 8, n=3, seed=2, min_tokens=k + 2),
              SamplingParams(temperature=0, max_tokens=30, min_tokens=6, stop=[".", "\n"])]  # fmt: skip
    prompts = [prompt, PROMPTS[0]]
    assert summary(async_.generate(prompts, params)) == summary(sync.generate(prompts, params))


def _rows_per_step(engine) -> list[int]:
    rows: list[int] = []
    engine.runner.logits_hook = lambda reqs, logits: rows.append(len(reqs))
    return rows


def test_next_step_launches_before_the_last_is_read(engines):
    _, llm = engines
    engine = llm.engine
    rows = _rows_per_step(engine)
    try:
        engine.add_request("a", [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=3))
        assert engine.step() == []  # the prefill is launched; nothing has been read back yet
        assert engine.scheduler.requests["a"].num_pending == 1
        seen = engine.step()  # launches the first decode, reads the prefill's token
        assert [len(o.new_token_ids) for o in seen] == [1]
        while engine.has_unfinished_requests():
            seen += engine.step()
    finally:
        engine.runner.logits_hook = None
    assert sum(len(o.new_token_ids) for o in seen) == 3 and seen[-1].finish_reason == "length"
    assert rows == [1, 1, 1]  # the length limit is known ahead: no row is computed for nothing
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_a_stop_costs_one_dropped_row(engines):
    sync, llm = engines
    first = sync.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=4))[0]
    stop_at = first.outputs[0].token_ids[1]  # greedy: the second token stops the request
    rows = _rows_per_step(llm.engine)
    try:
        params = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_at])
        out = llm.generate([PROMPTS[0]], params)[0].outputs[0]
    finally:
        llm.engine.runner.logits_hook = None
    assert out.token_ids == first.outputs[0].token_ids[:2] and out.finish_reason == "stop"
    assert rows == [1, 1, 1]  # the third row ran before the stop was read, and was dropped


def test_abort_while_in_flight_drops_its_token(engines):
    _, llm = engines
    engine = llm.engine
    for rid in ("keep", "drop"):
        engine.add_request(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=6))
    outs = engine.step() + engine.step()
    assert engine.scheduler.requests["drop"].num_pending == 1
    engine.abort_request("drop")
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert sum(len(o.new_token_ids) for o in outs if o.request_id == "keep") == 6
    assert sum(len(o.new_token_ids) for o in outs if o.request_id == "drop") == 1
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_penalties_run_synchronously(engines):
    _, llm = engines
    engine = llm.engine
    engine.add_request("p", [5, 6, 7], SamplingParams(max_tokens=4, frequency_penalty=1.0))
    engine.add_request("q", [8, 9], SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    engine.step()
    req = engine.scheduler.requests["p"]
    assert req.num_pending == 1 and req.num_output_tokens == 1  # one in flight at a time
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine._penalized


@pytest.mark.slow
def test_preemption_in_flight_matches_sync(smol):
    """A pool so small that requests are preempted while their step is in flight."""
    kw = dict(num_blocks_override=6, block_size=16, max_num_seqs=4, max_model_len=96)
    prompts = [f"Count from {i}: {i}, {i + 1}," for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    sync, async_ = _llm(smol, **kw), _llm(smol, async_scheduling=True, **kw)
    want = summary(sync.generate(prompts, params))
    assert summary(async_.generate(prompts, params)) == want
    assert async_.engine.scheduler.num_preemptions > 0
    async_.engine.check_integrity()


def test_a_row_without_a_finite_logit_ends_its_request_as_in_sync(engines):
    """A request whose logits turn NaN (poisoned by the runner's hook) gets -1 for a token while
    its next step is in flight already, fed that -1 from the device: that input is clamped to a
    valid id, the step's row dropped at its readback; outputs equal the synchronous engine's."""
    import torch

    bad = [2, 17, 9, 80]
    seen: dict[str, int] = {}  # the bad request's sampling steps (its output lags when async)

    def poison(reqs, logits):
        for i, r in enumerate(reqs):
            if r.prompt_token_ids == bad:
                seen[r.request_id] = seen.get(r.request_id, 0) + 1
                if seen[r.request_id] == 4:
                    with torch.inference_mode():
                        logits[i] = float("nan")

    prompts = [{"prompt_token_ids": ids} for ids in ([1, 504, 3295], bad, [7, 23])]
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    got = []
    for llm in engines:
        seen.clear()
        llm.engine.runner.logits_hook = poison
        try:
            got.append(summary(llm.generate(prompts, p)))
        finally:
            llm.engine.runner.logits_hook = None
        llm.engine.check_integrity()
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    assert got[0] == got[1]
    assert [c[0][2] for c in got[1]] == ["length", "error", "length"]
    assert len(got[1][1][0][1]) == 3  # the tokens before its logits turned
    outs = engines[1].generate(prompts, p)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "length", "length"]
