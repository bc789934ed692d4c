"""The autoscaling policy: metrics → desired replicas. Pure (no I/O, no clock); loop.py runs it.

The HPA's algorithm, on what users feel instead of CPU:

* ratio = the largest of p95 TTFT / `targetTTFTSeconds` and waiting requests per ready replica /
  `targetQueueDepth`; within the tolerance band (|ratio − 1| ≤ 10 %) nothing changes;
* recommendation = ⌈ready × ratio⌉ clamped to [minReplicas, maxReplicas]. The base is the *ready*
  replicas, the ones that produced the numbers: a replica still loading its model served nothing,
  so its cold start is neither counted as capacity nor read as overload, and while any replica is
  starting the policy never scales down;
* scale up to the lowest recommendation of the scale-up window (default 0 s: now), at most ×2 per
  step; scale down only to the highest recommendation of the scale-down window (default 300 s);
* missing or stale metrics hold the current count and record it as a recommendation, so a scale
  down also waits a full window after the metrics come back;
* TTFT barely moves until a replica saturates, then shoots up, so a ratio below 1 overstates
  how far one can scale down: a scale down never goes below what keeps the fullest KV cache
  under 90 % (a load-proportional floor; benchmarks/autoscale_sim.py shows the saw-tooth
  without it);
* with a tuned profile's prefill *and* decode rates (V_P, V_D) the **demand floor** (demand.py)
  sizes the fleet instead, up and down: the arrival rate, extrapolated over the lead time while it
  climbs, times what a request of the recent mean lengths costs a replica (ISL/V_P + OSL/V_D),
  plus the backlog, at `target_utilization` (default all) of the measured capacity. A ratio over target then only says the load outran the
  fleet, not by how much (a drained backlog keeps the minute's p95 high), so it no longer
  extrapolates; a fleet at the floor that still queues raises a learned capacity correction
  (demand.learn_correction) that the caller keeps like the history. The floor is not held to the
  ×2 step: it is a measured need;
* with the demand floor, the **burst floor** (bursts.py): while bursts recur (two or more rises of
  the 15 s arrival rate above twice the 2-minute one within `burst_window_s`), never fewer than
  the largest 15 s need of that window (its work, or the prefill of its clump of prompt tokens
  within the TTFT budget when larger), so the next burst finds its capacity standing; bursts
  farther apart at a steady interval are scheduled: their need is held while the next is due;
  and for `burst_window_s` after a service starts taking traffic, while what it has shown is
  bursty, its largest need times its burstiness (at most `young_margin`), fading to none over
  the window: with no history, the next burst may be several times the largest seen;
* with V_P alone (an older profile), never fewer replicas than prefill the queued prompt tokens
  within the TTFT target (autotune/floor.py, llm-d's `TTFT_target − ISL/V_P` rule): it acts when
  the queue forms, before TTFT rises.

floors.py applies the three floors to a recommendation (this module computes the ratio's).

History is a tuple of (time, recommendation) pairs that each decision returns updated, with the
capacity correction and the burst samples; the caller keeps all three (one per InferenceService)
and passes a monotonic clock reading.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagoda.operator.autoscaling import bursts as bursts_mod
from pagoda.operator.autoscaling.floors import measured_demand, raise_to_floor
from pagoda.operator.autotune.floor import ceil_replicas
from pagoda.operator.spec.scaling import DEFAULT_TOLERANCE, AutoscalingSpec

if TYPE_CHECKING:
    from pagoda.operator.autoscaling.demand import Demand

MAX_SCALE_UP_FACTOR = 2  # at most double per step
KV_CACHE_HIGH = 0.9  # scale down keeps the fullest KV cache below this
_MAX_RATIO = 1e6  # stands in for "infinitely over target" (target queue depth 0)

History = tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class Policy:
    """Bounds and targets of one InferenceService (from `spec.autoscaling`)."""

    min_replicas: int
    max_replicas: int
    target_ttft_s: float | None = None
    target_queue: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    up_window_s: float = 0.0
    down_window_s: float = 300.0
    max_metric_age_s: float = 60.0
    prefill_tokens_per_s: float | None = None  # V_P of a tuned profile: the predictive floor
    decode_tokens_per_s: float | None = None  # V_D of a tuned profile: the demand floor
    target_utilization: float = 1.0  # share of a replica's measured capacity the floor plans for
    lead_s: float = 30.0  # how far ahead the demand floor extrapolates a rising arrival rate
    burst_window_s: float = 900.0  # the burst floor's memory (0: no burst floor)
    burst_memory_s: float = 7200.0  # how long bursts are remembered to schedule the next (0: not)
    young_margin: float = bursts_mod.YOUNG_MARGIN  # a young bursty service's headroom (1: none)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}"
            )
        if self.target_ttft_s is None and self.target_queue is None:
            raise ValueError("need target_ttft_s or target_queue")
        if self.target_ttft_s is not None and self.target_ttft_s <= 0:
            raise ValueError(f"target_ttft_s must be positive, got {self.target_ttft_s}")
        if self.target_queue is not None and self.target_queue < 0:
            raise ValueError(f"target_queue must be >= 0, got {self.target_queue}")
        if not 0 <= self.tolerance <= 1:
            raise ValueError(f"tolerance must be in [0, 1], got {self.tolerance}")
        if min(self.up_window_s, self.down_window_s) < 0:
            raise ValueError("windows must be >= 0")
        if self.max_metric_age_s <= 0:
            raise ValueError("max_metric_age_s must be > 0")
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.lead_s < 0:
            raise ValueError(f"lead_s must be >= 0, got {self.lead_s}")
        if self.burst_window_s < 0:
            raise ValueError(f"burst_window_s must be >= 0, got {self.burst_window_s}")
        if self.burst_memory_s < 0:
            raise ValueError(f"burst_memory_s must be >= 0, got {self.burst_memory_s}")
        if not self.young_margin >= 1:
            raise ValueError(f"young_margin must be >= 1, got {self.young_margin}")

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec, *, max_metric_age_s: float = 60.0) -> Policy:
        return cls(
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            target_ttft_s=spec.target_ttft_seconds,
            target_queue=spec.target_queue_depth,
            tolerance=spec.tolerance,
            up_window_s=spec.scale_up_stabilization_seconds,
            down_window_s=spec.scale_down_stabilization_seconds,
            max_metric_age_s=max_metric_age_s,
        )

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class Metrics:
    """One reading from Prometheus for one InferenceService (all replicas together).

    Units: `waiting` and `running` are the runtime's gauges, in **sequences** (a request with
    `n` samples is `n` of them; `targetQueueDepth` is per those, as vLLM's gauge). Everything
    the demand floor uses is per **request** (a prompt with its `n` samples): the arrival
    rates, the mean lengths (a request's prompt once, its samples' outputs together) and the
    queued prompt tokens; `samples_per_request` (mean `n`) converts the waiting sequences into
    the requests of the floor's backlog.
    """

    ttft_p95_s: float | None  # None: no first token in the window (idle, or nothing scheduled)
    waiting: float  # sequences waiting, summed over the replicas
    kv_cache_usage: float | None = None  # the fullest replica, 0..1
    age_s: float = 0.0  # age of the newest sample
    queued_prompt_tokens: float | None = None  # prompt tokens of the waiting requests
    mean_prompt_tokens: float | None = None  # ISL of the recent requests
    mean_output_tokens: float | None = None  # OSL of the recent requests (all samples)
    arrival_rate: float | None = None  # requests/s arriving, recent (30 s)
    arrival_rate_slow: float | None = None  # requests/s arriving (2 min)
    arrival_rate_fast: float | None = None  # requests/s arriving (15 s): the burst floor
    running: float | None = None  # sequences being served, summed (None: unknown)
    samples_per_request: float = 1.0  # mean `n` of the recent requests (>= 1)

    def __post_init__(self) -> None:
        if self.waiting < 0 or self.age_s < 0:
            raise ValueError("waiting and age_s must be >= 0")
        rates = ("arrival_rate", "arrival_rate_slow", "arrival_rate_fast")
        for name in ("running", "mean_output_tokens", *rates):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")
        if self.ttft_p95_s is not None and not (self.ttft_p95_s >= 0):
            raise ValueError(f"ttft_p95_s must be >= 0 or None, got {self.ttft_p95_s}")
        if not self.samples_per_request >= 1:
            raise ValueError(f"samples_per_request must be >= 1, got {self.samples_per_request}")

    @property
    def waiting_requests(self) -> float:
        """The requests of the waiting sequences (their samples wait together)."""
        return self.waiting / self.samples_per_request


@dataclass(frozen=True)
class Decision:
    replicas: int  # what the Deployment should run now
    recommendation: int | None  # this evaluation's raw recommendation (None: held)
    reason: str  # CamelCase, e.g. TTFTAboveTarget, WithinTolerance, MetricsUnavailable
    message: str
    ratio: float | None = None
    queue_per_replica: float | None = None
    history: History = ()
    correction: float = 1.0  # the demand floor's learned capacity correction (keep, pass back)
    bursts: bursts_mod.Bursts = dataclasses.field(default_factory=bursts_mod.Bursts)

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")
        if not self.reason[:1].isupper() or not self.reason.isalnum():
            raise ValueError(f"reason must be CamelCase, got {self.reason!r}")


def ratios(policy: Policy, m: Metrics, ready: int) -> dict[str, float]:
    """Metric / target for each configured target (`ttft`, `queue`); `ready` must be >= 1."""
    out: dict[str, float] = {}
    if policy.target_ttft_s is not None:
        if m.ttft_p95_s is not None:
            out["ttft"] = m.ttft_p95_s / policy.target_ttft_s
        else:  # no first token in the window: idle if nothing waits or runs, else unknown
            # (neutral): long decodes, or a Prometheus restarted without the rate's history
            out["ttft"] = 1.0 if m.waiting > 0 or (m.running or 0.0) > 0 else 0.0
    if policy.target_queue is not None:
        per = m.waiting / ready
        if policy.target_queue > 0:
            out["queue"] = per / policy.target_queue
        else:
            out["queue"] = _MAX_RATIO if per > 0 else 0.0
    return {k: min(v, _MAX_RATIO) for k, v in out.items()}


def _prune(history: History, now: float, policy: Policy) -> History:
    keep = max(policy.up_window_s, policy.down_window_s)
    return tuple((t, r) for t, r in history if now - t <= keep)


def _stabilize(
    policy: Policy, current: int, rec: int, history: History, now: float
) -> tuple[int, History]:
    """HPA behaviour: up to the window's lowest recommendation, down to its highest."""
    history = (*_prune(history, now, policy), (now, rec))
    up = min(r for t, r in history if now - t <= policy.up_window_s)
    down = max(r for t, r in history if now - t <= policy.down_window_s)
    if up > current:
        return min(up, MAX_SCALE_UP_FACTOR * max(current, 1)), history
    if down < current:
        return down, history
    return current, history


