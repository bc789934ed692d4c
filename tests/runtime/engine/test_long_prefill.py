"""A long prompt beside streaming requests (`long_prefill_token_threshold`) on the embedded
model: its prefill is cut into small chunks while the others decode, and greedy output is the
same tokens as without the cap (chunk boundaries never change a token: docs/runtime.md)."""

from __future__ import annotations

from pagoda.runtime import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
STREAM = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _run(smol, corpus_ids, threshold: int) -> tuple[dict[str, list[int]], list[int]]:
    """Two short streams, then a 300-token prompt; (tokens by request, the long prompt's chunk
    in each step it was scheduled)."""
    llm = LLM(loaded=smol, dtype="float32", max_model_len=512, kv_cache_memory=32 << 20,
              max_num_batched_tokens=128, long_prefill_token_threshold=threshold)  # fmt: skip
    eng = llm.engine
    chunks: list[int] = []
    schedule = eng.scheduler.schedule

    def spy():
        out = schedule()
        chunks.extend(s.num_new_tokens for s in out.scheduled if s.request.request_id == "long")
        return out

    eng.scheduler.schedule = spy
    eng.add_request("a", corpus_ids[:9], STREAM)
    eng.add_request("b", corpus_ids[40:52], STREAM)
    tokens: dict[str, list[int]] = {}
    for o in eng.step():  # both prefilled; they decode from now on
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    eng.add_request("long", corpus_ids[100:400], GREEDY)
    while eng.has_unfinished_requests():
        for o in eng.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    eng.check_integrity()
    return tokens, chunks


def test_long_prompt_is_chunked_beside_streams_with_the_same_greedy_tokens(smol, corpus_ids):
    plain, plain_chunks = _run(smol, corpus_ids, 0)
    capped, capped_chunks = _run(smol, corpus_ids, 32)
    assert plain_chunks[0] == 126  # the budget less the two decodes
    # 32 a step while the streams decode (they outlast the prefill), then its 5 decodes
    assert capped_chunks == [32] * 9 + [12] + [1] * 5
    assert capped == plain and [len(capped[r]) for r in ("a", "b", "long")] == [16, 16, 6]
