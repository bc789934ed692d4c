"""The autoscaling policy (operator/autoscale.py), table-driven: tolerance, rate limit, both
stabilization windows, clamps, missing and stale data, not-ready replicas, KV cache, alert steps,
and a noisy closed-loop sequence that must not make the replicas oscillate."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from pagoda.operator.autoscaling.bursts import Bursts
from pagoda.operator.autoscaling.demand import DRAIN_S, demand_floor, request_work
from pagoda.operator.autoscaling.policy import (
    Decision,
    Metrics,
    Policy,
    alert_step,
    decide,
)
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import AutoscalingSpec, InferenceServiceSpec

TTFT = Policy(min_replicas=1, max_replicas=10, target_ttft_s=0.5, down_window_s=0)
QUEUE = Policy(min_replicas=1, max_replicas=10, target_queue=2.0, down_window_s=0)


def ttft(seconds: float | None, waiting: float = 0.0, **kw: float) -> Metrics:
    return Metrics(ttft_p95_s=seconds, waiting=waiting, **kw)


def run(policy: Policy, m: Metrics | None, current: int, ready: int | None = None) -> Decision:
    ready = current if ready is None else ready
    return decide(policy, m, current=current, ready=ready, history=(), now=1000.0)


@pytest.mark.parametrize(
    ("policy", "metrics", "current", "ready", "want", "reason"),
    [
        # tolerance band: |ratio - 1| <= 0.1 changes nothing
        (TTFT, ttft(0.54), 4, 4, 4, "WithinTolerance"),
        (TTFT, ttft(0.46), 4, 4, 4, "WithinTolerance"),
        (TTFT, ttft(0.55), 4, 4, 4, "WithinTolerance"),  # exactly 1.1
        (TTFT, ttft(0.58), 4, 4, 5, "TTFTAboveTarget"),  # ceil(4 x 1.16)
        (TTFT, ttft(0.35), 4, 4, 3, "BelowTarget"),  # ceil(4 x 0.7)
        (replace(TTFT, tolerance=0.5), ttft(0.7), 4, 4, 4, "WithinTolerance"),
        # rate limit: at most double per step
        (TTFT, ttft(2.5), 2, 2, 4, "TTFTAboveTarget"),
        (TTFT, ttft(5.0), 1, 1, 2, "TTFTAboveTarget"),
        (QUEUE, ttft(None, waiting=60), 3, 3, 6, "QueueAboveTarget"),
        # clamps
        (replace(TTFT, max_replicas=5), ttft(1.5), 3, 3, 5, "TTFTAboveTarget"),
        (replace(TTFT, max_replicas=4), ttft(9.0), 4, 4, 4, "AtMaxReplicas"),
        (replace(TTFT, min_replicas=2), ttft(0.01), 4, 4, 2, "BelowTarget"),
        (replace(TTFT, max_replicas=3), ttft(0.3), 6, 6, 3, "BelowTarget"),  # ceil(3.6) > max
        (replace(TTFT, max_replicas=3), ttft(0.5), 6, 6, 3, "OutsideBounds"),  # spec changed
        (replace(TTFT, min_replicas=3), ttft(0.5), 1, 1, 3, "OutsideBounds"),
        # queue depth per ready replica
        (QUEUE, ttft(None, waiting=12), 2, 2, 4, "QueueAboveTarget"),  # 6/replica vs 2
        (QUEUE, ttft(None, waiting=4), 2, 2, 2, "WithinTolerance"),
        (QUEUE, ttft(None, waiting=0), 5, 5, 1, "BelowTarget"),
        (replace(QUEUE, target_queue=0.0), ttft(None, waiting=1), 3, 3, 6, "QueueAboveTarget"),
        (replace(QUEUE, target_queue=0.0), ttft(None, waiting=0), 3, 3, 1, "BelowTarget"),
        # both targets: the larger ratio wins
        (replace(TTFT, target_queue=2.0), ttft(0.5, waiting=24), 4, 4, 8, "QueueAboveTarget"),
        (replace(TTFT, target_queue=2.0), ttft(1.0, waiting=0), 3, 3, 6, "TTFTAboveTarget"),
        # no first token in the window: idle when nothing waits, neutral when something does
        (TTFT, ttft(None, waiting=0), 4, 4, 1, "BelowTarget"),
        (TTFT, ttft(None, waiting=3), 4, 4, 4, "WithinTolerance"),
        # missing, stale, no ready replica: hold
        (TTFT, None, 4, 4, 4, "MetricsUnavailable"),
        (TTFT, ttft(0.01, age_s=61), 4, 4, 4, "MetricsUnavailable"),
        (TTFT, ttft(9.0, age_s=61), 4, 4, 4, "MetricsUnavailable"),  # stale overload: no scale up
        (TTFT, ttft(0.01, age_s=59), 4, 4, 1, "BelowTarget"),
        (TTFT, ttft(9.0), 2, 0, 2, "NoReadyReplicas"),
        # not-ready replicas: ready ones are the base, and no scale down while some start
        (TTFT, ttft(0.75), 4, 2, 4, "ReplicasStarting"),  # ceil(2 x 1.5) = 3 < 4: wait
        (TTFT, ttft(0.1), 4, 2, 4, "ReplicasStarting"),
        (TTFT, ttft(1.5), 4, 2, 6, "TTFTAboveTarget"),  # ceil(2 x 3): the ready two are overloaded
        (QUEUE, ttft(None, waiting=4), 4, 1, 4, "ReplicasStarting"),  # 4 waiting on 1 ready: 2x
        (QUEUE, ttft(None, waiting=8), 4, 2, 4, "ReplicasStarting"),  # 4 replicas will serve 8
        (QUEUE, ttft(None, waiting=16), 4, 2, 8, "QueueAboveTarget"),  # 8/ready replica
        # scale down keeps the fullest KV cache under 90 %; it never limits scale up
        (TTFT, ttft(0.1, kv_cache_usage=0.95), 4, 4, 4, "KVCacheHigh"),
        (TTFT, ttft(0.1, kv_cache_usage=0.5), 4, 4, 3, "KVCacheHigh"),  # ceil(4 x 0.5 / 0.9)
        (TTFT, ttft(0.1, kv_cache_usage=0.2), 4, 4, 1, "BelowTarget"),
        (TTFT, ttft(None, kv_cache_usage=0.95), 4, 4, 1, "BelowTarget"),  # idle: stale gauge
        (TTFT, ttft(1.0, kv_cache_usage=0.99), 4, 4, 8, "TTFTAboveTarget"),
    ],
)
def test_single_decision(
    policy: Policy, metrics: Metrics | None, current: int, ready: int, want: int, reason: str
) -> None:
    d = run(policy, metrics, current, ready)
    assert (d.replicas, d.reason) == (want, reason), d.message


def test_not_ready_replicas_are_not_read_as_overload() -> None:
    """The naive rule (current x ratio) would add replicas for capacity already on its way."""
    m = ttft(0.75)  # 1.5 x target measured on the 2 ready replicas of 4
    assert run(TTFT, m, current=4, ready=2).replicas == 4
    assert run(TTFT, m, current=4, ready=4).replicas == math.ceil(4 * 1.5)


def seq(policy: Policy, steps: list[tuple[float, Metrics | None]], current: int) -> list[int]:
    """Feed (time, metrics) readings through decide(), applying each decision."""
    history: tuple[tuple[float, int], ...] = ((0.0, current),)
    out = []
    for t, m in steps:
        d = decide(policy, m, current=current, ready=current, history=history, now=t)
        history, current = d.history, d.replicas
        out.append(current)
    return out


def test_scale_down_waits_for_the_down_window_and_takes_the_windows_highest() -> None:
    p = replace(TTFT, down_window_s=300)
    # 6 replicas; load falls: recommendations 3 at t=100, 2 at t=200, 1 after
    steps = [(100.0, ttft(0.25)), (200.0, ttft(0.15)), (299.0, ttft(0.05)), (301.0, ttft(0.05))]
    steps += [(401.0, ttft(0.05)), (501.0, ttft(0.05))]
    # t=301: the seed (6 at t=0) left the window; highest left is 3 (t=100)
    assert seq(p, steps, current=6) == [6, 6, 6, 3, 2, 1]


def test_scale_up_window_takes_the_lowest_recommendation() -> None:
    p = replace(TTFT, up_window_s=60, down_window_s=300)
    steps = [(t, ttft(1.0)) for t in (30.0, 59.0, 61.0, 62.0, 121.0, 123.0)]
    # seeded with 2 at t=0: the window's lowest is 2 until t=60, then 4 (recommended at 2
    # replicas) until t=121, then 8 (recommended at 4)
    assert seq(p, steps, current=2) == [2, 2, 4, 4, 4, 8]


def test_a_brief_spike_inside_the_up_window_does_not_scale() -> None:
    p = replace(TTFT, up_window_s=60, down_window_s=300)
    steps = [(t, ttft(2.0 if t == 30 else 0.5)) for t in (15.0, 30.0, 45.0, 60.0, 75.0, 90.0)]
    assert seq(p, steps, current=3) == [3] * 6


def test_missing_metrics_hold_and_the_down_window_restarts_after_them() -> None:
    p = replace(TTFT, down_window_s=100)
    steps: list[tuple[float, Metrics | None]] = [(t, None) for t in (150.0, 200.0, 250.0)]
    steps += [(260.0, ttft(0.01)), (349.0, ttft(0.01)), (351.0, ttft(0.01))]
    # outage: held at 5 even though the seed left the window; afterwards the held count
    # (recorded at t=250) keeps the replicas until t=350
    assert seq(p, steps, current=5) == [5, 5, 5, 5, 5, 1]


def test_alert_step_adds_one_within_bounds_and_counts_for_the_down_window() -> None:
    p = replace(TTFT, max_replicas=4, down_window_s=120)
    d = alert_step(p, current=2, history=(), now=10.0)
    assert (d.replicas, d.reason) == (3, "AlertFiring")
    assert (alert_step(p, current=4, history=(), now=0.0).reason) == "AtMaxReplicas"
    assert alert_step(replace(p, min_replicas=3), current=1, history=(), now=0.0).replicas == 3
    # idle metrics right after the step: the step's recommendation holds it for the window
    after = decide(p, ttft(0.01), current=3, ready=3, history=d.history, now=60.0)
    assert after.replicas == 3 and after.reason == "Stabilizing"
    later = decide(p, ttft(0.01), current=3, ready=3, history=after.history, now=131.0)
    assert later.replicas == 1


def _closed_loop(policy: Policy, load: list[float], seed: int) -> list[int]:
    """TTFT ~ (load / replicas) x target x noise: a replica count matching the load hits target."""
    rng = random.Random(seed)
    current, history, out = 4, ((0.0, 4),), []
    for i, demand in enumerate(load):
        noise = max(0.2, rng.gauss(1.0, 0.25))
        m = ttft(policy.target_ttft_s * demand / current * noise)  # type: ignore[operator]
        d = decide(policy, m, current=current, ready=current, history=history, now=15.0 * i)
        history, current = d.history, d.replicas
        out.append(current)
    return out


def _changes(replicas: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(replicas) if a != b)


def _reversals(replicas: list[int]) -> int:
    steps = [b - a for a, b in itertools.pairwise(replicas) if b != a]
    return sum(1 for a, b in itertools.pairwise(steps) if (a > 0) != (b > 0))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noisy_metric_does_not_make_replicas_oscillate(seed: int) -> None:
    """Two hours of a steady 4-replica load measured with 25 % noise, every 15 s."""
    policy = Policy(min_replicas=1, max_replicas=10, target_ttft_s=0.5, down_window_s=300)
    naive = replace(policy, tolerance=0.0, down_window_s=0)
    load = [4.0] * 480
    ours, theirs = _closed_loop(policy, load, seed), _closed_loop(naive, load, seed)
    # the naive rule chases the noise; the windows and the band do not
    assert _reversals(theirs) > 100
    assert _reversals(ours) <= 12, ours
    assert _changes(ours) <= 24
    _assert_no_early_scale_down(ours, policy.down_window_s)
    assert min(ours) >= 3  # enough capacity throughout (4 replicas' worth of load)


def test_small_noise_inside_the_band_changes_nothing() -> None:
    rng = random.Random(7)
    policy = Policy(min_replicas=1, max_replicas=10, target_ttft_s=0.5, down_window_s=300)
    steps = [(15.0 * i, ttft(0.5 * rng.uniform(0.93, 1.07))) for i in range(1, 200)]
    assert set(seq(policy, steps, current=4)) == {4}


def _assert_no_early_scale_down(replicas: list[int], window_s: float) -> None:
    last_up = -math.inf
    for i, (a, b) in enumerate(itertools.pairwise(replicas), start=1):
        if b > a:
            last_up = 15.0 * i
        elif b < a:
            assert 15.0 * i - last_up >= window_s, replicas


def test_step_load_scales_up_fast_and_down_slowly() -> None:
    policy = Policy(min_replicas=1, max_replicas=16, target_ttft_s=0.5, down_window_s=300)
    load = [2.0] * 20 + [12.0] * 40 + [2.0] * 60
    replicas = _closed_loop(policy, load, seed=0)
    up_at = next(i for i, r in enumerate(replicas) if i >= 20 and r >= 12)
    assert up_at - 20 <= 3  # 4 -> 8 -> 16: two steps of x2
    _assert_no_early_scale_down(replicas, policy.down_window_s)
    assert replicas[60 + 300 // 15 - 2] >= 10  # still sized for the burst within the window
    assert replicas[-1] <= 3  # and back down afterwards


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_replicas": 0, "max_replicas": 3, "target_ttft_s": 1.0},
        {"min_replicas": 4, "max_replicas": 3, "target_ttft_s": 1.0},
        {"min_replicas": 1, "max_replicas": 3},
        {"min_replicas": 1, "max_replicas": 3, "target_ttft_s": 0.0},
        {"min_replicas": 1, "max_replicas": 3, "target_queue": -1.0},
        {"min_replicas": 1, "max_replicas": 3, "target_queue": 1.0, "tolerance": 1.5},
        {"min_replicas": 1, "max_replicas": 3, "target_queue": 1.0, "down_window_s": -1},
        {"min_replicas": 1, "max_replicas": 3, "target_queue": 1.0, "max_metric_age_s": 0},
    ],
)
def test_policy_rejects_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Policy(**kwargs)


def test_metrics_and_decision_validation() -> None:
    with pytest.raises(ValueError):
        Metrics(ttft_p95_s=-1.0, waiting=0)
    with pytest.raises(ValueError):
        Metrics(ttft_p95_s=float("nan"), waiting=0)
    with pytest.raises(ValueError):
        Metrics(ttft_p95_s=None, waiting=-1)
    with pytest.raises(ValueError):
        Decision(1, 1, "not camel", "")


def test_policy_from_the_spec() -> None:
    spec = InferenceServiceSpec.from_dict(
        {
            "model": "smollm2-135m",
            "autoscaling": {
                "minReplicas": 2, "maxReplicas": 6, "targetTTFTSeconds": 0.2,
                "targetQueueDepth": 3, "scaleUpStabilizationSeconds": 30,
                "scaleDownStabilizationSeconds": 120, "tolerance": 0.2,
                "prometheusURL": "http://prometheus.monitoring:9090",
            },
        },
        name="x", default_image="img",
    )  # fmt: skip
    assert spec.autoscaling is not None
    assert spec.autoscaling.prometheus_url == "http://prometheus.monitoring:9090"
    p = Policy.from_spec(spec.autoscaling, max_metric_age_s=45)
    assert p == Policy(2, 6, 0.2, 3.0, 0.2, 30, 120, 45)


@pytest.mark.parametrize(
    "bad",
    [
        {"tolerance": 2},
        {"tolerance": -0.1},
        {"prometheusURL": "prometheus:9090"},
        # a query swallowed the /api/v1/query appended to it; credentials do not belong in a spec
        {"prometheusURL": "http://internal.svc/admin?x="},
        {"prometheusURL": "http://prom:9090/#frag"},
        {"prometheusURL": "http://user:s3cret@prom:9090"},
    ],
)
def test_spec_rejects_bad_autoscaling_fields(bad: dict) -> None:
    with pytest.raises(SpecError) as e:
        AutoscalingSpec.from_dict({"maxReplicas": 2, "targetQueueDepth": 1, **bad})
    assert e.value.reason == "InvalidSpec" and "s3cret" not in e.value.message


def test_flat_ttft_below_saturation_does_not_saw_tooth() -> None:
    """TTFT is prefill time until the replicas saturate, then queueing explodes it. The ratio
    below 1 overstates the headroom; the KV-cache floor stops the scale down at the load."""
    policy = Policy(min_replicas=1, max_replicas=40, target_ttft_s=0.5, down_window_s=300)

    def run_with(kv: bool) -> list[int]:
        current, history, out = 40, ((0.0, 40),), []
        for i in range(1, 400):
            load = 10.0 / current  # 10 replicas' worth: per-replica utilisation
            m = ttft(
                0.33 if load < 1 else 0.33 + 20 * (load - 1),
                kv_cache_usage=min(1.0, load) if kv else None,
            )
            d = decide(policy, m, current=current, ready=current, history=history, now=15.0 * i)
            history, current = d.history, d.replicas
            out.append(current)
        return out

    without, with_kv = run_with(kv=False), run_with(kv=True)
    assert _reversals(without) >= 6  # down too far, overload, back up, ...
    assert _reversals(with_kv) == 0 and 11 <= with_kv[-1] <= 12, with_kv


# --- the predictive floors: demand (tuned V_P and V_D) and prefill ---------------------------

# A tuned profile's rates: a 100-token prompt and a 50-token output cost 0.1 + 0.1 = 0.2 s.
TUNED = Policy(
    min_replicas=1, max_replicas=40, target_ttft_s=0.5, target_queue=4.0, down_window_s=0,
    prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0, target_utilization=0.95,
)  # fmt: skip
U = TUNED.target_utilization  # the share of a replica's capacity the floors plan for


def load(rate: float, slow: float | None = None, **kw: float) -> Metrics:
    """A reading of a service at `rate` requests/s (recent) and `slow` (2 min), fast TTFT."""
    kw.setdefault("ttft_p95_s", 0.08)
    return Metrics(
        waiting=kw.pop("waiting", 0.0), mean_prompt_tokens=100.0, mean_output_tokens=50.0,
        arrival_rate=rate, arrival_rate_slow=rate if slow is None else slow, **kw,
    )  # fmt: skip


def test_demand_floor_arithmetic() -> None:
    assert request_work(100, 50, 1000.0, 500.0) == pytest.approx(0.2)
    assert request_work(None, 50, 1000.0, 500.0) is None
    assert request_work(100, 50, 1000.0, None) is None
    flat = demand_floor(work_s=0.2, waiting=0, arrival_rate=45.0, arrival_rate_slow=45.0,
                        utilization=0.9, lead_s=30.0)  # fmt: skip
    assert flat is not None and flat.replicas == 10  # 45 x 0.2 = 9 busy at 90 %
    rising = demand_floor(work_s=0.2, waiting=0, arrival_rate=45.0, arrival_rate_slow=30.0,
                          utilization=0.9, lead_s=30.0)  # fmt: skip
    # 15 req/s more over the 45 s between the windows: +10 req/s over the 30 s lead
    assert rising is not None and rising.arrival_rate == pytest.approx(55.0)
    assert rising.replicas == math.ceil(55 * 0.2 / 0.9)
    backlog = demand_floor(work_s=0.2, waiting=600, arrival_rate=45.0, arrival_rate_slow=45.0,
                           utilization=0.9, lead_s=30.0)  # fmt: skip
    assert backlog is not None and backlog.replicas == math.ceil((9 + 600 * 0.2 / DRAIN_S) / 0.9)
    assert demand_floor(work_s=None, waiting=0, arrival_rate=45.0, arrival_rate_slow=None,
                        utilization=0.9, lead_s=30.0) is None  # fmt: skip
    idle = demand_floor(work_s=None, waiting=0, arrival_rate=0.0, arrival_rate_slow=0.0,
                        utilization=0.9, lead_s=30.0)  # fmt: skip
    assert idle is not None and idle.replicas == 0  # nothing arrives, nothing waits: no need
    assert demand_floor(work_s=None, waiting=3, arrival_rate=0.0, arrival_rate_slow=0.0,
                        utilization=0.9, lead_s=30.0) is None  # fmt: skip


def test_the_backlog_of_n_sample_requests_counts_requests_not_sequences() -> None:
    """The waiting gauge counts sequences; 600 of them are 150 requests of n=4, and a request's
    work (its prompt once, its 4 samples' outputs together) is what the floor has per request:
    the backlog is 150 requests' work, not 600 (which would ask for 4x the replicas)."""
    d = run(TUNED, load(45.0, waiting=600.0, samples_per_request=4.0), current=10)
    assert d.replicas == math.ceil((45 * 0.2 + 150 * 0.2 / DRAIN_S) / U), d.message
    assert Metrics(ttft_p95_s=None, waiting=8.0, samples_per_request=4.0).waiting_requests == 2.0
    with pytest.raises(ValueError):
        Metrics(ttft_p95_s=None, waiting=0, samples_per_request=0.5)


def test_scale_down_stops_at_the_demand_not_at_the_ttft_ratio() -> None:
    """40 replicas, p95 TTFT 0.08 s (ratio 0.16): the ratio would keep ⌈40 × 0.16⌉ = 7, which the
    load (45 req/s × 0.2 s = 9 replicas busy) would overrun; the demand floor keeps 10."""
    d = run(TUNED, load(45.0), current=40)
    assert (d.replicas, d.reason) == (10, "DemandFloor"), d.message
    untuned = run(replace(TUNED, decode_tokens_per_s=None), load(45.0), current=40)
    assert untuned.replicas == 7  # no profile: the HPA-style ratio alone
    # long prompts: TTFT sits at 0.7 of the target whatever the fleet (prefill time, not
    # queueing); the ratio would hold ⌈40 × 0.7⌉ = 28 replicas, the demand needs 10
    prompts = run(TUNED, load(45.0, ttft_p95_s=0.35), current=40)
    assert (prompts.replicas, prompts.reason) == (10, "DemandFloor"), prompts.message


def test_rising_arrivals_scale_up_before_ttft_moves() -> None:
    """The arrival rate doubles within two minutes while TTFT is still fine: the floor adds the
    replicas the load will need by the time they are ready."""
    steady = run(TUNED, load(45.0), current=10)
    assert steady.replicas == 10
    rising = run(TUNED, load(60.0, slow=45.0), current=10)
    assert rising.reason == "DemandFloor" and rising.replicas == math.ceil(70 * 0.2 / U)


def test_a_gone_backlog_in_the_ttft_window_does_not_scale_up() -> None:
    """p95 TTFT of the last minute is 3 s, but nothing waits any more: the burst is served and the
    demand floor sizes the fleet (no ×2 step on a stale ratio)."""
    cleared = run(TUNED, load(45.0, ttft_p95_s=3.0), current=12)
    assert (cleared.replicas, cleared.correction) == (10, 1.0), cleared.message


def test_a_served_burst_with_nothing_arriving_does_not_scale_up() -> None:
    """The last minute's p95 TTFT is 15 s from a burst already served, nothing arrives and
    nothing waits: the demand is zero, so the replicas do not run up on the stale p95 (the
    TTFT ratio alone would double them)."""
    idle = Metrics(ttft_p95_s=15.0, waiting=0.0, arrival_rate=0.0, arrival_rate_slow=3.0)
    d = run(TUNED, idle, current=24)
    assert (d.replicas, d.reason) == (1, "BelowTarget"), d.message
    assert run(replace(TUNED, decode_tokens_per_s=None), idle, current=24).replicas == 40


def test_the_correction_learns_at_the_same_pace_whatever_the_interval() -> None:
    """A minute of overload at the floor makes a request cost 1.1^4 more, evaluated every 15 s
    or every 5 s."""

    def learn(step: float) -> float:
        current, correction, history = 12, 1.0, ((0.0, 12),)
        for i in range(1, round(60 / step) + 1):
            m = load(45.0, ttft_p95_s=3.0, waiting=100.0)
            d = decide(TUNED, m, current=current, ready=current, history=history, now=step * i,
                       correction=correction)  # fmt: skip
            current, correction, history = d.replicas, d.correction, d.history
        return correction

    assert learn(15.0) == pytest.approx(1.1**4) and learn(5.0) == pytest.approx(1.1**4)


def test_a_fleet_at_the_floor_that_still_queues_learns_the_profile_is_optimistic() -> None:
    """All the floor's replicas serve and requests still wait with TTFT over target: each such
    evaluation makes a request cost 10 % more, so the floor grows until the queue stops; without
    overload the correction decays slowly back to the profile's numbers."""
    current, correction, seen = 12, 1.0, []
    for i in range(4):
        m = load(45.0, ttft_p95_s=3.0, waiting=100.0)
        d = decide(TUNED, m, current=current, ready=current, history=(), now=15.0 * i,
                   correction=correction)  # fmt: skip
        current, correction = d.replicas, d.correction
        seen.append((current, round(correction, 3)))
    assert [c for _, c in seen] == [1.1, 1.21, 1.331, 1.464]
    assert [n for n, _ in seen] == sorted(n for n, _ in seen) and seen[-1][0] > 12
    starting = decide(TUNED, load(45.0, ttft_p95_s=3.0, waiting=100.0), current=20, ready=10,
                      history=(), now=0.0, correction=1.2)  # fmt: skip
    assert starting.correction < 1.2  # replicas still starting: no evidence against the profile
    calm = decide(TUNED, load(45.0), current=current, ready=current, history=(), now=99.0,
                  correction=correction)  # fmt: skip
    assert 1.0 < calm.correction < correction


def test_prefill_floor_scales_up_ahead_of_a_queue_the_budget_cannot_hold() -> None:
    """TTFT has not risen yet (0.2 s) but 3000 prompt tokens wait: at V_P 1000 tok/s and a
    budget of 0.5 − 100/1000 = 0.4 s they need ⌈3 / 0.4⌉ = 8 replicas now, past the ×2 cap."""
    m = load(5.0, ttft_p95_s=0.2, waiting=30.0, queued_prompt_tokens=3000.0)
    d = run(replace(TUNED, target_queue=None, decode_tokens_per_s=None), m, current=2)
    assert (d.replicas, d.reason) == (8, "PrefillFloor"), d.message


def test_scale_down_is_held_while_a_floor_says_the_fleet_is_needed() -> None:
    """A long quiet TTFT (ratio 0.1) over the whole down window: the replicas fall to the demand
    floor after the window and stay there while the load lasts."""
    p = replace(TUNED, down_window_s=180)
    steps = [(15.0 * i, load(45.0, ttft_p95_s=0.05)) for i in range(1, 30)]
    out = seq(p, steps, current=30)
    assert out[: 180 // 15 - 1] == [30] * (180 // 15 - 1)  # the window holds the seed
    assert out[-1] == 10 and min(out) == 10


def test_step_load_with_the_demand_floor_tracks_the_load_without_oscillating() -> None:
    """Closed loop: TTFT flat until the fleet saturates, arrivals 20 → 90 → 20 req/s. The floor
    reaches the load's size at once, and settles back without a saw-tooth."""
    p = replace(TUNED, down_window_s=180)
    current, history, out = 5, ((0.0, 5),), []
    prev = 20.0
    for i in range(1, 200):
        rate = 90.0 if 40 <= i < 120 else 20.0
        busy = rate * 0.2
        ttft_p95 = 0.08 if busy <= current else 0.08 + 5 * (busy / current - 1)
        m = load(rate, slow=prev, ttft_p95_s=ttft_p95,
                 waiting=0.0 if busy <= current else 50.0 * (busy - current))  # fmt: skip
        prev = 0.75 * prev + 0.25 * rate  # the 2-minute rate lags
        d = decide(p, m, current=current, ready=current, history=history, now=15.0 * i)
        history, current = d.history, d.replicas
        out.append(current)
    need = math.ceil(90 * 0.2 / U)
    assert out[40] >= need  # the first evaluation after the step
    assert max(out) <= 2 * need  # no run to maxReplicas
    assert _reversals(out) <= 4, out
    assert out[-1] == math.ceil(20 * 0.2 / U)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decode_tokens_per_s": 0.0},
        {"prefill_tokens_per_s": -1.0},
        {"target_utilization": 0.0},
        {"target_utilization": 1.5},
        {"lead_s": -1.0},
    ],
)
def test_policy_rejects_bad_floor_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        replace(TUNED, **kwargs)


