"""Scheduler behaviour without a model: budgets, chunking, decodes-first, preemption, prefix reuse."""

from __future__ import annotations

from pagoda.runtime.config import SchedulerConfig
from pagoda.runtime.core.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.request import Request, RequestStatus
from pagoda.runtime.sampling.params import SamplingParams

BS = 4


def make(num_blocks=64, caching=True, **cfg) -> Scheduler:
    cfg.setdefault("max_num_batched_tokens", 16)
    cfg.setdefault("max_num_seqs", 8)
    # a clock at 0: the requests' arrival times (`req`'s t) are all recent
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(num_blocks, BS, caching), lambda: 0.0)


def req(rid: str, n: int, max_tokens: int = 4, start: int = 0, t: float = 0.0) -> Request:
    return Request(
        rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens), arrival_time=t
    )


def step(s: Scheduler, token: int = 7):
    """One engine iteration with a fake model that always samples `token`."""
    out = s.schedule()
    s.update_after_step(out)
    for sr in out.scheduled:
        r = sr.request
        if r.num_computed_tokens >= r.num_tokens:
            r.append_token(token)
            if r.check_stop_token():
                s.finish(r)
    s.kv.check_integrity()
    return out


def test_token_budget_and_chunked_prefill():
    s = make(max_num_batched_tokens=16)
    s.add_request(req("long", 40))
    sizes = []
    while s.requests["long"].num_output_tokens == 0:
        out = step(s)
        assert out.num_batched_tokens <= 16
        sizes.append(out.scheduled[0].num_new_tokens)
    assert sizes == [16, 16, 8]


def test_decodes_first_and_never_stalled_by_long_prompt():
    s = make(max_num_batched_tokens=16)
    s.add_request(req("short", 3, max_tokens=20, t=0.0))
    step(s)  # prefill of "short"; it now decodes
    s.add_request(req("long", 60, start=100, t=1.0))
    for _ in range(4):
        out = step(s)
        assert out.scheduled[0].request.request_id == "short"
        assert out.scheduled[0].num_new_tokens == 1 and out.num_decodes == 1
        assert out.scheduled[1].request.request_id == "long"
        assert out.scheduled[1].num_new_tokens == 15  # the rest of the budget


