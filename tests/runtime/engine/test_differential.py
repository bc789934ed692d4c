"""Differential test of the scheduling machinery: random traffic through a busy engine (a small
KV pool that forces preemption and prefix-cache eviction, small chunked-prefill budgets, shared
prefixes, stop tokens, aborts mid-flight, late arrivals, prompts at the block-size and
`max_model_len` boundaries) must give every request exactly the tokens it gets alone on an
engine without prefix caching or chunking. Greedy requests rely on batch invariance; seeded
sampled ones on per-request generators (docs/runtime.md, "What is guaranteed").

After each run the pool must hold no request's blocks, every free block accounted for, and the
prefix-cache and preemption counters must agree with what happened.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine.outputs import logprob_dict
from pagoda.runtime.model.loader import load_model

BS = 8  # block size
MAX_LEN = 96  # max_model_len


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_diff")
    make_tiny_llama(path)
    return load_model(str(path))


@pytest.fixture(scope="module")
def reference(tiny):
    """One request at a time, no prefix caching, whole prompts: the oracle."""
    llm = LLM(
        loaded=tiny,
        dtype="float32",
        block_size=BS,
        max_model_len=MAX_LEN,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        max_num_batched_tokens=MAX_LEN,
        # room for two samples of max_model_len, never preempted; the 2 GiB CPU default (262,144
        # blocks) made each check_integrity below walk them all (0.1-0.4 s a request)
        num_blocks_override=4 * MAX_LEN // BS,
    )
    cache: dict = {}

    def run(prompt: list[int], params: SamplingParams) -> list[tuple]:
        """(token ids, finish reason, logprobs) of each sample."""
        key = (tuple(prompt), repr(params))
        if key not in cache:
            (o,) = llm.generate([prompt], params, use_tqdm=False)
            cache[key] = [
                (list(c.token_ids), c.finish_reason, _lp(c.logprobs), c.text, c.stop_reason)
                for c in o.outputs
            ]
            assert not llm.engine.has_unfinished_requests()
            assert llm.engine.scheduler.num_preemptions == 0  # one request alone, uninterrupted
            llm.engine.check_integrity()
        return cache[key]

    return run


def _lp(logprobs) -> list:
    """Per token [(id, logprob, rank)] in the offline {id: Logprob} order, from that shape or from
    the engine's `TokenLogprob`s."""
    dicts = (p if isinstance(p, dict) else logprob_dict(p, str) for p in logprobs or ())
    return [[(t, lp.logprob, lp.rank) for t, lp in d.items()] for d in dicts]


def _workload(rng: random.Random, n: int, reference) -> list[tuple]:
    """(arrival step, prompt, params, abort step or None) per request."""
    shared = [[rng.randrange(3, 300) for _ in range(40)] for _ in range(2)]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:  # a prompt that is exactly whole blocks
            prompt = rng.choice(shared)[: BS * rng.randrange(1, 5)]
        elif kind < 0.25:  # near max_model_len: the length limit cuts max_tokens
            prompt = rng.choice(shared) + [rng.randrange(3, 300) for _ in range(MAX_LEN - 45)]
            prompt = prompt[: MAX_LEN - rng.randrange(1, 6)]
        elif kind < 0.35:  # an exact repeat of an earlier prompt (fully cached)
            prompt = list(out[rng.randrange(len(out))][1]) if out else [5]
        else:
            prefix = rng.choice(shared)[: rng.randrange(0, 41)]
            prompt = prefix + [rng.randrange(3, 300) for _ in range(rng.randrange(1, 30))]
        seeded = rng.random() < 0.3
        params = SamplingParams(
            n=rng.choice([1, 1, 1, 2]),
            max_tokens=rng.randrange(1, 24),
            temperature=0.9 if seeded else 0.0,
            top_k=rng.choice([-1, 20]) if seeded else -1,
            top_p=rng.choice([1.0, 0.9]) if seeded else 1.0,
            min_p=rng.choice([0.0, 0.05]) if seeded else 0.0,
            seed=rng.randrange(1000) if seeded else None,
            ignore_eos=rng.random() < 0.7,
            logprobs=rng.choice([None, None, 2]),
            presence_penalty=rng.choice([0.0, 0.0, 0.0, 0.5]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.0, 1.3]),
        )
        if rng.random() < 0.35:  # a stop token that the request does produce
            toks = reference(prompt, params)[0][0]
            stop = (toks[rng.randrange(len(toks))],)
            params = dataclasses.replace(params, stop_token_ids=stop)
        elif rng.random() < 0.2:  # a stop string: the text of a token it produces
            toks = reference(prompt, params)[0][0]
            stop = (f"w{toks[rng.randrange(len(toks))]}",)
            include = rng.random() < 0.5
            params = dataclasses.replace(params, stop=stop, include_stop_str_in_output=include)
        arrival = rng.randrange(0, n)
        abort = arrival + rng.randrange(0, 12) if rng.random() < 0.12 else None
        out.append((arrival, prompt, params, abort))
    return out


