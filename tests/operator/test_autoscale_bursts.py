"""The burst floor (operator/autoscaling/bursts.py) and how decide() applies it: recurring bursts
keep the fleet their largest recent burst needed; a level shift or an isolated burst holds
nothing, so the demand floor still follows the load down."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from pagoda.operator.autoscaling import bursts
from pagoda.operator.autoscaling.policy import Metrics, Policy, decide

# A tuned profile's rates: a 100-token prompt and a 50-token output cost 0.1 + 0.1 = 0.2 s. No
# lead (the demand floor's extrapolation of a rising rate), so each count below is one formula.
# The TTFT target is loose enough that these short prompts are never a clump (their prefill
# within the budget needs 0.15 replicas per req/s, their work 0.2): the work sets each need.
# The young service's margin, which would also hold these services' first bursts, is off except
# in its own tests (YOUNG).
TUNED = Policy(
    min_replicas=1, max_replicas=40, target_ttft_s=5.0, target_queue=4.0, down_window_s=60,
    prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0, lead_s=0.0, target_utilization=0.95,
    young_margin=1.0,
)  # fmt: skip
YOUNG = replace(TUNED, young_margin=bursts.YOUNG_MARGIN)
U = TUNED.target_utilization


def reading(fast: float, slow: float, rate: float | None = None, isl: float = 100.0) -> Metrics:
    """Requests/s over 15 s (`fast`), 2 min (`slow`) and 30 s (`rate`, default the fast one)."""
    return Metrics(
        ttft_p95_s=0.1, waiting=0.0, mean_prompt_tokens=isl, mean_output_tokens=50.0,
        arrival_rate=fast if rate is None else rate, arrival_rate_slow=slow,
        arrival_rate_fast=fast,
    )  # fmt: skip


def drive(
    policy: Policy, loads: list[tuple[float, float]], current: int = 2, isl: float = 100.0
) -> list[int]:
    """Evaluate every 5 s on (fast, slow) arrival rates, applying each decision."""
    history, samples, out = ((0.0, current),), bursts.Bursts(), []
    for i, (fast, slow) in enumerate(loads, start=1):
        d = decide(policy, reading(fast, slow, isl=isl), current=current, ready=current,
                   history=history, now=5.0 * i, bursts=samples)  # fmt: skip
        history, samples, current = d.history, d.bursts, d.replicas
        out.append(current)
    return out


def test_onsets_count_rises_above_twice_the_slow_need() -> None:
    s = bursts.Bursts()
    for t, fast, slow in ((0, 1.0, 1.0), (5, 3.0, 1.0), (10, 3.0, 1.2), (15, 1.0, 1.5),
                          (20, 4.0, 1.5), (25, 0.0, 1.5)):  # fmt: skip
        s = bursts.record(s, t, fast, slow, window_s=60.0)
    assert [x[2] for x in s.samples] == [False, True, True, False, True, False]
    assert bursts.onsets(s.samples) == 2 and bursts.burst_need(s) == 4.0
    assert s.onsets == ()  # no memory asked for: nothing scheduled
    # the window drops the old samples: one onset left, no floor
    s = bursts.record(s, 71.0, 0.0, 1.5, window_s=60.0)
    assert bursts.onsets(s.samples) == 1 and bursts.burst_need(s) is None


def test_from_idle_any_real_arrival_is_an_onset() -> None:
    s = bursts.record(bursts.Bursts(), 0.0, 0.0, 0.0, window_s=60.0)
    s = bursts.record(s, 5.0, 1.5, 0.0, window_s=60.0)  # slow counts as IDLE_BUSY (0.5)
    s = bursts.record(s, 10.0, 0.9, 0.1, window_s=60.0)  # under 2 x 0.5: not a burst
    assert [x[2] for x in s.samples] == [False, True, False]


def test_bursts_remembered_with_their_peak_and_merged_when_close() -> None:
    s = bursts.Bursts()
    for t, fast in ((0, 1.0), (5, 3.0), (10, 6.0), (15, 1.0), (20, 5.0), (200, 1.0), (205, 4.0)):
        s = bursts.record(s, t, fast, 1.0, window_s=60.0, memory_s=300.0)
    # the onset at 20 s is the first burst's (within MERGE_S); its need is its largest fast need
    assert s.onsets == ((5, 6.0), (205, 4.0))
    s = bursts.record(s, 306.0, 1.0, 1.0, window_s=60.0, memory_s=300.0)
    assert s.onsets == ((205, 4.0),)  # the memory forgets the first


def test_the_next_burst_is_expected_one_interval_after_the_last() -> None:
    s = bursts.Bursts(onsets=((100.0, 8.0), (1900.0, 6.0)))
    margin = max(bursts.MIN_AHEAD_S, bursts.JITTER * 1800.0)
    due = 3700.0
    assert bursts.scheduled_need(s, due - margin - 30.0 - 1.0, lead_s=30.0) is None
    assert bursts.expected(s, due - margin - 30.0, lead_s=30.0) == (due, 8.0)
    assert bursts.scheduled_need(s, due + margin, lead_s=30.0) == 8.0
    assert bursts.scheduled_need(s, due + margin + 1.0, lead_s=30.0) is None
    assert bursts.scheduled_need(bursts.Bursts(onsets=s.onsets[1:]), due, lead_s=30.0) is None


def test_recurring_bursts_hold_the_largest_need_between_them() -> None:
    """30 s bursts of 40 req/s (8 replicas busy) every 2 minutes over 1 req/s: after the second
    burst the fleet stays at the bursts' need in the quiet stretches, where the demand floor
    alone (down window 60 s) falls back to 1."""
    quiet, burst = (1.0, 1.0), (40.0, 4.0)
    cycle = [quiet] * 18 + [burst] * 6
    held = drive(TUNED, cycle * 4)
    need = math.ceil(40 * 0.2 / U)
    assert max(held) == need
    assert min(held[2 * len(cycle) :]) == need  # from the second burst's end on
    alone = drive(replace(TUNED, burst_window_s=0), cycle * 4)
    assert min(alone[2 * len(cycle) :]) == 1


def test_a_level_shift_and_a_lone_burst_hold_nothing() -> None:
    """One step up and back down, or a single burst: one onset, no burst floor; the fleet is back
    at the demand floor after the scale-down window."""
    step = drive(TUNED, [(1.0, 1.0)] * 4 + [(40.0, 4.0)] * 60 + [(1.0, 1.0)] * 30)
    assert step[63] == math.ceil(40 * 0.2 / U) and step[-1] == 1
    d = decide(TUNED, reading(40.0, 4.0), current=2, ready=2, history=(), now=0.0)
    assert d.reason == "DemandFloor" and len(d.bursts.samples) == 1


def test_the_burst_floor_says_so_and_is_off_without_a_fast_rate() -> None:
    quiet, burst = (1.0, 1.0), (40.0, 4.0)
    samples, history, current = bursts.Bursts(), ((0.0, 2),), 2
    for i, (fast, slow) in enumerate([quiet, burst, quiet, burst, quiet], start=1):
        d = decide(TUNED, reading(fast, slow), current=current, ready=current, history=history,
                   now=5.0 * i, bursts=samples)  # fmt: skip
        samples, history, current = d.bursts, d.history, d.replicas
    assert d.reason == "BurstFloor" and "bursts 8.0 replicas busy" in d.message, d.message
    no_fast = replace(reading(1.0, 1.0), arrival_rate_fast=None)
    d = decide(TUNED, no_fast, current=current, ready=current, history=history, now=30.0,
               bursts=samples)  # fmt: skip
    assert d.bursts == samples and d.reason != "BurstFloor"  # nothing recorded, nothing held


@pytest.mark.parametrize(
    "bad", [{"burst_window_s": -1.0}, {"burst_memory_s": -1.0}, {"young_margin": 0.5}]
)
def test_policy_rejects_a_negative_burst_window(bad: dict) -> None:
    with pytest.raises(ValueError):
        replace(TUNED, **bad)


def test_metrics_reject_a_negative_fast_rate() -> None:
    with pytest.raises(ValueError):
        reading(-1.0, 1.0)


def test_bursts_every_half_hour_find_their_replicas_standing() -> None:
    """A minute of 40 req/s (8 replicas busy) every 30 minutes over 1 req/s: farther apart than
    the window, so they do not recur within it; after two, the third finds its replicas up
    before it lands, and the quiet between holds the demand floor's 1."""
    quiet, burst = (1.0, 1.0), (40.0, 4.0)
    cycle = [quiet] * 348 + [burst] * 12  # 5 s evaluations: a burst every 1,800 s
    need = math.ceil(40 * 0.2 / U)
    held = drive(TUNED, cycle * 3)
    third = 2 * len(cycle) + 348
    assert held[third - 2] == need and held[third - 40] == 1  # up 10 s before, not 200 s
    assert min(held[len(cycle) : third - 40]) == 1
    alone = drive(replace(TUNED, burst_memory_s=0.0), cycle * 3)
    assert alone[third - 2] == 1


