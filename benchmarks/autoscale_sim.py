"""Autoscaling simulation: Pagoda's policy against tuned HPA/KEDA baselines, token by token.

    python benchmarks/autoscale_sim.py                 # all shapes, full grids (≈ 15–45 min, 2 cores)
    python benchmarks/autoscale_sim.py --quick         # a coarser behaviour grid
    python benchmarks/autoscale_sim.py --measure       # re-measure one `pagoda serve` replica

Traffic (autoscale_traffic.py): three synthetic shapes and the Azure LLM inference trace 2023
(conversation and code services, their arrival times and token counts, at 3x and 1.5x). The
fleet (autoscale_engine.py) is a token-level model of `pagoda serve` replicas whose numbers were
measured from the real server (`MEASURED`, `--measure`). Every autoscaler reads, when it
evaluates, what Prometheus would show were it scraped that instant: the TTFT histogram's p95 over
the last minute (the runtime's buckets, `histogram_quantile`), waiting and running requests, each
replica's KV-cache usage, the counters' recent request lengths and arrival rates (15 s, 30 s, 2
min). The HPA evaluates every 15 s (kube-controller-manager's default sync period, which managed
clusters do not let one change); KEDA's own poll (activation, scale to zero) every 5, 15 or 30 s;
the operator every 5 s (its default, on the 5 s scrape its ServiceMonitors ask for).

* **Pagoda**: `pagoda.operator.autoscaling.policy.decide` itself, configured once and never tuned
  per shape: `targetTTFTSeconds` = the SLO, `targetQueueDepth` 4,
  `scaleDownStabilizationSeconds` 180, defaults otherwise, and a tuned profile's V_P and V_D
  (the demand and burst floors), as the operator runs it; also with the profile's rates off by
  ±20 %;
* **a clairvoyant reference** that knows the next minute's requests;
* **the baselines** (autoscale_baselines.py), each grid-searched per shape over its target and
  its HPA `behavior` (scale-up policies, scale-down windows and policies; KEDA also
  `minReplicaCount`, `cooldownPeriod`, `pollingInterval`), the target refined around the best;
  the cheapest within 5 % also re-run with the HPA controller every 5 s, to show what a faster
  sync period would give it (the search and its results cache: autoscale_search.py).

Scored per shape (one run: autoscale_run.py): the percent of minutes whose p95 TTFT (of the
requests *arriving* in that minute; one never served counts as infinite) exceeds the SLO, and
replica-hours (starting and draining replicas included). The table, verdicts and plot:
autoscale_report.py. A baseline's best setting is the cheapest with ≤ 1 % of minutes
over; if none, the cheapest with ≤ 5 %; if none, the one with the fewest minutes over.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from autoscale_engine import Capacity, Observation
from autoscale_report import json_doc, plot, table, verdicts
from autoscale_run import EVAL_S, MAX_REPLICAS, MIN_REPLICAS, requests_for, simulate
from autoscale_search import cheapest_within, choose, clear_cache, load_cache, save_cache, tune
from autoscale_traffic import SHAPES, Requests, Shape
from pagoda.operator.autoscaling.bursts import Bursts
from pagoda.operator.autoscaling.policy import Metrics, Policy, decide

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGODA_EVAL_S = 5.0  # the operator's --autoscale-interval, on a 5 s scrape of the runtime pods
FAST_SYNC_S = 5.0  # a sensitivity row: the cheapest baseline with the HPA controller this fast
PAGODA_QUEUE_TARGET = 4.0
# Pagoda's one configuration, the same on every shape: spec.autoscaling's
# scaleDownStabilizationSeconds (default 300); everything else at its default.
PAGODA_SETTINGS: dict = {"down_window_s": 180.0}

# `python benchmarks/autoscale_sim.py --measure` (autoscale_measure.py) on AMD EPYC family 26
# model 2 (Zen 5), 2 vCPUs, AVX-512 BF16, no AMX, torch 2.13.0+cpu (bfloat16), 2026-12-04, a
# machine shared with other work: embedded SmolLM2-135M, --max-num-seqs 16, --max-model-len 8192,
# --kv-cache-memory 1GiB. Start-up, prefill and decode from the 19:20 UTC run (load average ≈ 1;
# idle TTFT medians 0.059 / 0.367 / 1.129 s at 32 / 512 / 2048 prompt tokens, fitted); the KV
# capacity from the 20:03 UTC run's gauge probe (that run's timings are not used: load ≈ 5).
MEASURED = Capacity(
    slots=16,
    startup_s=9.9,
    overhead_s=0.0674,
    prefill_tokens_per_s=1915.0,
    decode_step_s=((1, 0.01422), (2, 0.01755), (4, 0.01953), (8, 0.02764), (16, 0.0345)),
    kv_tokens=44500,
)


# --- Pagoda -----------------------------------------------------------------------------------


class Pagoda:
    """The operator's policy as the operator runs it (policy.decide, history kept between calls)."""

    name = "Pagoda"

    def __init__(
        self,
        shape: Shape,
        cap: Capacity,
        profile_error: float = 1.0,
        interval_s: float = PAGODA_EVAL_S,
        **policy: float,
    ) -> None:
        """`profile_error`: the tuned profile's rates times this (> 1: it promises more than
        the replicas do), to see what a wrong profile costs; `interval_s` and `policy` (Policy
        fields): the variants of `--ablation`."""
        self.policy = Policy(
            MIN_REPLICAS, MAX_REPLICAS, target_ttft_s=shape.target_ttft_s,
            target_queue=PAGODA_QUEUE_TARGET,
            prefill_tokens_per_s=cap.prefill_tokens_per_s * profile_error,
            decode_tokens_per_s=cap.decode_tokens_per_s() * profile_error,
            **{**PAGODA_SETTINGS, **policy},
        )  # fmt: skip
        self.profile_error = profile_error
        self.interval_s = interval_s
        self.history: tuple[tuple[float, int], ...] = ()
        self.correction = 1.0
        self.bursts = Bursts()

    def label(self) -> str:
        rates = "tuned V_P, V_D"
        if self.profile_error != 1.0:
            rates += f" x{self.profile_error:g} (profile {self.profile_error - 1:+.0%})"
        return (
            f"targetTTFTSeconds {self.policy.target_ttft_s:g}, targetQueueDepth 4, "
            f"scaleDownStabilizationSeconds {self.policy.down_window_s:g}; {rates}; "
            f"every {self.interval_s:g}s"
        )

    def desired(self, o: Observation, now: float) -> int:
        isl = o.mean_prompt
        m = Metrics(
            ttft_p95_s=o.ttft_p95_s, waiting=float(o.waiting), kv_cache_usage=o.kv_max,
            queued_prompt_tokens=None if isl is None else o.waiting * isl, mean_prompt_tokens=isl,
            mean_output_tokens=o.mean_output,
            arrival_rate=o.arrival_rate, arrival_rate_slow=o.arrival_rate_slow,
            arrival_rate_fast=o.arrival_rate_fast,
        )  # fmt: skip
        if not self.history:  # the operator seeds the history with the current count
            self.history = ((now, o.current),)
        d = decide(
            self.policy, m, current=o.current, ready=o.ready, history=self.history, now=now,
            correction=self.correction, bursts=self.bursts,
        )  # fmt: skip
        self.history, self.correction, self.bursts = d.history, d.correction, d.bursts
        return d.replicas