def test_without_chunking_prompts_run_whole():
    s = make(max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add_request(req("a", 20))
    s.add_request(req("b", 20, start=50))
    out = step(s)
    assert [x.num_new_tokens for x in out.scheduled] == [20]  # b does not fit beside a
    out = step(s)
    assert [x.num_new_tokens for x in out.scheduled] == [1, 20]


def test_max_num_seqs():
    s = make(max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(4):
        s.add_request(req(f"r{i}", 4, start=10 * i))
    out = step(s)
    assert len(out.scheduled) == 2 and s.num_waiting == 2


def test_preemption_recompute_and_resume():
    # 6 blocks of 4 tokens: two requests of 8 prompt tokens + 12 outputs cannot both fit.
    s = make(num_blocks=6, caching=False, max_num_batched_tokens=32)
    s.add_request(req("old", 8, max_tokens=12, t=0.0))
    s.add_request(req("new", 8, max_tokens=12, start=100, t=1.0))
    preempted = []
    for _ in range(200):
        if not s.has_unfinished():
            break
        out = step(s)
        preempted += [r.request_id for r in out.preempted]
    assert not s.has_unfinished()
    assert preempted and set(preempted) == {"new"}  # the most recently arrived goes first
    assert s.num_preemptions == len(preempted)
    assert s.kv.num_free_blocks == 6


def test_preempted_request_returns_to_front_of_queue():
    s = make(num_blocks=5, caching=False, max_num_batched_tokens=32)
    s.add_request(req("a", 8, max_tokens=10, t=0.0))
    s.add_request(req("b", 8, max_tokens=10, start=100, t=1.0))
    while not any(o.preempted for o in [step(s)]):
        pass
    s.add_request(req("c", 4, start=200, t=2.0))
    assert [r.request_id for r in s.waiting][:2] == ["b", "c"]
    assert s.requests["b"].status == RequestStatus.PREEMPTED
    assert s.requests["b"].num_computed_tokens == 0


def test_a_single_request_overtakes_bulk_sequences_that_fill_the_cache():
    """Sequences of a multi-sequence request (`bulk`) that outgrow the KV cache preempt each
    other, never a single-sequence request, which is admitted before the preempted ones."""
    s = make(num_blocks=8, caching=False, max_num_batched_tokens=32)
    for i in range(2):  # 8 + 16 tokens each: 6 blocks of 4, two cannot fit in 8
        bulk = req(f"bulk{i}", 8, max_tokens=16, start=100 * i, t=0.0)
        bulk.bulk = True
        s.add_request(bulk)
    while not any(o.preempted for o in [step(s)]):
        pass  # the cache is full: bulk1 went back to the queue
    s.add_request(req("single", 3, max_tokens=2, start=300, t=1.0))
    steps, preempted = 0, []
    while "single" in s.requests:
        out = step(s)
        preempted += [r.request_id for r in out.preempted]
        steps += 1
        assert steps < 6, [r.request_id for r in s.waiting]
    while s.has_unfinished():
        preempted += [r.request_id for r in step(s).preempted]
    assert "single" not in preempted
    assert s.kv.num_free_blocks == 8


def test_a_bulk_request_waits_for_single_ones_no_longer_than_the_cap():
    """Under a steady stream of single-sequence requests a waiting bulk sequence is admitted once
    it has waited `bulk_max_wait_s` (before, it yields to each new single request)."""
    now = [0.0]
    s = make(max_num_seqs=1, max_num_batched_tokens=32)
    s.clock = lambda: now[0]
    bulk = req("bulk", 4, max_tokens=2, t=0.0)
    bulk.bulk = True
    s.add_request(bulk)
    admitted, i = [], 0
    for now[0] in (10.0, s.bulk_max_wait_s + 1):
        for _ in range(12):
            if not any(not r.bulk for r in s.waiting):  # always a single request waiting
                s.add_request(req(f"single{i}", 4, max_tokens=2, start=10 * i, t=now[0]))
                i += 1
            admitted += [x.request.request_id for x in step(s).scheduled if x.request.bulk]
        assert bool(admitted) == (now[0] > s.bulk_max_wait_s), now[0]


def test_an_aged_bulk_sequence_is_preempted_in_arrival_order():
    """Past `bulk_max_wait_s` a running bulk sequence is no longer the first to be preempted: the
    single request that arrived after it is."""
    for now, first_preempted in ((10.0, "bulk"), (100.0, "single")):
        s = make(num_blocks=8, caching=False, max_num_batched_tokens=32)
        s.clock = lambda now=now: now
        bulk = req("bulk", 8, max_tokens=16, t=0.0)  # 6 blocks of 4 each: both cannot fit in 8
        bulk.bulk = True
        s.add_request(bulk)
        s.add_request(req("single", 8, max_tokens=16, start=100, t=1.0))
        while not (out := step(s)).preempted:
            pass
        assert [r.request_id for r in out.preempted] == [first_preempted], now


def test_prefix_reuse_skips_compute():
    s = make(max_num_batched_tokens=64)
    s.add_request(req("a", 18, max_tokens=1))
    step(s)
    assert "a" not in s.requests  # finished; its full blocks stay cached
    s.add_request(req("b", 18, max_tokens=1))  # same prompt
    out = step(s)
    # 4 full blocks of 4 are cached; the cache never covers the last token, so 16 are skipped.
    assert out.scheduled[0].num_new_tokens == 2
    assert s.kv.prefix_hits == 16 and s.kv.prefix_queries == 36


def test_prefix_reuse_within_one_step():
    s = make(max_num_batched_tokens=64)
    s.add_request(req("a", 12, max_tokens=1))
    s.add_request(req("b", 12, max_tokens=1))
    out = step(s)
    assert [x.num_new_tokens for x in out.scheduled] == [12, 4]
    assert s.kv.req_blocks == {}  # both finished


def test_abort_frees_blocks_at_once():
    s = make()
    s.add_request(req("a", 30, max_tokens=50))
    step(s)
    assert s.kv.num_free_blocks < 64
    s.abort("a")
    assert s.kv.num_free_blocks == 64 and not s.has_unfinished()
    s.kv.check_integrity()


def test_cache_only_ever_names_computed_blocks():
    """A victim preempted after being scheduled in the same step registered blocks whose K/V
    will never be written; they must leave the hash map, or a later hit would read garbage."""
    import random

    rng = random.Random(0)
    uncached_calls = []
    for trial in range(30):
        s = make(num_blocks=10, caching=True, max_num_batched_tokens=24)
        real_free = s.kv.free

        def spy(r, uncache_this_step=False, _free=real_free):
            uncached_calls.append(uncache_this_step)
            _free(r, uncache_this_step=uncache_this_step)

        s.kv.free = spy
        computed: set[bytes] = set()
        for i in range(6):  # arrival times out of insertion order
            s.add_request(req(f"r{i}", rng.randint(2, 9), 14, start=100 * i, t=rng.random()))
        for _ in range(300):
            if not s.has_unfinished():
                break
            out = s.schedule()
            s.update_after_step(out)
            for sr in out.scheduled:
                r = sr.request
                computed.update(r.block_hashes[: r.num_computed_tokens // BS])
                if r.num_computed_tokens >= r.num_tokens:
                    r.append_token(rng.randint(0, 1000))
                    if r.check_stop_token():
                        s.finish(r)
            assert set(s.kv.pool.cached) <= computed, (
                f"trial {trial}: cache names an uncomputed block"
            )
            s.kv.check_integrity()
        assert not s.has_unfinished()
    assert any(uncached_calls), "no scheduled victim was ever preempted: the scenario is too easy"


def test_prompt_logprob_chunks_share_a_capped_room(monkeypatch):
    """Chunks of requests asking prompt logprobs (each token a vocabulary-wide row of logits)
    add up to at most PROMPT_LOGPROB_ROWS a step; other requests fill the rest of the budget.
    Without chunked prefill nothing can be cut: the whole prompt runs."""
    from pagoda.runtime.core import scheduler

    monkeypatch.setattr(scheduler, "PROMPT_LOGPROB_ROWS", 6)
    s = make(max_num_batched_tokens=16)
    scored = SamplingParams(max_tokens=4, prompt_logprobs=1)
    s.add_request(Request("a", list(range(20)), scored, arrival_time=0.0))
    s.add_request(req("plain", 20, start=200, t=1.0))
    s.add_request(Request("b", list(range(100, 120)), scored, arrival_time=2.0))
    sizes = [
        [(x.request.request_id, x.num_new_tokens) for x in step(s).scheduled] for _ in range(4)
    ]
    assert sizes == [
        [("a", 6), ("plain", 10)],
        [("a", 6), ("plain", 10)],
        [("plain", 1), ("a", 6)],  # no room left for "b"
        [("plain", 1), ("a", 2), ("b", 4)],
    ]
    s = make(max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add_request(Request("a", list(range(20)), scored))
    assert step(s).scheduled[0].num_new_tokens == 20


# -- long prefills beside other requests (long_prefill_token_threshold) ------------------------


def prefill_chunks(s: Scheduler, rid: str, max_steps: int = 100) -> list[int]:
    """Step until `rid` has its first token; the chunk it got in each step (0: none)."""
    sizes = []
    for _ in range(max_steps):
        out = step(s)
        sizes.append(sum(x.num_new_tokens for x in out.scheduled if x.request.request_id == rid))
        if rid not in s.requests or s.requests[rid].num_output_tokens:
            return sizes
    raise AssertionError(f"{rid} never finished its prefill: {sizes}")


def test_long_prefill_is_capped_while_others_decode():
    s = make(max_num_batched_tokens=16, long_prefill_token_threshold=6)
    s.add_request(req("short", 3, max_tokens=40, t=0.0))
    step(s)  # "short" decodes from now on
    s.add_request(req("long", 40, start=100, t=1.0))
    sizes = prefill_chunks(s, "long")
    assert sizes == [6] * 6 + [4]  # every prompt token once; no step over 1 + 6 tokens
    assert s.requests["short"].num_output_tokens == 1 + len(sizes)  # a token every step


def test_long_prefill_alone_takes_the_whole_budget():
    s = make(max_num_batched_tokens=16, long_prefill_token_threshold=6)
    s.add_request(req("long", 40))
    assert prefill_chunks(s, "long") == [16, 16, 8]


def test_cap_leaves_room_for_a_new_short_prompt_beside_a_long_one():
    s = make(max_num_batched_tokens=16, long_prefill_token_threshold=6)
    s.add_request(req("long", 40))
    step(s)  # alone: 16 tokens
    s.add_request(req("short", 5, start=100, t=1.0))
    out = step(s)
    got = {x.request.request_id: x.num_new_tokens for x in out.scheduled}
    assert got == {"long": 6, "short": 5}  # short prompt whole (<= cap), TTFT of one step
    off = make(max_num_batched_tokens=16)  # without the cap it waits for the long prompt
    off.add_request(req("long", 40))
    step(off)
    off.add_request(req("short", 5, start=100, t=1.0))
    out = step(off)
    assert {x.request.request_id: x.num_new_tokens for x in out.scheduled} == {"long": 16}


def test_a_waiting_long_prompt_is_capped_when_admitted_beside_others():
    s = make(max_num_batched_tokens=64, long_prefill_token_threshold=8)
    s.add_request(req("a", 30, start=0, t=0.0))
    s.add_request(req("b", 30, start=100, t=1.0))
    out = step(s)
    assert [x.num_new_tokens for x in out.scheduled] == [8, 8]


def test_cap_keeps_tokens_the_same_and_preemption_working():
    """A fake model whose token depends on the request's whole context (as a greedy model's
    does): the cap changes the chunks, never the tokens; preemption by recompute still happens
    (6 blocks of 4 tokens do not hold all three) and every block comes back."""

    def run(threshold: int) -> tuple[dict[str, list[int]], int]:
        s = make(num_blocks=10, caching=False, max_num_batched_tokens=16,
                 long_prefill_token_threshold=threshold)  # fmt: skip
        s.add_request(req("a", 3, max_tokens=12, t=0.0))
        s.add_request(req("b", 4, max_tokens=12, start=50, t=1.0))
        s.add_request(req("long", 23, max_tokens=6, start=100, t=2.0))
        outputs: dict[str, list[int]] = {}
        for _ in range(400):
            if not s.has_unfinished():
                break
            out = s.schedule()
            s.update_after_step(out)
            for sr in out.scheduled:
                r = sr.request
                assert r.num_computed_tokens <= r.num_tokens
                if r.num_computed_tokens >= r.num_tokens:
                    r.append_token(sum(r.token_ids) % 997)  # a function of the whole context
                    if r.check_stop_token():
                        outputs[r.request_id] = list(r.output_token_ids)
                        s.finish(r)
            s.kv.check_integrity()
        assert not s.has_unfinished() and s.kv.num_free_blocks == 10
        return outputs, s.num_preemptions

    plain, _ = run(0)
    capped, capped_preemptions = run(4)
    assert capped == plain and set(capped) == {"a", "b", "long"}
    assert capped_preemptions > 0


def test_threshold_is_validated_once():
    import pytest
    from pagoda.runtime.config import EngineConfig

    for bad in (-1, True, 2.0, "256"):
        with pytest.raises(ValueError, match="long_prefill_token_threshold"):
            SchedulerConfig(long_prefill_token_threshold=bad)
    with pytest.raises(ValueError, match="needs chunked prefill"):
        SchedulerConfig(long_prefill_token_threshold=256, enable_chunked_prefill=False)
    assert SchedulerConfig(long_prefill_token_threshold=0, enable_chunked_prefill=False)
    cpu = EngineConfig.create(device="cpu")
    assert cpu.scheduler.long_prefill_token_threshold is None  # by device, once it is known
    assert cpu.with_device_defaults().scheduler.long_prefill_token_threshold == 256
    off = EngineConfig.create(device="cpu", enable_chunked_prefill=False)
    assert off.with_device_defaults().scheduler.long_prefill_token_threshold == 0
    mine = EngineConfig.create(device="cpu", long_prefill_token_threshold=64)
    assert mine.with_device_defaults().scheduler.long_prefill_token_threshold == 64


def test_hybrid_snapshots_align_cut_chunks_save_boundaries_and_restore_hits():
    """A hybrid's prefix caching (`core/state_snapshots.py`), boundaries every 8 tokens (and
    an SSD chunk of 8): a chunk cut by the budget ends on a boundary; each boundary a prompt's chunks reach is planned
    as a save, visible only once its step ended (a twin admitted in the same step computes
    from 0); a later prompt sharing 24 tokens restores the snapshot at 24; a full pool evicts
    the least recently used, and an entry goes with its evicted KV block."""
    from pagoda.runtime.core.state_snapshots import StateSnapshots

    snaps = StateSnapshots(3, every=2, block_size=BS, chunk=8)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=12, max_num_seqs=8),
                  KVCacheManager(64, BS, True, snaps), lambda: 0.0)  # fmt: skip
    s.add_request(req("a", 30))
    s.add_request(req("twin", 30))
    out = step(s)
    assert [x.num_new_tokens for x in out.scheduled] == [8, 4]  # cut at 8; the rest of 12
    assert s.requests["twin"].num_cached_tokens == 0  # a's snapshot at 8 not written yet
    assert out.snapshots.restores == [] and [b for _, b, _ in out.snapshots.saves] == [8]
    s.abort("twin")
    saved, ends = [8], []
    while s.requests["a"].num_output_tokens == 0:
        out = step(s)
        saved += [b for _, b, _ in out.snapshots.saves] if out.snapshots else []
        ends.append(s.requests["a"].num_computed_tokens)
    assert ends == [16, 24, 30]  # 12 tokens a step, cut at the boundaries
    assert saved == [8, 16, 24] and snaps.num_cached == 3  # none past the prompt's 30
    b = Request("b", [*range(24), 99, 98, 97, 96, 95], SamplingParams(max_tokens=1))
    s.add_request(b)
    out = step(s)
    assert b.num_cached_tokens == 24  # restored in row 1 (a decodes in row 0)
    assert out.snapshots.restores == [(1, snaps.entry(b.block_hashes[5]))]
    c = Request("c", [*range(16), *range(50, 66)], SamplingParams(max_tokens=1))
    s.add_request(c)
    out = step(s)  # c's hit is at 16 (refreshed); its chunk's boundary 24 evicts 8, the oldest
    assert c.num_cached_tokens == 16 and [b for _, b, _ in out.snapshots.saves] == [24]
    assert snaps.deepest(s.requests["a"].block_hashes, 2) == 0
    snaps.drop(s.requests["a"].block_hashes[3])  # its KV block evicted: the entry is free
    assert snaps.deepest(s.requests["a"].block_hashes, 4) == 0 and snaps.num_cached == 2
    snaps.check_integrity()


def test_hybrid_snapshot_saves_inside_an_unaligned_chunk_are_not_planned():
    """A chunk that starts off an SSD chunk boundary (a budget too small to cut at a snapshot
    boundary) saves only a boundary at its end: the scan's states inside it are not at
    multiples of the chunk."""
    from pagoda.runtime.core.state_snapshots import StateSnapshots

    snaps = StateSnapshots(8, every=2, block_size=BS, chunk=4)
    hashes = [bytes([i]) * 16 for i in range(10)]
    assert [b for b, _ in snaps.plan_saves(hashes, 6, 24, 40)] == [24]
    assert [b for b, _ in snaps.plan_saves(hashes, 6, 23, 40)] == []
    # aligned: every boundary reached, but 24's save is already planned
    assert [b for b, _ in snaps.plan_saves(hashes, 4, 33, 40)] == [8, 16, 32]
    snaps.end_step()
    assert snaps.deepest(hashes, 10) == 8