def test_clump_need_is_the_prefill_of_15_s_of_prompts_within_the_ttft_budget() -> None:
    """4 req/s of 2,000-token prompts: 120,000 tokens in 15 s; at V_P 1,000 tokens/s and an 8 s
    target the budget is 8 − 2 = 6 s, so had they come within 5 s they need 120 / 11 replicas."""
    assert bursts.clump_need(4.0, 2000.0, 1000.0, 8.0) == pytest.approx(120.0 / 11.0)
    assert bursts.clump_need(None, 2000.0, 1000.0, 8.0) is None
    assert bursts.clump_need(4.0, None, 1000.0, 8.0) is None
    assert bursts.clump_need(4.0, 2000.0, None, 8.0) is None
    assert bursts.clump_need(4.0, 9000.0, 1000.0, 8.0) is None  # a lone prompt misses 8 s


def test_a_clump_raises_the_samples_need_but_not_its_onset() -> None:
    s = bursts.record(bursts.Bursts(), 0.0, 1.0, 1.0, window_s=60.0, clump=0.5)
    s = bursts.record(s, 5.0, 1.5, 1.0, window_s=60.0, clump=9.0)  # under 2 x slow: no onset
    s = bursts.record(s, 10.0, 3.0, 1.0, window_s=60.0, memory_s=300.0, clump=12.0)
    assert [x[1:] for x in s.samples] == [(1.0, False), (9.0, False), (12.0, True)]
    assert s.onsets == ((10.0, 12.0),)  # a remembered burst keeps its clump's need


