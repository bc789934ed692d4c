"""Emitting a step's outputs during the next step's forward (on by default on CUDA) changes when
outputs arrive, never what they are: forced on here, on the CPU, against the same engine with it
off — texts, tokens, stop strings, logprobs, n > 1, the final flush and aborts in between."""

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


@pytest.fixture(scope="module")
def engines(smol):
    common = dict(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    plain, overlapped = LLM(**common), LLM(**common)
    assert not plain.engine.overlap_outputs  # the CPU default
    overlapped.engine.overlap_outputs = True
    return plain, overlapped


def test_overlapped_outputs_equal_plain_ones(engines):
    plain, overlapped = engines
    want = summary(plain.generate(PROMPTS, PARAMS))
    assert summary(overlapped.generate(PROMPTS, PARAMS)) == want
    assert want[1][0][2] == "stop" or len(want[1][0][1]) == 40
    overlapped.engine.check_integrity()


def test_outputs_arrive_one_step_later_and_are_flushed(engines):
    _, llm = engines
    engine = llm.engine
    engine.add_request("a", [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=3))
    assert engine.step() == []  # prefill ran; its token is emitted with the next step
    seen = []
    while engine.has_unfinished_requests():
        seen += engine.step()
    assert [len(o.new_token_ids) for o in seen] == [1, 1, 1]
    assert seen[-1].finished and seen[-1].finish_reason == "length"
    assert not engine.scheduler.has_unfinished() and engine.step() == []


def test_abort_between_steps_drops_pending_outputs(engines):
    _, llm = engines
    engine = llm.engine
    for rid in ("keep", "drop"):
        engine.add_request(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=6))
    engine.step()
    engine.step()
    engine.abort_request("drop")
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert {o.request_id for o in outs} == {"keep"}
    assert sum(len(o.new_token_ids) for o in outs) == 6 - 1  # the first came with step 2
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
