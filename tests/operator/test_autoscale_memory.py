"""The autoscaler's memory saved in status.autoscaling.state (operator/autoscaling/memory.py):
a process on another clock that loads it decides as the one that saved it would have; the saved
form is small, changes only when the decisions' inputs do, and is ignored when not readable."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from pagoda.operator.autoscaling import bursts, memory
from pagoda.operator.autoscaling.memory import Memory
from pagoda.operator.autoscaling.policy import Metrics, Policy, decide

# A tuned profile (a 100-token prompt and 50 output tokens cost a replica 0.2 s): the demand
# floor and the burst floor (window 5 min, bursts remembered 1 h) act, beside a TTFT target.
POLICY = Policy(
    min_replicas=1, max_replicas=40, target_ttft_s=1.0, down_window_s=120,
    prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0, lead_s=0.0, target_utilization=0.9,
    burst_window_s=300, burst_memory_s=3600, young_margin=1.0,
)  # fmt: skip
OFFSET_A, OFFSET_B = 1_800_000_000.0, 1_800_000_000.0 - 7_777.7  # two processes' wall - monotonic


def reading(fast: float, slow: float, ttft: float = 0.3) -> Metrics:
    return Metrics(
        ttft_p95_s=ttft, waiting=0.0, mean_prompt_tokens=100.0, mean_output_tokens=50.0,
        arrival_rate=fast, arrival_rate_slow=slow, arrival_rate_fast=fast,
    )  # fmt: skip


def loads(seed: int, n: int) -> list[Metrics]:
    """Bursts every 2–4 minutes over a trickle, then (from the 300th evaluation) one every
    8 minutes, farther apart than the burst window (scheduled); noise and some TTFT spikes."""
    rng, out, slow = random.Random(seed), [], 1.0
    gap = 0
    for i in range(n):
        gap -= 1
        if i < 300 and gap <= 0 and rng.random() < 0.3:
            gap = rng.randint(24, 48)
        elif i >= 300 and i % 96 == 0:
            gap = 24
        fast = rng.uniform(20, 40) if gap > 20 else rng.uniform(0, 2)
        slow = 0.9 * slow + 0.1 * fast
        out.append(reading(fast, slow, ttft=rng.choice([0.3, 0.5, 2.5])))
    return out


def run(policy: Policy, state: Memory, readings: list[Metrics], t0: float, current: int):
    """Evaluate every 5 s from t0 + 5, applying each decision; the replicas and the memory."""
    out = []
    for i, m in enumerate(readings, start=1):
        d = decide(
            policy, m, current=current, ready=current, history=state.history, now=t0 + 5.0 * i,
            correction=state.correction, bursts=state.bursts,
        )  # fmt: skip
        rise = memory.last_rise(state.raised, state.correction, d.correction, t0 + 5.0 * i)
        state = Memory(d.history, d.correction, d.bursts, raised=rise)
        current = d.replicas
        out.append(current)
    return out, state, current


def test_a_loaded_memory_decides_as_the_saved_one() -> None:
    """Split a day of bursty load anywhere: the process that loads the memory (another
    monotonic clock) makes the same decisions as the one that saved it, but for the gap's
    interval: the run and the newest sample that went on are taken to have gone on until the
    load, so it may hold a scale down one evaluation longer, never shorter."""
    readings = loads(seed=7, n=800)
    full, _, _ = run(POLICY, Memory(((0.0, 2),)), readings, 0.0, 2)
    assert max(full) >= 8 and min(full) <= 2  # bursts held and scaled down from between them
    late = 0
    for split in range(60, 800, 23):
        _, state, current = run(POLICY, Memory(((0.0, 2),)), readings[:split], 0.0, 2)
        saved = json.loads(json.dumps(memory.dump(state, OFFSET_A)))  # through the API's JSON
        t_b = 5.0 * split + OFFSET_A - OFFSET_B  # the same instant on B's clock
        loaded = memory.load(saved, now=t_b + 5.0, offset=OFFSET_B, current=current, policy=POLICY)
        assert loaded is not None
        after, _, _ = run(POLICY, loaded, readings[split:], t_b, current)
        for i, (want, got) in enumerate(zip(full[split:], after)):
            assert got >= want, (split, i, full[split:][: i + 3], after[: i + 3])
        late += sum(g != w for g, w in zip(after, full[split:]))
    assert late <= 5, late  # one evaluation late here and there, no drift


def test_a_take_over_at_the_next_evaluation_decides_as_without_it() -> None:
    """The young service's margin (the mean need since its first traffic) and the learned
    correction (growing while the fleet at its floor still queues, decaying otherwise) are
    saved exactly: a process that loads the memory at the next evaluation's time (the loop's
    `interval_s`) makes the same decisions, to the replica, as the one that saved it, whether
    the split falls in the service's first burst window or hours later. (Before: the margin's
    mean came from the kept peaks, the correction was saved to 1 % and lost the first
    evaluation's growth: up to 14 replicas apart.)"""
    young = replace(POLICY, young_margin=4.0)
    readings = [replace(m, waiting=6.0 if m.ttft_p95_s == 2.5 else 0.0) for m in loads(7, 400)]
    full, end, _ = run(young, Memory(((0.0, 2),)), readings, 0.0, 2)
    assert end.correction > 2 and max(full) >= 20  # both at work
    for split in [*range(5, 60, 6), *range(60, 400, 23)]:
        _, state, current = run(young, Memory(((0.0, 2),)), readings[:split], 0.0, 2)
        saved = json.loads(json.dumps(memory.dump(state, OFFSET_A)))
        t_b = 5.0 * split + OFFSET_A - OFFSET_B  # the same instant on B's clock
        assert state.bursts.since is not None
        since = int(state.bursts.since + OFFSET_A) - OFFSET_B  # trafficSince, to the second
        loaded = memory.load(saved, now=t_b + 5.0, offset=OFFSET_B, current=current,
                             policy=young, since=since, interval_s=5.0)  # fmt: skip
        assert loaded is not None
        after, _, _ = run(young, loaded, readings[split:], t_b, current)
        assert after == full[split:], split