def _run_busy(llm: LLM, work):
    engine = llm.engine
    got: dict[tuple[str, int], list[int]] = {}
    lps: dict[tuple[str, int], list] = {}
    text: dict[tuple[str, int], str] = {}
    last: dict[tuple[str, int], object] = {}
    reason: dict[tuple[str, int], str] = {}
    aborted: set[str] = set()
    pending = sorted(range(len(work)), key=lambda i: work[i][0])
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and work[pending[0]][0] <= step:
            i = pending.pop(0)
            engine.add_request(f"q{i}", work[i][1], work[i][2])
            for j in range(work[i][2].n):
                got[(f"q{i}", j)] = []
        for i, (_, _, params, abort_at) in enumerate(work):
            rid = f"q{i}"
            live = (rid, 0) in got and not all((rid, j) in reason for j in range(params.n))
            if abort_at == step and live:
                engine.abort_request(rid)
                aborted.add(rid)
        for d in engine.step():
            key = (d.request_id, d.index)
            assert key not in reason, "output after finish"
            got[key].extend(d.new_token_ids)
            lps.setdefault(key, []).extend(_lp(d.new_logprobs))
            text[key] = text.get(key, "") + d.new_text
            if d.finished:
                last[key] = d
                reason[key] = d.finish_reason
        engine.check_integrity()
        step += 1
        assert step < 5000, "engine does not drain"
    return got, reason, aborted, lps, last, text


def _check(tiny, reference, seed, async_scheduling, **engine_args):
    rng = random.Random(seed)
    work = _workload(rng, 24, reference)
    seqs = engine_args.get("max_num_seqs") or rng.choice([3, 4, 8])
    chunked = engine_args.get("enable_chunked_prefill", rng.random() < 0.8)
    budgets = [b for b in (5, 12, 20, 33) if b >= seqs] if chunked else [MAX_LEN]
    args = dict(
        # 12 blocks hold one max_model_len request: from there, a few at once, then preemption
        num_blocks_override=rng.choice([12, 16, 22]),
        max_num_seqs=seqs,
        max_num_batched_tokens=rng.choice(budgets),
        enable_prefix_caching=rng.random() < 0.8,
        enable_chunked_prefill=chunked,
        # a long prompt's chunk capped while others run or wait (0: off; the budget's 5..33)
        long_prefill_token_threshold=rng.choice([0, 3, 8]) if chunked else 0,
    )
    args.update(engine_args)
    llm = LLM(
        loaded=tiny,
        dtype="float32",
        block_size=BS,
        max_model_len=MAX_LEN,
        async_scheduling=async_scheduling,
        **args,
    )
    got, reason, aborted, lps, last, text = _run_busy(llm, work)
    engine = llm.engine
    for i, (_, prompt, params, _) in enumerate(work):
        for j, (want, want_reason, want_lp, want_text, want_stop) in enumerate(
            reference(prompt, params)
        ):
            key = (f"q{i}", j)
            have = got[key]
            if f"q{i}" in aborted and reason.get(key) in (None, "abort"):  # aborts emit nothing
                assert have == want[: len(have)], f"{key} (aborted) diverged"
                continue
            assert have == want, f"{key}: {len(prompt)}-token prompt, {params}, {args}"
            assert reason[key] == want_reason, key
            assert lps.get(key, []) == want_lp, f"{key}: logprobs differ"
            assert text.get(key, "") == want_text and last[key].stop_reason == want_stop, key
            assert len(prompt) + len(have) <= MAX_LEN
            d = last[key]  # the per-request metrics a client sees
            assert d.num_prompt_tokens == len(prompt) and d.num_output_tokens == len(have)
            assert 0 <= d.num_cached_tokens < len(prompt) and d.num_cached_tokens % BS == 0
    # nothing leaked: every block free (cached ones evictable), no request holds any
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_blocks
    assert not engine.kv.req_blocks and not engine.scheduler.requests
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_preemptions == engine.scheduler.num_preemptions
    # prefix-cache counters: never more hits than queries, whole blocks only, queries once per
    # admitted sample
    assert 0 <= stats.prefix_hits <= stats.prefix_queries
    assert stats.prefix_queries <= sum(len(p) * s.n for _, p, s, _ in work)
    assert stats.prefix_hits % BS == 0
    if args["enable_prefix_caching"]:
        assert stats.prefix_hits > 0  # repeats and shared prefixes always hit something
    engine.check_integrity()
    return engine.scheduler.num_preemptions, stats.prefix_hits, sorted(reason.values())


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_busy_engine_matches_requests_run_alone(tiny, reference, seed, async_scheduling):
    preemptions, _, _ = _check(
        tiny,
        reference,
        seed,
        async_scheduling,
        num_blocks_override=14,
        max_num_seqs=4,
        max_num_batched_tokens=12,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
    )
    assert preemptions > 0  # the pool is small enough to force them


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("seed", range(3, 7))
def test_busy_engine_matches_requests_run_alone_more_seeds(tiny, reference, seed, async_scheduling):
    _check(tiny, reference, seed, async_scheduling)


GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def _engine(tiny, **kw):
    args = dict(block_size=BS, max_model_len=MAX_LEN, max_num_batched_tokens=16, max_num_seqs=4)
    return LLM(loaded=tiny, dtype="float32", **(args | kw)).engine


def _drain(engine, got):
    while engine.has_unfinished_requests():
        for d in engine.step():
            got.setdefault(d.request_id, []).extend(d.new_token_ids)
        engine.check_integrity()


def test_blocks_shared_with_a_preempted_and_an_aborted_request(tiny, reference):
    """Three requests share a 3-block prefix; the newest is preempted (the pool holds about two),
    the middle one is aborted while it shares the blocks: the oldest keeps its output, the
    shared blocks keep exactly their remaining users, and all come back at the end."""
    rng = random.Random(7)
    LONG = dataclasses.replace(GREEDY, max_tokens=40)  # 9 blocks each: not all three fit
    prefix = [rng.randrange(3, 300) for _ in range(3 * BS)]
    prompts = {r: prefix + [rng.randrange(3, 300) for _ in range(5)] for r in "abc"}
    engine = _engine(tiny, num_blocks_override=12)
    got: dict[str, list[int]] = {}
    for rid in "abc":
        engine.add_request(rid, prompts[rid], LONG)
    shared_ids = None
    for _ in range(200):
        for d in engine.step():
            got.setdefault(d.request_id, []).extend(d.new_token_ids)
        engine.check_integrity()
        held = engine.kv.req_blocks
        if shared_ids is None and "b" in held and "a" in held and len(held["b"]) > 3:
            shared_ids = [b.block_id for b in held["a"][:3]]
            assert shared_ids == [b.block_id for b in held["b"][:3]]  # one copy of the prefix
            users = [engine.kv.pool.blocks[i].ref_cnt for i in shared_ids]
            engine.abort_request("b")
            assert [engine.kv.pool.blocks[i].ref_cnt for i in shared_ids] == [n - 1 for n in users]
        if engine.scheduler.num_preemptions and shared_ids is not None:
            assert "c" not in held  # the newest went, the prefix stays with the oldest
            assert [b.block_id for b in held["a"][:3]] == shared_ids
            assert all(engine.kv.pool.blocks[i].ref_cnt == 1 for i in shared_ids)
            break
    assert shared_ids is not None and engine.scheduler.num_preemptions > 0
    _drain(engine, got)
    assert got["a"] == reference(prompts["a"], LONG)[0][0]
    assert got["c"] == reference(prompts["c"], LONG)[0][0]
    got_b = got.get("b", [])  # aborted, perhaps before its first token
    assert got_b == reference(prompts["b"], LONG)[0][0][: len(got_b)]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_whole_block_prompt_served_from_the_cache(tiny, reference):
    """A prompt of exactly three blocks, run twice: the second run takes two blocks from the
    cache (the last token is always computed, so its block is too) and gives the same tokens."""
    prompt = [(7 * i) % 290 + 3 for i in range(3 * BS)]
    engine = _engine(tiny, num_blocks_override=16)
    firsts = []
    for rid in ("first", "again"):
        engine.add_request(rid, prompt, GREEDY)
        got: dict[str, list[int]] = {}
        cached = []
        while engine.has_unfinished_requests():
            for d in engine.step():
                got.setdefault(d.request_id, []).extend(d.new_token_ids)
                cached.append(d.num_cached_tokens)
        firsts.append((got[rid], cached[-1]))
    assert firsts[0] == (reference(prompt, GREEDY)[0][0], 0)
    assert firsts[1] == (firsts[0][0], 2 * BS)
    assert engine.kv.prefix_queries == 2 * len(prompt) and engine.kv.prefix_hits == 2 * BS
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_max_model_len_boundary(tiny, reference):
    """A prompt one token short of max_model_len gets exactly one token (finish "length") even
    with a bigger max_tokens; one at max_model_len is refused and the engine keeps serving."""
    engine = _engine(tiny, num_blocks_override=12)
    prompt = [(5 * i) % 290 + 3 for i in range(MAX_LEN - 1)]
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("long", [*prompt, 5], GREEDY)
    engine.add_request("edge", prompt, GREEDY)
    got, reasons = [], []
    while engine.has_unfinished_requests():
        for d in engine.step():
            got += d.new_token_ids
            reasons.append(d.finish_reason)
    assert len(got) == 1 and reasons[-1] == "length"
    assert got == reference(prompt, GREEDY)[0][0]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