def test_recurring_clumps_of_long_prompts_hold_their_prefill_need() -> None:
    """A code assistant: 30 s clumps of 4 req/s of 2,000-token prompts every 2 minutes over 0.1
    req/s, an 8 s target. Their work keeps ⌈4 x 2.1 / U⌉ = 9 replicas busy, but the clump's prefill
    within the budget needs 120 / 11 = 10.9 replicas: after the second clump the fleet holds 12
    through the quiet, ready for the next."""
    policy = replace(TUNED, target_ttft_s=8.0)
    quiet, clump = (0.1, 0.1), (4.0, 0.4)
    cycle = [quiet] * 18 + [clump] * 6
    held = drive(policy, cycle * 4, isl=2000.0)
    work = math.ceil(4.0 * 2.1 / U)
    need = math.ceil(120.0 / 11.0 / U)
    assert work < need == max(held)
    assert min(held[2 * len(cycle) :]) == need


def young(needs: list[float], start: float = 0.0) -> bursts.Bursts:
    """Samples every 5 s from `start` with these fast needs (no burst memory)."""
    s = bursts.Bursts()
    for i, need in enumerate(needs):
        s = bursts.record(s, start + 5.0 * i, need, 0.0, window_s=900.0)
    return s


def test_a_young_bursty_service_holds_its_largest_need_times_its_burstiness() -> None:
    """A first burst (need 4 for 30 s) then quiet: peak 4 over a mean of 24 / 30 = 0.8 is a
    burstiness of 4 / (2 x 0.8) = 2.5; 145 s after the first traffic the margin has faded by
    145 / 900, so the floor holds 4 x (1 + 1.5 x 755 / 900)."""
    s = young([4.0] * 6 + [0.0] * 24)
    assert s.since == 0.0
    assert bursts.young_need(s, 145.0, 900.0, 4.0) == pytest.approx(4.0 * (1 + 1.5 * 755 / 900))
    # the burstiness is capped at the margin: a long quiet makes it 8, held at most 3 times
    s = young([4.0] * 6 + [0.0] * 90)
    capped = 4.0 * (1 + 2.0 * (900 - 475) / 900)
    assert bursts.young_need(s, 475.0, 900.0, 3.0) == pytest.approx(capped)
    assert bursts.young_need(s, 475.0, 900.0, 1.0) is None  # no margin asked for
    assert bursts.young_need(s, 900.0, 900.0, 4.0) is None  # one window old: no longer young


