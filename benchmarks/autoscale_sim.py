"""Autoscaling simulation: Pagoda's policy against an HPA-style baseline on queue depth alone.

    python benchmarks/autoscale_sim.py                  # table + docs/autoscale-sim.png
    python benchmarks/autoscale_sim.py --measure        # re-measure one `pagoda serve` replica

Bursty traffic (steps, spikes, a compressed diurnal sine) is replayed against a queueing model
of replicas whose numbers come from the real runtime (`--measure`, stored in MEASURED): each
replica runs at most `slots` requests at once (`--max-num-seqs`), a request holds its slot for
`service_s`, its first token comes `ttft0_s` after admission, a new replica serves after
`startup_s`; the Service spreads requests over ready replicas (one shared FIFO). As in a cluster,
metrics are scraped every 15 s and both autoscalers evaluate every 15 s:

* Pagoda: `pagoda.operator.autoscaling.policy.decide` itself, on p95 TTFT over the last minute and queue
  depth per ready replica (targets below), tolerance 10 %, x2 per step, down window 300 s;
* Pagoda + prefill floor: the same, with the predictive floor a tuned profile enables (V_P =
  prompt tokens / idle TTFT; queued prompt tokens = waiting × 30): at least
  ⌈Q / (V_P · (TTFT target − ISL/V_P))⌉ replicas (pagoda.operator.autotune.floor);
* HPA: the Kubernetes HPA algorithm on average waiting requests per pod (same queue target):
  pods without metrics count as 0 when scaling up and as on-target when scaling down, tolerance
  10 %, scale up by max(100 %, 4 pods) per 15 s, down window 300 s.

Reported per scenario: percent of minutes whose p95 TTFT exceeds the target, replica-hours
(starting and draining replicas included), and scale events.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import json
import math
import pathlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pagoda.operator.autoscaling.policy import Metrics, Policy, decide

ROOT = pathlib.Path(__file__).resolve().parents[1]
EVAL_S = 15.0
DT = 0.5


@dataclass(frozen=True)
class Capacity:
    """One replica, measured with `--measure` (prompt ~30 tokens, 32 output tokens)."""

    slots: int  # --max-num-seqs
    service_s: float  # mean time a request holds a slot at full batch
    ttft0_s: float  # first token after admission, idle replica
    ttft_busy_s: float  # first token after admission, full batch
    startup_s: float  # process start -> /ready (model load)

    @property
    def rate(self) -> float:
        """Saturated throughput, requests/s."""
        return self.slots / self.service_s


# `python benchmarks/autoscale_sim.py --measure` on the 2-core development machine (shared).
MEASURED = Capacity(slots=16, service_s=2.77, ttft0_s=0.128, ttft_busy_s=0.337, startup_s=10.6)

TARGET_TTFT_S = 0.5
PROMPT_TOKENS = 30  # the measured requests' prompt length


def prefill_rate(cap: Capacity) -> float:
    """V_P in this model: an idle replica's prompt tokens per second of first-token latency
    (what `pagoda tune` records as capacity.prefill_tokens_per_s)."""
    return PROMPT_TOKENS / cap.ttft0_s


TARGET_TTFT_S = 0.5
TARGET_QUEUE = 4.0
MIN_REPLICAS, MAX_REPLICAS = 1, 40


# --- traffic: requests/s as a function of time, in units of one replica's throughput ------


def steps(t: float) -> float:
    return [2, 8, 3, 12, 2][min(int(t // 3600), 4)]


def spikes(t: float) -> float:
    return 12.0 if t % 1800 < 120 else 3.0  # 2-minute bursts every half hour


def diurnal(t: float) -> float:
    return 6.5 + 5.5 * math.sin(2 * math.pi * t / 21600 - math.pi / 2)  # a 6 h "day"


SCENARIOS: dict[str, tuple[Callable[[float], float], float]] = {
    "steps": (steps, 5 * 3600.0),
    "spikes": (spikes, 4 * 3600.0),
    "diurnal": (diurnal, 6 * 3600.0),
}


# --- autoscalers ------------------------------------------------------------------------------


@dataclass
class Observation:
    ttft_p95_s: float | None
    waiting: int
    ready: int
    current: int
    kv: float | None = None  # fullest replica's share of slots in use (KV cache proxy)


class PagodaScaler:
    name = "Pagoda (TTFT + queue)"

    def __init__(self) -> None:
        self.policy = Policy(
            MIN_REPLICAS, MAX_REPLICAS, target_ttft_s=TARGET_TTFT_S, target_queue=TARGET_QUEUE
        )
        self.history: tuple[tuple[float, int], ...] = ()

    def desired(self, o: Observation, now: float) -> int:
        m = Metrics(ttft_p95_s=o.ttft_p95_s, waiting=float(o.waiting), kv_cache_usage=o.kv)
        if not self.history:  # the operator seeds the history with the current count
            self.history = ((now, o.current),)
        d = decide(self.policy, m, current=o.current, ready=o.ready, history=self.history, now=now)
        self.history = d.history
        return d.replicas


class PagodaFloorScaler(PagodaScaler):
    """The same policy with a tuned profile's V_P: the predictive prefill floor (autotune)."""

    name = "Pagoda + prefill floor"

    def __init__(self, cap: Capacity = MEASURED) -> None:
        super().__init__()
        self.policy = dataclasses.replace(self.policy, prefill_tokens_per_s=prefill_rate(cap))

    def desired(self, o: Observation, now: float) -> int:
        m = Metrics(
            ttft_p95_s=o.ttft_p95_s, waiting=float(o.waiting), kv_cache_usage=o.kv,
            queued_prompt_tokens=o.waiting * PROMPT_TOKENS, mean_prompt_tokens=PROMPT_TOKENS,
        )  # fmt: skip
        if not self.history:
            self.history = ((now, o.current),)
        d = decide(self.policy, m, current=o.current, ready=o.ready, history=self.history, now=now)
        self.history = d.history
        return d.replicas


