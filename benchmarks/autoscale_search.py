"""The baselines' tuning for autoscale_sim.py: each grid-searched per traffic shape, results kept.

Each baseline (autoscale_baselines.py) is run over its target and its HPA `behavior` (scale-up
policies, scale-down windows and policies; KEDA also `minReplicaCount`, `cooldownPeriod`,
`pollingInterval`), the target then refined around its two best settings. A baseline's best
setting is the cheapest with ≤ 1 % of minutes over; if none, the cheapest with ≤ 5 %; if none,
the one with the fewest minutes over.

The runs go over forked processes (`run_many`); their results can be kept in a file and reused
by a later run of the same code and replica (`load_cache`, `save_cache`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import pathlib
import sys
from collections.abc import Callable

from autoscale_baselines import UP, Behavior, HpaKv, HpaQueue, HpaTtft, Keda, behaviors
from autoscale_engine import Capacity
from autoscale_run import MAX_REPLICAS, MIN_REPLICAS, Result, simulate
from autoscale_traffic import SHAPES, Shape

# --- the grids --------------------------------------------------------------------------------

Factory = Callable[[], object]


def _log_grid(lo: float, hi: float, per_octave: int = 1) -> list[float]:
    n = round(math.log2(hi / lo) * per_octave)
    return [float(f"{lo * 2 ** (i / per_octave):.3g}") for i in range(n + 1)]


def baseline_grid(shape: Shape, quick: bool = False) -> dict[str, tuple[list[float], list]]:
    """Per baseline: (targets, the other knobs as factories taking a target)."""
    slo = shape.target_ttft_s
    lo, hi = MIN_REPLICAS, MAX_REPLICAS
    bs = behaviors((60.0, 300.0) if quick else (60.0, 180.0, 300.0))
    if quick:
        bs = [b for b in bs if b.down_percent == 100.0]
    keda_knobs = [
        {"min_replicas": m, "cooldown_s": c, "polling_s": p, "activation": 0.0}
        for m in (0, 1)
        for c in (60.0, 300.0)
        for p in ((5.0, 15.0) if quick else (5.0, 15.0, 30.0))
    ]
    keda_bs = [replace_b(UP[u], down_window_s=w) for u in UP for w in (60.0, 300.0)]
    return {
        HpaTtft.name: (
            [round(slo * f, 3) for f in _log_grid(0.125, 1.0, 2)],
            [lambda x, b=b: HpaTtft(x, b, lo, hi) for b in bs],
        ),
        HpaKv.name: (_log_grid(0.0025, 0.64), [lambda x, b=b: HpaKv(x, b, lo, hi) for b in bs]),
        HpaQueue.name: (
            _log_grid(0.25, 16.0),
            [lambda x, b=b: HpaQueue(x, b, lo, hi) for b in bs],
        ),
        Keda.name: (
            _log_grid(1.0, 32.0),
            [lambda x, b=b, k=k: Keda(x, b, lo, hi, **k) for b in keda_bs for k in keda_knobs],
        ),
    }


def replace_b(b: Behavior, **kw) -> Behavior:
    return dataclasses.replace(b, **kw)


def choose(results: list[Result]) -> Result:
    """The best setting: the cheapest with ≤ 1 % of minutes over, else ≤ 5 %, else the fewest."""
    for limit in (1.0, 5.0):
        ok = [r for r in results if r.violation_pct <= limit + 1e-9]
        if ok:
            return min(ok, key=lambda r: (r.replica_hours, r.violation_pct))
    return min(results, key=lambda r: (r.violation_pct, r.replica_hours))


def cheapest_within(results: list[Result], limit: float) -> Result | None:
    ok = [r for r in results if r.violation_pct <= limit + 1e-9]
    return min(ok, key=lambda r: r.replica_hours) if ok else None


# --- running many settings (processes) ----------------------------------------------------------

# The runs of one `run_many` call, (shape name, factory, replica): a module global, so that the
# forked workers inherit it and only an index crosses to them.
_TASKS: list = []


def _run_task(i: int) -> Result:
    shape_name, make, cap = _TASKS[i]
    r = simulate(SHAPES[shape_name], make(), cap)
    r.times_h, r.replicas, r.minute_p95 = [], [], []  # summaries only across processes
    return r


# Baseline results from an earlier run (`--baselines-cache`): (shape, autoscaler, setting) ->
# (minutes over %, replica-hours, scale events). Valid only for the same replica and the same
# simulator, traffic and baseline code (`_cache_key`); Pagoda's rows are always simulated.
_CACHE: dict[str, list] = {}

# What a baseline's result depends on, beside the replica: the code that simulates and scores it.
CODE = ("autoscale_baselines.py", "autoscale_engine.py", "autoscale_traffic.py", "autoscale_run.py")


def _cache_key(cap: Capacity) -> str:
    """What the baselines' results depend on: the replica and the code that simulates and
    scores them."""
    h = hashlib.sha256(repr(cap).encode())
    for name in CODE:
        h.update((pathlib.Path(__file__).resolve().parent / name).read_bytes())
    return h.hexdigest()[:16]


def _task_key(task) -> str:
    shape_name, make = task
    scaler = make()
    return f"{shape_name}|{scaler.name}|{scaler.label()}"


def run_many(tasks: list, cap: Capacity, jobs: int) -> list[Result]:
    """Each (shape name, factory) of `tasks` simulated on `cap` (over `jobs` processes), or its
    kept result."""
    keys = [_task_key(t) for t in tasks]
    todo = [i for i, k in enumerate(keys) if k not in _CACHE]
    _TASKS[:] = [(*tasks[i], cap) for i in todo]
    if jobs <= 1 or len(todo) <= 1:
        fresh = [_run_task(i) for i in range(len(todo))]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            fresh = pool.map(_run_task, range(len(todo)), chunksize=1)
    for i, r in zip(todo, fresh):
        _CACHE[keys[i]] = [r.violation_pct, r.replica_hours, r.scale_events]
    out = []
    for k in keys:
        over, hours, events = _CACHE[k]
        family, setting = k.split("|")[1:]
        out.append(Result(family, setting, over, hours, events))
    return out


def clear_cache() -> None:
    _CACHE.clear()


def load_cache(path: pathlib.Path, cap: Capacity) -> None:
    if path.exists():
        doc = json.loads(path.read_text())
        if doc.get("key") == _cache_key(cap):
            _CACHE.update(doc["results"])
        else:
            print(f"{path}: made by other code or another replica, not used", file=sys.stderr)


def save_cache(path: pathlib.Path, cap: Capacity) -> None:
    path.write_text(json.dumps({"key": _cache_key(cap), "results": _CACHE}))


def tune(
    shape: Shape, cap: Capacity, quick: bool, jobs: int
) -> dict[str, list[tuple[Result, Factory]]]:
    """Every baseline's grid on `shape`, then its target refined around its two best settings:
    per baseline, each result with the factory that rebuilds its autoscaler."""
    grid = baseline_grid(shape, quick)
    made = [
        (fam, functools.partial(mk, x))
        for fam, (targets, makers) in grid.items()
        for mk, x in itertools.product(makers, targets)
    ]
    by: dict[str, list[tuple[Result, Factory]]] = {fam: [] for fam in grid}
    for (fam, f), r in zip(made, run_many([(shape.name, f) for _, f in made], cap, jobs)):
        by[fam].append((r, f))
    extra = []
    for fam, rows in by.items():
        for _, f in sorted(rows, key=lambda row: _rank(row[0]))[:2]:
            mk, x = f.func, f.args[0]
            for k in (-2, -1, 1, 2):
                extra.append((fam, functools.partial(mk, float(f"{x * 2 ** (k / 4):.3g}"))))
    for (fam, f), r in zip(extra, run_many([(shape.name, f) for _, f in extra], cap, jobs)):
        by[fam].append((r, f))
    return by


def _rank(r: Result) -> tuple:
    for i, limit in enumerate((1.0, 5.0)):
        if r.violation_pct <= limit + 1e-9:
            return (i, r.replica_hours)
    return (2, r.violation_pct, r.replica_hours)
