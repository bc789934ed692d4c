"""The demand floor: replicas for the requests arriving now and over the next `lead_s`. Pure.

Units: **requests** throughout, a request being one prompt with its `n` samples (the runtime
counts its prompt tokens once and its samples' output tokens together; the samples share the
prompt's prefill through the prefix cache). The runtime's running/waiting gauges count
sequences; prometheus.py divides them by the mean `n` before they reach this module.

TTFT and queue depth report overload once it has happened, and say nothing about how far a
scale down can go (TTFT is flat until the batch slots run out). A tuned profile measures what one
replica does at its chosen batch: prefill V_P and decode V_D tokens per second
(`capacity.prefill_tokens_per_s`, `capacity.decode_tokens_per_s`). With the recent requests'
mean prompt and output lengths (ISL, OSL, from the counters) one request costs

    work = ISL / V_P + OSL / V_D   replica-seconds,

so a fleet serving λ requests/s is busy λ × work replicas' worth. The floor plans for:

* the **arrival rate** λ and its trend: when the recent rate (`arrival_rate`, 30 s) runs above
  the slower one (`arrival_rate_slow`, 2 min) the load is climbing, and the floor extrapolates it
  over `lead_s` (an evaluation interval plus a replica's start-up), so that the replicas it asks
  for are ready when the load they are for arrives;
* the **backlog**: the waiting requests, to be through within `DRAIN_S`;

at `utilization` of each replica's measured capacity, the cost scaled by a correction learned
from the fleet (`learn_correction`). Nothing arriving and nothing waiting is a demand of zero (an
idle service: a p95 TTFT still high from a burst it has served asks for nothing). Without the
profile's rates, an arrival rate or the request lengths (no first token in the window) there is
no floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.operator.autotune.floor import ceil_replicas

CORRECTION_PERIOD_S = 15.0  # the gain and decay below are per this much time
CORRECTION_GAIN = 0.1  # per period of evidence that the profile overstates a replica's capacity
CORRECTION_DECAY = 0.0001  # per period without (a 20 % correction fades in ~7.5 h)
CORRECTION_MAX = 3.0
DRAIN_S = 20.0  # a backlog is planned to be through this soon (new arrivals queue behind it)
SLOPE_BASE_S = 45.0  # the two arrival-rate windows' centres lie 15 s and 60 s back


@dataclass(frozen=True)
class Demand:
    replicas: int
    arrival_rate: float  # λ after extrapolation, requests/s
    work_s: float  # replica-seconds one request (all its samples) costs
    burst: float | None = None  # busy replicas the recent bursts needed, when that sets `replicas`
    young: bool = False  # `burst` is a young service's margin (bursts.young_need)

    def describe(self) -> str:
        text = f"demand {self.arrival_rate:.1f} req/s x {self.work_s:.3f} s"
        if self.burst is not None:
            text += f", bursts {self.burst:.1f} replicas busy"
            if self.young:
                text += " (young service: margin over its largest burst)"
        return text


def request_work(
    prompt_tokens: float | None,
    output_tokens: float | None,
    prefill_tokens_per_s: float | None,
    decode_tokens_per_s: float | None,
) -> float | None:
    """Replica-seconds of one request of these mean lengths (None: something unknown)."""
    if None in (prompt_tokens, output_tokens, prefill_tokens_per_s, decode_tokens_per_s):
        return None
    if prefill_tokens_per_s <= 0 or decode_tokens_per_s <= 0:  # type: ignore[operator]
        return None
    return prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s  # type: ignore[operator]


def demand_floor(
    *,
    work_s: float | None,
    waiting: float,
    arrival_rate: float | None,
    arrival_rate_slow: float | None,
    utilization: float,
    lead_s: float,
) -> Demand | None:
    """Fewest replicas that serve the coming demand at `utilization` (None: no floor).
    `waiting`, `arrival_rate*`: requests (not sequences), as `work_s` is per request."""
    if arrival_rate is not None and arrival_rate <= 0 and waiting <= 0:
        return Demand(0, 0.0, work_s or 0.0)  # idle: nothing arrives, nothing waits
    if work_s is None or work_s <= 0 or arrival_rate is None:
        return None
    lam = max(arrival_rate, 0.0)
    if arrival_rate_slow is not None and lam > arrival_rate_slow:
        lam += (lam - arrival_rate_slow) / SLOPE_BASE_S * lead_s
    busy = lam * work_s + max(waiting, 0.0) * work_s / DRAIN_S
    return Demand(ceil_replicas(busy / utilization), lam, work_s)


def learn_correction(
    correction: float, *, overloaded: bool, elapsed_s: float = CORRECTION_PERIOD_S
) -> float:
    """The factor on a request's cost that corrects the profile by what the fleet shows.

    `overloaded`: every replica the floor asked for is serving (none starting, at least the
    floor's count) and still requests wait with the ratio over target, so the profile promised
    more than the replicas do (another context length, another clock): each CORRECTION_PERIOD_S
    of it makes a request cost CORRECTION_GAIN more. Otherwise the correction decays slowly back
    towards the profile's numbers, and the next overload measures it again. `elapsed_s`: the time
    since the previous evaluation, so the rates do not depend on the evaluation interval.
    """
    periods = min(max(elapsed_s, 0.0), 4 * CORRECTION_PERIOD_S) / CORRECTION_PERIOD_S
    if overloaded:
        return min(CORRECTION_MAX, correction * (1.0 + CORRECTION_GAIN) ** periods)
    return max(1.0, correction * (1.0 - CORRECTION_DECAY) ** periods)