class HpaQueueScaler:
    """kube-controller-manager's replica calculator + default behaviour, on a Pods metric."""

    name = "HPA (queue depth)"

    def __init__(self, target: float = TARGET_QUEUE) -> None:
        self.target = target
        self.name = f"HPA (queue {target:g}/pod)"
        self.recs: collections.deque[tuple[float, int]] = collections.deque()
        self.ups: collections.deque[tuple[float, int]] = collections.deque()

    def desired(self, o: Observation, now: float) -> int:
        missing = o.current - o.ready
        if o.ready == 0:
            rec = o.current
        else:
            ratio = o.waiting / (o.ready * self.target)
            if missing and ratio > 1:  # missing pods count as 0 when scaling up
                ratio = o.waiting / (o.current * self.target)
            elif missing and ratio < 1:  # and as on target when scaling down
                ratio = (o.waiting + missing * self.target) / (o.current * self.target)
            rec = o.current if abs(ratio - 1) <= 0.1 else math.ceil(ratio * o.current)
        rec = max(MIN_REPLICAS, min(MAX_REPLICAS, rec))
        self.recs.append((now, rec))
        while self.recs and now - self.recs[0][0] > 300:
            self.recs.popleft()
        if rec > o.current:
            limit = max(2 * o.current, o.current + 4)  # 100 % or 4 pods per 15 s
            return min(rec, limit)
        return min(o.current, max(r for _, r in self.recs))  # 300 s down window


# --- the queueing model -----------------------------------------------------------------------


@dataclass
class Replica:
    ready_at: float
    running: list[float] = field(default_factory=list)  # heap of finish times
    draining: bool = False


@dataclass
class Result:
    times: list[float]
    rate: list[float]
    replicas: list[int]
    minute_p95: list[float]
    violation_pct: float
    replica_hours: float
    scale_events: int