async def test_async_engine_traffic_matches_requests_run_alone(tiny, reference):
    """The same random workload through `AsyncEngine` (the server's path): requests arrive from
    concurrent tasks at random moments and some are aborted by their client mid-stream. Every
    finished stream equals its request alone, aborted ones a prefix of it, and the pool is
    whole afterwards."""
    import asyncio
    import functools

    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.async_engine import AsyncEngine
    from pagoda.runtime.engine.core import EngineCore

    rng = random.Random(11)
    work = [  # the server refuses max_tokens past the context (offline, they are capped)
        (t, p, dataclasses.replace(s, max_tokens=min(s.max_tokens, MAX_LEN - len(p))), a)
        for t, p, s, a in _workload(rng, 16, reference)
    ]
    config = EngineConfig.create(
        "tiny",
        dtype="float32",
        block_size=BS,
        max_model_len=MAX_LEN,
        num_blocks_override=14,
        max_num_seqs=4,
        max_num_batched_tokens=12,
    )
    engine = AsyncEngine(functools.partial(EngineCore, config, tiny))
    engine.start()
    await asyncio.wait_for(engine.wait_started(), 60)

    async def client(i: int, prompt, params, abort_after):
        await asyncio.sleep(rng.random() * 0.01)
        stream = engine.add_request(prompt, params, request_id=f"c{i}")
        if abort_after == 0:  # a client gone at once: its stream ends, nothing leaks
            engine.abort(f"c{i}")
        toks = [[] for _ in range(params.n)]
        reasons = [None] * params.n
        async for d in stream:
            toks[d.index] += d.new_token_ids
            if d.finished:
                reasons[d.index] = d.finish_reason
            if abort_after is not None and sum(map(len, toks)) >= abort_after:
                engine.abort(f"c{i}")
                abort_after = None
        return toks, reasons

    # tokens seen before the client aborts (0: at once); how many deltas a client sees
    # depends on timing (deltas merge while it is slow), so only the first abort is certain
    plan = [None if a is None else rng.randrange(0, 6) for _, _, _, a in work]
    plan[next(i for i, a in enumerate(plan) if a is not None)] = 0
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(
                    client(i, p, s, abort_after)
                    for i, ((_, p, s, _), abort_after) in enumerate(zip(work, plan))
                )
            ),
            120,
        )
        for (_, prompt, params, _), (toks, reasons) in zip(work, results):
            for j, (want, want_reason, *_) in enumerate(reference(prompt, params)):
                if reasons[j] == "abort":
                    assert toks[j] == want[: len(toks[j])]
                else:
                    assert (toks[j], reasons[j]) == (want, want_reason), (prompt, params)
        info = await engine.check_integrity()
        assert info["stats"]["num_free_blocks"] == info["stats"]["num_blocks"]
        assert info["in_flight"] == 0
        assert info["stats"]["num_preemptions"] > 0
        assert any("abort" in r for _, r in results)
    finally:
        engine.stop()