def _hold(
    policy: Policy,
    current: int,
    history: History,
    now: float,
    reason: str,
    message: str,
    correction: float = 1.0,
    bursts: bursts_mod.Bursts = bursts_mod.Bursts(),
) -> Decision:
    """Keep the current count and record it, so no scale down follows straight after."""
    held = policy.clamp(current)
    history = (*_prune(history, now, policy), (now, held))
    return Decision(
        held, None, reason, message, history=history, correction=correction, bursts=bursts
    )


def decide(
    policy: Policy,
    metrics: Metrics | None,
    *,
    current: int,
    ready: int,
    history: History,
    now: float,
    unavailable: str = "no metrics",
    correction: float = 1.0,
    bursts: bursts_mod.Bursts = bursts_mod.Bursts(),
) -> Decision:
    """Desired replicas for this evaluation. `metrics` None means unavailable (`unavailable` says
    why). `correction` and `bursts`: the previous decision's (1.0 and Bursts() at first)."""
    base = min(ready, current)
    held = _unusable(policy, metrics, base, unavailable)
    if held is not None:
        return _hold(policy, current, history, now, *held, correction, bursts)
    assert metrics is not None  # _unusable holds without metrics
    name, ratio = max(ratios(policy, metrics, base).items(), key=lambda kv: kv[1])
    demand, correction, bursts = measured_demand(
        policy, metrics, ratio, current=current, ready=ready, history=history, now=now,
        correction=correction, bursts=bursts,
    )  # fmt: skip
    rec, reason, floor = _recommendation(policy, metrics, name, ratio, base, current, ready, demand)
    desired, reason, history = _settle(policy, current, rec, reason, floor, history, now)
    queue_per = metrics.waiting / base
    detail = _describe(policy, metrics, queue_per)
    if demand is not None:
        detail += f", {demand.describe()}"
    message = f"{detail}; ratio {ratio:.2f} ({name}); {base} ready of {current}; recommend {rec}"
    return Decision(
        desired, rec, reason, message, ratio=ratio, queue_per_replica=queue_per, history=history,
        correction=correction, bursts=bursts,
    )  # fmt: skip