@dataclass
class _Sim:
    """The queueing model's state between ticks of DT seconds."""

    rng: np.random.Generator
    pool: list[Replica]
    queue: collections.deque[float] = field(default_factory=collections.deque)  # arrivals
    first_tokens: collections.deque[tuple[float, float]] = field(
        default_factory=collections.deque
    )  # (time, ttft)
    minute: list[float] = field(default_factory=list)  # TTFTs of the current minute
    minute_p95: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    replica_s: float = 0.0
    events: int = 0


def simulate(
    traffic: Callable[[float], float], duration: float, scaler, cap: Capacity, seed: int = 0
) -> Result:
    s = _Sim(np.random.default_rng(seed), [Replica(ready_at=0.0) for _ in range(4)])
    t = 0.0
    while t < duration:
        lam = traffic(t) * cap.rate
        s.queue.extend(sorted(t + s.rng.uniform(0, DT, s.rng.poisson(lam * DT))))
        for r in s.pool:
            while r.running and r.running[0] <= t:
                heapq.heappop(r.running)
        _dispatch(s, t, cap)
        s.pool = [r for r in s.pool if not (r.draining and not r.running)]
        s.replica_s += len(s.pool) * DT
        if t % 60 < DT and t > 0:
            s.minute_p95.append(float(np.percentile(s.minute, 95)) if s.minute else 0.0)
            s.minute.clear()
        if t % EVAL_S < DT:  # scrape, then evaluate on the scraped values
            _evaluate(s, t, lam, scaler, cap)
        t += DT
    over = sum(1 for p in s.minute_p95 if p > TARGET_TTFT_S)
    return Result(
        s.times, s.rates, s.counts, s.minute_p95, 100.0 * over / max(1, len(s.minute_p95)),
        s.replica_s / 3600, s.events,
    )  # fmt: skip


def _dispatch(s: _Sim, t: float, cap: Capacity) -> None:
    """Admit the queued requests that a ready replica can start within this tick."""
    ready = [r for r in s.pool if r.ready_at < t + DT and not r.draining]
    while s.queue and s.queue[0] < t + DT and ready:
        # the ready replica that can start it first (a free slot, else its next finish)
        arrival = s.queue[0]
        start, _, i = min(
            (
                max(arrival, r.ready_at, t if len(r.running) < cap.slots else r.running[0]),
                len(r.running),
                i,
            )
            for i, r in enumerate(ready)
        )
        if start >= t + DT:
            break
        s.queue.popleft()
        _admit(s, ready[i], arrival, start, cap)


def _admit(s: _Sim, r: Replica, arrival: float, start: float, cap: Capacity) -> None:
    """Start a request on replica r (taking the slot that frees first when all are busy)."""
    if len(r.running) >= cap.slots:
        heapq.heappop(r.running)
    busy = len(r.running) / cap.slots
    ttft = (start - arrival) + cap.ttft0_s + (cap.ttft_busy_s - cap.ttft0_s) * busy
    heapq.heappush(r.running, start + s.rng.gamma(4.0, cap.service_s / 4.0))
    s.first_tokens.append((arrival + ttft, ttft))
    s.minute.append(ttft)


def _evaluate(s: _Sim, t: float, lam: float, scaler, cap: Capacity) -> None:
    """Scrape the metrics, ask the autoscaler, resize the pool and record the decision."""
    while s.first_tokens and s.first_tokens[0][0] < t - 60:
        s.first_tokens.popleft()
    live = [r for r in s.pool if not r.draining]
    want = scaler.desired(_observe(s, live, t, cap), t)
    if want != len(live):
        s.events += 1
        s.pool = _resize(s.pool, live, want, t, cap)
    s.times.append(t / 3600)
    s.rates.append(lam)
    s.counts.append(want)