def test_smooth_traffic_ramps_and_idle_before_the_first_request_hold_no_margin() -> None:
    assert (
        young([0.0] * 10).since is None
        and bursts.young_need(young([0.0] * 10), 45.0, 900.0, 4.0) is None
    )
    steady = young([2.0, 2.2, 1.9, 2.1] * 10)
    assert bursts.young_need(steady, 195.0, 900.0, 4.0) is None
    ramp = young([0.1 * i for i in range(1, 41)])  # peak = 2 x mean - 0.1: not bursty
    assert bursts.young_need(ramp, 195.0, 900.0, 4.0) is None
    # ten idle minutes before the first request are no history: steady traffic from then on
    late = young([0.0] * 120 + [2.0] * 10)
    assert late.since == 600.0 and bursts.young_need(late, 645.0, 900.0, 4.0) is None


def test_a_young_service_finds_its_second_larger_burst_standing() -> None:
    """From idle, a first burst of 10 req/s (2 replicas busy) for 30 s, quiet for 2 minutes,
    then a burst of 40 req/s (8 busy): with the margin the quiet holds more than the first burst
    needed, without it the fleet falls back to 1; a service older than one window holds none."""
    quiet, first, second = (0.0, 0.0), (10.0, 1.0), (40.0, 4.0)
    loads = [quiet] * 2 + [first] * 6 + [quiet] * 24 + [second]
    held = drive(replace(YOUNG, down_window_s=10), loads, current=1)
    alone = drive(replace(TUNED, down_window_s=10), loads, current=1)
    assert alone[-2] == 1 and held[-2] > math.ceil(10 * 0.2 / U)
    s = young([2.0] * 6 + [0.0] * 24, start=10.0)
    assert held[-2] == math.ceil(bursts.young_need(s, 155.0, 900.0, YOUNG.young_margin) / U - 1e-9)
    old = drive(replace(YOUNG, down_window_s=10), [(1.0, 1.0)] * 180 + loads[2:-1], current=1)
    assert old[-1] == 1


def test_the_young_margin_says_so() -> None:
    samples, history, current = bursts.Bursts(), ((0.0, 1),), 1
    for i, (fast, slow) in enumerate([(10.0, 1.0)] * 6 + [(0.0, 0.0)] * 18, start=1):
        d = decide(YOUNG, reading(fast, slow), current=current, ready=current, history=history,
                   now=5.0 * i, bursts=samples)  # fmt: skip
        samples, history, current = d.bursts, d.history, d.replicas
    assert d.reason == "BurstFloor" and "young service" in d.message, d.message