def _unusable(
    policy: Policy, metrics: Metrics | None, base: int, unavailable: str
) -> tuple[str, str] | None:
    """Why this evaluation holds the current count, as (reason, message); None: it need not."""
    if metrics is None:
        return "MetricsUnavailable", unavailable
    if metrics.age_s > policy.max_metric_age_s:
        msg = f"newest sample is {metrics.age_s:.0f} s old (> {policy.max_metric_age_s:.0f} s)"
        return "MetricsUnavailable", msg
    if base < 1:
        return "NoReadyReplicas", "no ready replica yet"
    return None


def _recommendation(
    policy: Policy,
    metrics: Metrics,
    name: str,
    ratio: float,
    base: int,
    current: int,
    ready: int,
    demand: Demand | None,
) -> tuple[int, str, int | None]:
    """This evaluation's recommendation and reason, and the predictive floor (None: none)."""
    rec, reason = _recommend(policy, name, ratio, base, current)
    if demand is not None:
        # With the load measured, the floors size the fleet, up and down: a ratio of TTFT or
        # queue depth only says the load outran the fleet, not by how much (a backlog keeps the
        # minute's p95 high after it has drained, and TTFT is flat below saturation). The demand
        # floor's backlog term and its learned correction are the feedback (measured_demand).
        rec, reason = policy.min_replicas, "BelowTarget"
    rec, reason = _hold_capacity(policy, metrics, base, current, ready, rec, reason)
    return raise_to_floor(policy, metrics, demand, rec, reason)


