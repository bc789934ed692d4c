"""Constrained requests in the engine, offline (`LLM`): outputs follow their grammar and are the
same whether they run alone or beside others, with or without async scheduling (which defers
their sampling until the in-flight step's tokens are read), preemption (the grammar state
follows the tokens, recomputed or not), prefix caching and chunked prefill; requests without a
constraint are untouched by constrained neighbours."""

from __future__ import annotations

import json

import jsonschema
import pytest
from engine_testlib import summary
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.structured.params import StructuredOutputsParams as Spec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
PROMPTS = [
    "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
    "<|im_start|>user\nPick a direction.<|im_end|>\n<|im_start|>assistant\n",
    "Write a haiku about rivers.",
]
PARAMS = [
    SamplingParams(temperature=0, max_tokens=60, structured_outputs=Spec(json=SCHEMA)),
    SamplingParams(temperature=0, max_tokens=12),
    SamplingParams(
        temperature=0.8,
        max_tokens=10,
        n=2,
        seed=7,
        logprobs=2,
        structured_outputs=Spec(choice=("left", "right", "straight on")),
    ),
    SamplingParams(
        temperature=0.9,
        max_tokens=40,
        seed=3,
        top_p=0.9,
        repetition_penalty=1.2,
        structured_outputs=Spec(regex=r"(\w+ ){2,6}\w+\."),
    ),
]


def _llm(smol, **kw) -> LLM:
    common = dict(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    return LLM(**{**common, **kw})


@pytest.fixture(scope="module")
def sync(smol):
    return _llm(smol)


@pytest.fixture(scope="module")
def reference(sync):
    return summary(sync.generate(PROMPTS, PARAMS))


def test_outputs_follow_their_grammar(reference):
    person = json.loads(reference[0][0][0])
    jsonschema.validate(person, SCHEMA)
    assert reference[0][0][2] == "stop"
    assert all(c[0] in ("left", "right", "straight on") for c in reference[2])
    assert all(len(c[4]) == len(c[1]) for c in reference[2])  # logprobs per token
    assert reference[3][0][0].endswith(".")


def test_alone_or_together_the_same(sync, reference):
    for i in (0, 1):
        assert summary(sync.generate(PROMPTS[i], PARAMS[i])) == [reference[i]]


@pytest.fixture(scope="module")
def small_async(smol):
    """Async scheduling over a pool so small that requests are preempted (recomputed)."""
    kw = dict(num_blocks_override=8, block_size=16, max_num_seqs=4, max_model_len=128)
    return _llm(smol, async_scheduling=True, **kw)


def test_async_scheduling_defers_constrained_sampling_same_outputs(small_async, reference):
    assert summary(small_async.generate(PROMPTS, PARAMS)) == reference
    small_async.engine.check_integrity()


def test_preemption_changes_nothing(small_async, sync):
    """Constrained requests preempted mid-output: the grammar state follows the tokens; the
    reference is the roomy engine (greedy output does not depend on the batch)."""
    prompts = [PROMPTS[0], PROMPTS[0].replace("person", "friend"), PROMPTS[2], PROMPTS[0]]
    params = [PARAMS[0], PARAMS[0], PARAMS[3], PARAMS[0]]
    want = summary(sync.generate(prompts, params))
    before = small_async.engine.scheduler.num_preemptions
    assert summary(small_async.generate(prompts, params)) == want
    assert small_async.engine.scheduler.num_preemptions > before
    for out in want[:2]:
        jsonschema.validate(json.loads(out[0][0]), SCHEMA)


def test_prefix_caching_and_chunked_prefill(smol, sync, corpus_ids):
    """Long shared prompts prefilled in 32-token chunks, the second reusing the first's blocks."""
    prefix = corpus_ids[:100]
    prompts = [[*prefix, 28, 198], [*prefix, 30, 198]]
    params = SamplingParams(temperature=0, max_tokens=30, structured_outputs=Spec(json=SCHEMA))
    want = summary(sync.generate(prompts, params))
    llm = _llm(smol, max_num_batched_tokens=32, max_num_seqs=4)
    assert summary(llm.generate(prompts, params)) == want
    assert llm.engine.kv.prefix_hits > 0
    for out in want:
        jsonschema.validate(json.loads(out[0][0]), SCHEMA)


def test_an_invalid_spec_fails_before_anything_runs(sync):
    bad = SamplingParams(structured_outputs=Spec(regex="(unclosed"))
    with pytest.raises(ValueError, match="regex"):
        sync.generate(["a", "b"], [PARAMS[1], bad])
    assert not sync.engine.has_unfinished_requests()