def _observe(s: _Sim, live: list[Replica], t: float, cap: Capacity) -> Observation:
    """What a scrape at time t sees: p95 TTFT over the last minute, queue, ready replicas."""
    window = [v for _, v in s.first_tokens]
    return Observation(
        ttft_p95_s=float(np.percentile(window, 95)) if window else None,
        waiting=sum(1 for a in s.queue if a <= t),
        ready=sum(1 for r in live if r.ready_at <= t),
        current=len(live),
        kv=max((len(r.running) / cap.slots for r in live if r.ready_at <= t), default=None),
    )


def _resize(pool: list[Replica], live: list[Replica], want: int, t: float, cap: Capacity):
    if want > len(live):
        return pool + [Replica(ready_at=t + cap.startup_s) for _ in range(want - len(live))]
    # like the ReplicaSet controller: not-ready pods first, then the least busy; they drain
    for r in sorted(live, key=lambda x: (x.ready_at <= t, len(x.running)))[: len(live) - want]:
        r.draining = True
    return [r for r in pool if not (r.draining and not r.running)]


# --- measuring one replica ------------------------------------------------------------------


def measure() -> Capacity:
    """Start `pagoda serve` (embedded model, 16 slots) and time it idle and saturated."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from autoscale_measure import measure_replica

    return Capacity(**measure_replica(ROOT))


# --- output ---------------------------------------------------------------------------------


def run_all(cap: Capacity) -> dict[str, dict[str, Result]]:
    out: dict[str, dict[str, Result]] = {}
    for name, (traffic, duration) in SCENARIOS.items():
        out[name] = {}
        makers = (
            PagodaScaler, HpaQueueScaler, lambda: HpaQueueScaler(TARGET_QUEUE / 4),
            lambda: PagodaFloorScaler(cap),
        )  # fmt: skip
        for make in makers:
            scaler = make()
            out[name][scaler.name] = simulate(traffic, duration, scaler, cap, seed=1)
    return out


def table(results: dict[str, dict[str, Result]]) -> str:
    lines = [
        "| traffic | autoscaler | minutes with p95 TTFT > target | replica-hours | scale events |",
        "|---|---|---|---|---|",
    ]
    for scenario, by in results.items():
        for name, r in by.items():
            lines.append(
                f"| {scenario} | {name} | {r.violation_pct:.1f} % | {r.replica_hours:.1f} "
                f"| {r.scale_events} |"
            )
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Result]], cap: Capacity, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 6.5), sharex="col")
    for col, (scenario, by) in enumerate(results.items()):
        top, bottom = axes[0][col], axes[1][col]
        first = next(iter(by.values()))
        top.plot(first.times, [r / cap.rate for r in first.rate], color="grey", lw=1,
                 label="load (replicas' worth)")  # fmt: skip
        for name, r in list(by.items())[:2]:  # Pagoda and the HPA with the same queue target
            top.step(r.times, r.replicas, where="post", lw=1.0, label=name)
            minutes = [(i + 1) / 60 for i in range(len(r.minute_p95))]
            bottom.plot(minutes, r.minute_p95, lw=0.8, label=name)
        bottom.axhline(TARGET_TTFT_S, color="black", ls="--", lw=0.8, label="target")
        bottom.set_yscale("log")
        top.set_title(scenario)
        top.set_ylabel("replicas")
        bottom.set_ylabel("p95 TTFT per minute, s")
        bottom.set_xlabel("hours")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--measure", action="store_true", help="measure a replica here first")
    p.add_argument("--plot", default=str(ROOT / "docs" / "autoscale-sim.png"))
    args = p.parse_args()
    cap = MEASURED
    if args.measure:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        from common import machine

        print(f"measuring one replica on: {machine()}", file=sys.stderr)
        cap = measure()
        print(json.dumps(cap.__dict__), file=sys.stderr)
    results = run_all(cap)
    print(f"capacity per replica: {cap} -> {cap.rate:.2f} requests/s")
    print(f"targets: p95 TTFT {TARGET_TTFT_S} s, queue {TARGET_QUEUE:g}/replica\n")
    print(table(results))
    plot(results, cap, pathlib.Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