def test_without_the_memory_a_due_scale_down_waits_a_full_window() -> None:
    """What it saves: a scale down due 15 s after the take-over happens then, where the fresh
    start (seeded with the current count, as before) waits the whole 120 s window."""
    high, low = reading(0.0, 0.0, ttft=4.0), reading(0.0, 0.0, ttft=0.1)
    plain = replace(POLICY, prefill_tokens_per_s=None, decode_tokens_per_s=None)
    _, state, current = run(plain, Memory(((0.0, 1),)), [high] * 3 + [low] * 20, 0.0, 1)
    assert current == 8  # 1 → 2 → 4 → 8, then 100 s of low readings within the window
    loaded = memory.load(memory.dump(state, OFFSET_A), now=120.0 + 5 + OFFSET_A - OFFSET_B,
                         offset=OFFSET_B, current=8, policy=plain)  # fmt: skip
    assert loaded is not None
    restored, _, _ = run(plain, loaded, [low] * 30, 120.0 + OFFSET_A - OFFSET_B, 8)
    fresh, _, _ = run(plain, Memory(((125.0, 8),)), [low] * 30, 120.0, 8)
    assert restored.index(1) == 3  # at 140 s: the high reading of 15 s has left the window
    assert fresh.index(1) == 25  # at 250 s: the seed of 125 s has


def test_the_saved_form_is_small_and_changes_only_with_the_decisions_inputs() -> None:
    readings = loads(seed=3, n=400)
    _, state, current = run(POLICY, Memory(((0.0, 2),)), readings, 0.0, 2)
    saved = memory.dump(state, OFFSET_A)
    assert len(json.dumps(saved)) < 2500, len(json.dumps(saved))
    assert len(saved["samples"]) <= memory.MAX_PEAKS + 2 * bursts.MIN_ONSETS
    assert len(saved["bursts"]) == 2
    # idle for a while: the saved form settles and then stays the same evaluation after evaluation
    idle = reading(0.0, 0.0, ttft=None)  # type: ignore[arg-type]
    _, state, _ = run(POLICY, state, [idle] * 200, 2000.0, current)
    dumps = []
    for k in range(5):
        _, state, _ = run(POLICY, state, [idle], 3000.0 + 5 * k, 1)
        dumps.append(memory.dump(state, OFFSET_A))
    assert all(d == dumps[0] for d in dumps), dumps
    # recommendations that flap between many values stay bounded
    flap = Memory(tuple((float(t), 1 + (t * 7919) % 97) for t in range(300)))
    assert len(memory.dump(flap, 0.0)["recommendations"]) <= memory.MAX_RECOMMENDATIONS


def test_an_unreadable_or_stale_memory() -> None:
    state = Memory(((0.0, 3), (5.0, 1)), correction=1.5, last_scale_up=0.0)
    saved = memory.dump(state, 0.0)
    assert saved["recommending"] == [1, 5.0] and saved["correction"] == 1.5
    for bad in (None, {}, {**saved, "version": 2}, {**saved, "recommending": "x"},
                {**saved, "samples": [[1, "a"]]}, {**saved, "correction": -1}):  # fmt: skip
        assert memory.load(bad, now=10.0, offset=0.0, current=3, policy=POLICY) is None, bad
    fine = memory.load(saved, now=10.0, offset=0.0, current=3, policy=POLICY)
    assert fine is not None and fine.history[-1] == (10.0, 1) and fine.last_scale_up == 0.0
    # the run asking for fewer replicas started longer ago than a window (+ the gap allowed):
    # no live autoscaler left it so; the operator was away and the current count is recorded
    late = 5.0 + POLICY.down_window_s + memory.MAX_GAP_S + 1
    stale = memory.load(saved, now=late, offset=0.0, current=3, policy=POLICY)
    assert stale is not None and stale.history[-1] == (late, 3)