def test_metrics_reject_negative_rates() -> None:
    with pytest.raises(ValueError):
        Metrics(ttft_p95_s=None, waiting=0, arrival_rate=-1.0)
    with pytest.raises(ValueError):
        Metrics(ttft_p95_s=None, waiting=0, mean_output_tokens=float("nan"))


@pytest.mark.parametrize(
    ("policy", "metrics"),
    [
        (  # ∞ − ∞ in the demand floor's extrapolation: once "cannot convert float NaN to integer"
            Policy(
                min_replicas=3,
                max_replicas=39,
                target_ttft_s=5.0,
                target_queue=4.0,
                tolerance=1,
                prefill_tokens_per_s=1e-09,
                decode_tokens_per_s=500.0,
            ),
            Metrics(
                ttft_p95_s=3.0,
                waiting=1e300,
                kv_cache_usage=0.0,
                mean_prompt_tokens=1e300,
                mean_output_tokens=1.0,
                arrival_rate=0.0,
                arrival_rate_slow=1e6,
                arrival_rate_fast=1e300,
            ),
        ),
        (  # a product past the largest float: once "cannot convert float infinity to integer"
            Policy(
                min_replicas=5,
                max_replicas=37,
                target_ttft_s=5.0,
                target_queue=4.0,
                tolerance=0,
                prefill_tokens_per_s=1e-09,
                decode_tokens_per_s=1e-09,
            ),
            Metrics(
                ttft_p95_s=1e6,
                waiting=0.0,
                kv_cache_usage=1.5,
                queued_prompt_tokens=1.7e308,
                arrival_rate=1.0,
                arrival_rate_slow=1.7e308,
                arrival_rate_fast=1e-300,
            ),
        ),
        (  # the KV-cache floor of a scale down
            Policy(min_replicas=1, max_replicas=8, target_ttft_s=5.0, down_window_s=0),
            Metrics(ttft_p95_s=0.1, waiting=0.0, kv_cache_usage=1e308),
        ),
    ],
)
def test_absurd_finite_readings_saturate_at_the_bounds(policy: Policy, metrics: Metrics) -> None:
    """Finite but absurd numbers (a broken exporter's 1e300) make needs too large to count: they
    saturate (then clamp to maxReplicas) instead of raising out of math.ceil."""
    history, bursts = ((0.0, 6),), Bursts()
    for now in (1.0, 2.0, 20.0):
        d = decide(policy, metrics, current=6, ready=6, history=history, now=now, bursts=bursts)
        history, bursts = d.history, d.bursts
        assert policy.min_replicas <= d.replicas <= policy.max_replicas


@pytest.mark.parametrize(
    ("bounds", "current", "ready", "ttft"),
    [
        ((1, 4), 6, 6, 2.0),  # maxReplicas lowered under load: once "TTFTAboveTarget" (down)
        ((1, 4), 6, 4, 0.4),  # ... while replicas start: once "ReplicasStarting"
        ((3, 8), 1, 1, 0.1),  # minReplicas raised while idle: once "BelowTarget" (up)
        ((1, 4), 6, 6, 0.5),
    ],
)
def test_a_move_into_new_bounds_says_outside_bounds(
    bounds: tuple[int, int], current: int, ready: int, ttft: float
) -> None:
    """When the bounds alone decide the count (edited live, or a hand-scaled Deployment), the
    reason says so, not a metric pointing the other way."""
    policy = Policy(min_replicas=bounds[0], max_replicas=bounds[1], target_ttft_s=0.5)
    d = decide(
        policy, Metrics(ttft_p95_s=ttft, waiting=0.0), current=current, ready=ready,
        history=((0.0, current),), now=1.0,
    )  # fmt: skip
    assert (d.replicas, d.reason) == (policy.clamp(current), "OutsideBounds")