def _settle(
    policy: Policy, current: int, rec: int, reason: str, floor: int | None, history: History,
    now: float,
) -> tuple[int, str, History]:  # fmt: skip
    """The replicas to run now: the recommendation through the stabilization windows and the ×2
    step, the floor and the bounds; the reason, and the history to keep."""
    desired, history = _stabilize(policy, current, rec, history, now)
    if floor is not None and floor > desired:  # a measured need, not a ratio: no ×2 step cap
        desired = floor
    wanted, desired = desired, policy.clamp(desired)
    if desired == current and rec != current:
        reason = "Stabilizing"
    elif desired != current and (desired != wanted or reason == "WithinTolerance"):
        # the spec's bounds moved past the count the metrics would keep (edited live, or a hand
        # edit): they decide (a scale down "TTFTAboveTarget" or up "BelowTarget" would mislead)
        reason = "OutsideBounds"
    return desired, reason, history


def _recommend(policy: Policy, name: str, ratio: float, base: int, current: int) -> tuple[int, str]:
    """The replicas the largest ratio asks for (none within tolerance), with the reason."""
    if abs(ratio - 1.0) <= policy.tolerance + 1e-9:
        rec, reason = policy.clamp(current), "WithinTolerance"
    else:
        rec = policy.clamp(ceil_replicas(base * ratio))
        above = ratio > 1.0
        reason = (
            {"ttft": "TTFTAboveTarget", "queue": "QueueAboveTarget"}[name]
            if above
            else "BelowTarget"
        )
    if rec == current == policy.max_replicas and ratio > 1.0 + policy.tolerance:
        reason = "AtMaxReplicas"
    return rec, reason


def _hold_capacity(
    policy: Policy,
    metrics: Metrics,
    base: int,
    current: int,
    ready: int,
    rec: int,
    reason: str,
) -> tuple[int, str]:
    """No scale-down while replicas are starting, nor below what the fullest KV cache needs."""
    if rec <= current and ready < current:
        return current, "ReplicasStarting"  # starting replicas have taken no load yet
    if rec < current and metrics.kv_cache_usage is not None and metrics.ttft_p95_s is not None:
        # TTFT is flat until a replica saturates: never scale down so far that the fullest
        # KV cache would pass KV_CACHE_HIGH on the remaining replicas (only with traffic in the
        # window: an idle server's gauge still shows its last step)
        floor = ceil_replicas(base * metrics.kv_cache_usage / KV_CACHE_HIGH)
        if floor > rec:
            return min(current, policy.clamp(floor)), "KVCacheHigh"
    return rec, reason


def alert_step(policy: Policy, *, current: int, history: History, now: float) -> Decision:
    """A firing scale-up alert: one more replica now (within the rate limit and maxReplicas).

    The step is recorded as a recommendation, so the scale-down window keeps it.
    """
    target = policy.clamp(min(current + 1, MAX_SCALE_UP_FACTOR * max(current, 1)))
    history = (*_prune(history, now, policy), (now, target))
    if target <= current:
        return Decision(
            policy.clamp(current), target, "AtMaxReplicas", f"already at {current}", history=history
        )
    return Decision(target, target, "AlertFiring", f"{current} → {target}", history=history)


def _describe(policy: Policy, m: Metrics, queue_per: float) -> str:
    parts = []
    if policy.target_ttft_s is not None:
        ttft = "none in window" if m.ttft_p95_s is None else f"{m.ttft_p95_s:.3f} s"
        parts.append(f"p95 TTFT {ttft} (target {policy.target_ttft_s:g} s)")
    if policy.target_queue is not None:
        parts.append(f"queue {queue_per:.2f}/replica (target {policy.target_queue:g})")
    if m.kv_cache_usage is not None:
        parts.append(f"KV cache {m.kv_cache_usage:.0%}")
    return ", ".join(parts)
