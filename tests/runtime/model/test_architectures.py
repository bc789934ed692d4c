"""Every architecture against transformers, token for token, on tiny random checkpoints.

Each case writes a small random model with transformers itself (no downloads), loads the
directory, and generates greedily in float32 (transformers' own dtype here: the comparison is
of the same arithmetic, not of bf16 roundings) with prompts chunked into small steps, a warm
prefix cache on the second pass, several prompts sharing steps, and, for some cases, a KV pool
so small that requests are preempted. The reference is a plain greedy loop over
`model(ids).logits[0, -1]` with no cache. Logits must agree within 1e-3 at every step.
"""

from __future__ import annotations

import pytest
from arch_cases import CASES, PREEMPTING, build, check, generate
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return request.param, *build(request.param, tmp_path_factory.mktemp(request.param))


def test_greedy_matches_transformers_chunked_cached_and_batched(case):
    name, loaded, prompts, reference, engine_args = case
    llm = LLM(
        loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_batched_tokens=16,
        max_num_seqs=4, block_size=16, **engine_args,
    )  # fmt: skip
    cold = generate(llm, prompts)  # chunked into 16-token steps, all three prompts together
    warm = generate(llm, prompts[::-1])[::-1]  # the shared prefix's blocks from the cache
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cold")
        check(warm[i], want, f"{name}: prompt {i}, warm")
    assert llm.engine.kv.prefix_hits > 0
    llm.engine.check_integrity()


def test_greedy_matches_transformers_under_preemption(case):
    name, loaded, prompts, reference, engine_args = case
    if name not in PREEMPTING:
        pytest.skip("preemption is checked on a few architectures")
    llm = LLM(
        loaded=loaded, dtype="float32", num_blocks_override=7, block_size=16, max_model_len=96,
        max_num_batched_tokens=16, max_num_seqs=3, **engine_args,
    )  # fmt: skip
    got = generate(llm, prompts)
    assert llm.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, preempted")
    llm.engine.check_integrity()


@pytest.mark.parametrize("name", ["gemma3-window", "qwen3moe-top8-d128"])
def test_bf16_greedy_does_not_depend_on_cache_chunks_or_batch(tmp_path, name):
    """In bfloat16 (the CPU default where bf16 is native), the window layers' and the experts'
    rows keep their bits: a prompt alone on a plain engine and among others, chunked, on a warm
    cache give the same tokens."""
    from pagoda.runtime.model.linear import bf16_rows_invariant

    if not bf16_rows_invariant():
        pytest.skip("bf16 GEMMs on AMX round a row by the row count (docs/runtime.md)")
    loaded, prompts, _, engine_args = build(name, tmp_path)
    common = dict(loaded=loaded, dtype="bfloat16", kv_cache_memory=16 << 20, **engine_args)
    plain = LLM(**common, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [generate(plain, [p])[0][0] for p in prompts]
    busy = LLM(**common, max_num_batched_tokens=16, max_num_seqs=4)
    for run in ("cold", "warm"):
        assert [t for t, _ in generate(busy, prompts)] == alone, run
