"""One run of autoscale_sim.py: an autoscaler over one traffic shape on the fleet, scored.

The fleet (autoscale_engine.py) starts with the first 2 minutes' work at 70 % of its replicas
(every autoscaler alike); the autoscaler is asked every `interval_s` (its own, else the HPA's
15 s) what it wants, seeing what Prometheus would show that instant. Scored: the percent of
minutes whose p95 TTFT (of the requests *arriving* in that minute; one never served counts as
infinite) exceeds the SLO, and replica-hours (starting and draining replicas included).

The baselines cache (autoscale_search.py) keys on this file's text: what a run scores lives
here, beside the fleet, traffic and baselines' modules it also hashes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from autoscale_engine import Capacity, Fleet
from autoscale_traffic import SHAPES, Requests, Shape

EVAL_S = 15.0  # the HPA's sync period (kube-controller-manager's default) and the scrape interval
MIN_REPLICAS, MAX_REPLICAS = 1, 40
SEED = 1


@dataclass
class Result:
    family: str
    setting: str
    violation_pct: float
    replica_hours: float
    scale_events: int
    times_h: list[float] = dataclasses.field(default_factory=list, repr=False)
    replicas: list[int] = dataclasses.field(default_factory=list, repr=False)
    minute_p95: list[float] = dataclasses.field(default_factory=list, repr=False)


@functools.cache
def requests_for(name: str, cap: Capacity, seed: int = SEED) -> Requests:
    return SHAPES[name].make(cap.work_s, seed)


def start_replicas(reqs: Requests, cap: Capacity) -> int:
    """Warm replicas at t = 0 (every autoscaler alike): the first 2 minutes' work at 70 %."""
    first = reqs.arrival < 120.0
    work = sum(cap.work_s(p, g) for p, g in zip(reqs.prompt[first], reqs.output[first]))
    return max(MIN_REPLICAS, min(MAX_REPLICAS, math.ceil(work / 120.0 / 0.7)))


def simulate(shape: Shape, scaler, cap: Capacity, seed: int = SEED) -> Result:
    reqs = requests_for(shape.name, cap, seed)
    fleet = Fleet(cap, reqs.arrival, reqs.prompt, reqs.output, start_replicas(reqs, cap))
    times, counts, events = [], [], 0
    interval = getattr(scaler, "interval_s", EVAL_S)
    t = 0.0
    while t < shape.duration_s:
        fleet.advance(t)
        o = fleet.observe()
        want = scaler.desired(o, t)
        if want != o.current:
            events += 1
            fleet.resize(want)
        times.append(t / 3600)
        counts.append(want)
        t += interval
    hours = fleet.replica_seconds / 3600
    fleet.advance(shape.duration_s + 120.0)  # let the last minutes' requests finish
    p95 = minute_p95(reqs.arrival, fleet.ttft, shape.duration_s)
    over = 100.0 * float(np.mean(p95 > shape.target_ttft_s))
    return Result(scaler.name, scaler.label(), over, hours, events, times, counts, p95.tolist())


def minute_p95(arrival: np.ndarray, ttft: np.ndarray, duration_s: float) -> np.ndarray:
    """p95 TTFT of the requests arriving in each minute (never served: infinite)."""
    ttft = np.where(np.isnan(ttft), np.inf, ttft)
    minutes = int(duration_s // 60)
    edges = np.searchsorted(arrival, 60.0 * np.arange(minutes + 1))
    out = np.zeros(minutes)
    for m in range(minutes):
        chunk = ttft[edges[m] : edges[m + 1]]
        out[m] = np.percentile(chunk, 95, method="higher") if len(chunk) else 0.0
    return out