class Clairvoyant:
    """A reference, not an autoscaler: it knows the requests of the next `startup + 2 × 15 s` and
    holds the replicas they need, so new ones are ready when the load comes. What they need is
    the larger of two counts: their work at 90 % (prefill + decode share, per 15 s), and the
    replicas that prefill every stretch of arrivals within the SLO — for every window [a, b]
    (0.25 s steps, up to 90 s long) the prompt tokens arriving in it over V_P × 90 % × (b − a + the
    budget), the budget being the SLO less the fixed overhead, a decode step and the p95 prompt's
    own prefill (llm-d's `TTFT − ISL/V_P` on the long prompts that set a p95). A minute it misses
    needs more than `MAX_REPLICAS`, or its requests' own prefill is over the SLO."""

    name = "clairvoyant (reference)"
    RES_S, LOOKBACK_S, UTIL = 0.25, 90.0, 0.9

    def __init__(self, shape: Shape, cap: Capacity) -> None:
        reqs = requests_for(shape.name, cap)
        step = float(cap.step_table()[cap.slots])
        work = reqs.prompt / cap.prefill_tokens_per_s + reqs.output * step / cap.slots
        bins = np.zeros(int(shape.duration_s // EVAL_S) + 8)
        idx = np.minimum((reqs.arrival // EVAL_S).astype(int), len(bins) - 1)
        np.add.at(bins, idx, work)
        self.need = np.maximum(
            np.ceil(bins / EVAL_S / self.UTIL).astype(int), self._prefill_need(reqs, shape, cap)
        )
        self.ahead = 1 + math.ceil((cap.startup_s + EVAL_S) / EVAL_S)

    def _prefill_need(self, reqs: Requests, shape: Shape, cap: Capacity) -> np.ndarray:
        """Per 15 s bin: the replicas that prefill each window of arrivals ending in it in time."""
        res, v_p = self.RES_S, cap.prefill_tokens_per_s * self.UTIL
        long = float(np.percentile(reqs.prompt, 95)) / cap.prefill_tokens_per_s
        budget = shape.target_ttft_s - cap.overhead_s - float(cap.step_table()[cap.slots]) - long
        n_bins = int(shape.duration_s // EVAL_S) + 8
        out = np.zeros(n_bins, dtype=int)
        if budget <= 0:
            return out
        n = n_bins * int(EVAL_S / res)
        tokens = np.zeros(n)
        np.add.at(tokens, np.minimum((reqs.arrival / res).astype(int), n - 1), reqs.prompt)
        cum = np.r_[0.0, np.cumsum(tokens)]
        per, back = int(EVAL_S / res), int(self.LOOKBACK_S / res)
        for i in range(n_bins):
            b = np.arange(i * per, (i + 1) * per)
            a = np.arange(max(0, b[0] - back), b[-1] + 1)
            span = (b[:, None] - a[None, :] + 1) * res
            need = (cum[b + 1][:, None] - cum[a][None, :]) / (v_p * (span + budget))
            out[i] = math.ceil(float(np.where(span > 0, need, 0.0).max()) - 1e-9)
        return out

    def label(self) -> str:
        return "knows the next minute's requests; their work at 90 %, every prefill within the SLO"

    def desired(self, o: Observation, now: float) -> int:
        i = int(now // EVAL_S)
        want = int(self.need[i : i + self.ahead + 1].max())
        return max(MIN_REPLICAS, min(MAX_REPLICAS, want))


# --- what each part of the policy does -----------------------------------------------------------

# Pagoda with one part changed at a time (`--ablation`): (label, Pagoda's keyword arguments).
ABLATION: list[tuple[str, dict]] = [
    ("as configured", {}),
    ("evaluated every 15 s (the HPA's cadence)", {"interval_s": EVAL_S}),
    ("without the burst floor", {"burst_window_s": 0.0}),
    ("without the burst schedule", {"burst_memory_s": 0.0}),
    ("without the young service's margin", {"young_margin": 1.0}),
    ("planning at 95 % of a replica", {"target_utilization": 0.95}),
    ("planning at 90 % of a replica", {"target_utilization": 0.9}),
]


# The runs of `ablation`, (variant, shape name, replica): a module global, so that the forked
# workers inherit it and only an index crosses to them.
_TASKS: list = []


def _run_ablation(i: int) -> tuple[float, float]:
    (_, kw), name, cap = _TASKS[i]
    r = simulate(SHAPES[name], Pagoda(SHAPES[name], cap, **kw), cap)
    return r.violation_pct, r.replica_hours


def ablation(shapes: list[str], cap: Capacity, jobs: int) -> str:
    """A table: each variant's minutes over and replica-hours per shape, run side by side."""
    _TASKS[:] = [(v, name, cap) for v in ABLATION for name in shapes]
    if jobs <= 1:
        got = [_run_ablation(i) for i in range(len(_TASKS))]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            got = pool.map(_run_ablation, range(len(_TASKS)), chunksize=1)
    out = [
        "| Pagoda | " + " | ".join(shapes) + " |",
        "|---|" + "---|" * len(shapes),
    ]
    cells = iter(got)
    for label, _ in ABLATION:
        row = [f"{over:.1f} %, {hours:.1f}" for over, hours in (next(cells) for _ in shapes)]
        out.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(out)


def evaluate(
    shapes: list[str], cap: Capacity, quick: bool, jobs: int, errors: list[float] = ()
) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for name in shapes:
        shape = SHAPES[name]
        t0 = time.monotonic()
        pagoda = simulate(shape, Pagoda(shape, cap), cap)
        wrong = [simulate(shape, Pagoda(shape, cap, e), cap) for e in errors]
        oracle = simulate(shape, Clairvoyant(shape, cap), cap)
        tuned = tune(shape, cap, quick, jobs)
        by = {fam: [r for r, _ in rows] for fam, rows in tuned.items()}
        factory = {id(r): f for rows in tuned.values() for r, f in rows}
        best = {fam: choose(rs) for fam, rs in by.items()}
        within = [r for r in (cheapest_within(rs, 5.0) for rs in by.values()) if r is not None]
        ref = min(within, key=lambda r: r.replica_hours) if within else None
        table_rows = [("**Pagoda**", pagoda)]
        for fam, r in best.items():
            table_rows.append((fam, r))
            c5 = cheapest_within(by[fam], 5.0)
            if c5 is not None and c5 is not r:
                table_rows.append((f"{fam} (cheapest ≤ 5 %)", c5))
        plot_ref_pick = ref or min(best.values(), key=lambda r: r.violation_pct)
        plot_ref = simulate(shape, factory[id(plot_ref_pick)](), cap)
        fast = factory[id(plot_ref_pick)]()
        fast.interval_s = FAST_SYNC_S  # the same setting, were the HPA controller run every 5 s
        table_rows.append((f"*{plot_ref_pick.family}, HPA sync 5 s*", simulate(shape, fast, cap)))
        table_rows += [("*Pagoda, wrong profile*", r) for r in wrong]
        table_rows.append(("*clairvoyant (reference)*", oracle))
        rows[name] = {
            "pagoda": pagoda, "ref": ref, "best": list(best.values()), "rows": table_rows,
            "plot_ref": plot_ref, "runs": sum(len(v) for v in by.values()), "oracle": oracle,
            "seconds": time.monotonic() - t0,
        }  # fmt: skip
        print(
            f"{name}: {rows[name]['runs']} baseline runs in {rows[name]['seconds']:.0f} s",
            file=sys.stderr,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--measure", action="store_true", help="measure a replica here first")
    p.add_argument("--quick", action="store_true", help="a coarse grid (fewer behaviours)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--plot", default=str(ROOT / "docs" / "autoscale-sim.png"))
    p.add_argument("--json", help="write the table's numbers here")
    p.add_argument(
        "--baselines-cache", metavar="FILE",
        help="reuse the baselines' results kept here by an earlier run of the same code and "
        "replica (Pagoda is always simulated), and keep this run's there",
    )  # fmt: skip
    p.add_argument(
        "--ablation", action="store_true",
        help="only Pagoda, with one part of its policy changed at a time (≈ 1 min)",
    )  # fmt: skip
    p.add_argument(
        "--profile-errors", type=float, nargs="*", default=[1.2, 0.8],
        help="also run Pagoda with the profile's V_P and V_D times each (robustness rows)",
    )  # fmt: skip
    args = p.parse_args(argv)
    from common import machine

    cap = MEASURED
    if args.measure:
        from autoscale_measure import measure_replica

        print(f"measuring one replica on: {machine()}", file=sys.stderr)
        m = measure_replica(ROOT)
        print(json.dumps(m), file=sys.stderr)
        cap = Capacity(
            slots=m["slots"], startup_s=m["startup_s"], overhead_s=m["overhead_s"],
            prefill_tokens_per_s=m["prefill_tokens_per_s"],
            decode_step_s=tuple((int(b), s) for b, s in m["decode_step_s"].items()),
            kv_tokens=m["kv_tokens"],
        )  # fmt: skip
    print(f"machine (simulation only): {machine()}")
    print(f"replica: {cap}")
    if args.ablation:
        print(ablation(args.shapes, cap, args.jobs))
        return 0
    cache = pathlib.Path(args.baselines_cache) if args.baselines_cache else None
    clear_cache()
    if cache is not None:
        load_cache(cache, cap)
    rows = evaluate(args.shapes, cap, args.quick, args.jobs, args.profile_errors)
    if cache is not None:
        save_cache(cache, cap)
    print()
    print(table(rows))
    print()
    print(verdicts(rows, cap))
    if args.plot:
        plot(rows, pathlib.Path(args.plot))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(json_doc(rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
