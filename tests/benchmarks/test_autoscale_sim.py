"""benchmarks/autoscale_sim.py and its parts on short runs: the kept trace is the published one,
the fleet model conserves requests and meets its measured idle numbers, the HPA/KEDA baselines
follow Kubernetes' and KEDA's rules, and a small end-to-end run prints every autoscaler."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import inspect
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import autoscale_baselines as bl  # noqa: E402
import autoscale_run as run  # noqa: E402
import autoscale_search as search  # noqa: E402
import autoscale_sim as sim  # noqa: E402
import autoscale_traffic as traffic  # noqa: E402
from autoscale_engine import Fleet, Observation, histogram_quantile  # noqa: E402

CAP = sim.MEASURED


def test_the_kept_trace_is_the_published_file() -> None:
    readme = (BENCH / "data" / "README.md").read_text()
    for kind, rows in (("conv", 19366), ("code", 8819)):
        raw = gzip.decompress(
            (BENCH / "data" / f"AzureLLMInferenceTrace_{kind}.csv.gz").read_bytes()
        )
        digest = hashlib.sha256(raw).hexdigest()
        assert re.search(rf"\| {kind} \| `{digest}` \|", readme), f"{kind}: {digest} not in README"
        t, prompt, output = traffic.read_trace(kind)
        assert len(t) == rows and t[0] == 0 and np.all(np.diff(t) >= 0) and 3400 < t[-1] < 3600
        assert prompt.min() >= 1 and output.min() >= 1
    assert "CC-BY" in readme or "Attribution 4.0" in readme


def test_trace_replay_scales_the_rate_and_keeps_the_token_counts() -> None:
    t, prompt, _ = traffic.read_trace("conv")
    reqs = traffic.trace("conv", 2.5)(CAP.work_s, 0)
    assert len(reqs) == pytest.approx(2.5 * len(t), rel=0.02)
    assert np.all(np.diff(reqs.arrival) >= 0)
    assert np.all(reqs.prompt + reqs.output <= traffic.MAX_MODEL_LEN)
    assert np.median(reqs.prompt) == pytest.approx(np.median(prompt), rel=0.05)
    per_minute = np.bincount((reqs.arrival // 60).astype(int))[:50]
    orig = np.bincount((t // 60).astype(int))[:50]
    assert np.corrcoef(per_minute, orig)[0, 1] > 0.99  # the same shape over time


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    assert histogram_quantile(0.95, np.array([])) is None
    assert histogram_quantile(0.95, np.full(100, 0.45)) == pytest.approx(0.4 + 0.1 * 0.95)
    assert histogram_quantile(0.5, np.array([0.05, 0.05, 3.0, 3.0])) == pytest.approx(0.06)
    assert histogram_quantile(0.95, np.full(10, 1e4)) == 640.0  # +Inf: the last finite bound


def test_an_idle_fleet_serves_every_request_at_the_measured_ttft() -> None:
    arrival = np.arange(0.0, 60.0, 2.0) + 0.3
    prompt = np.full(len(arrival), 512)
    output = np.full(len(arrival), 20)
    fleet = Fleet(CAP, arrival, prompt, output, start=2)
    fleet.advance(90.0)
    assert not np.isnan(fleet.ttft).any() and not np.isnan(fleet.done_at).any()
    assert fleet.ttft == pytest.approx(CAP.idle_ttft_s(512), abs=0.02)
    assert fleet.replica_seconds == pytest.approx(2 * 90.0, abs=0.5)
    assert fleet.counters[1] == len(arrival)


def test_an_overloaded_fleet_queues_and_a_new_replica_serves_after_startup() -> None:
    n = 400  # 400 requests at once on one replica: 16 at a time, the rest wait
    fleet = Fleet(CAP, np.zeros(n), np.full(n, 30), np.full(n, 32), start=1)
    fleet.advance(1.0)
    o = fleet.observe()
    assert (o.running, o.waiting, o.current, o.ready) == (16, n - 16, 1, 1)
    fleet.resize(3)
    assert fleet.counts() == (3, 1)
    fleet.advance(1.0 + CAP.startup_s + 0.5)
    assert fleet.counts() == (3, 3)
    fleet.advance(200.0)
    assert not np.isnan(fleet.ttft).any()
    assert fleet.ttft.max() > 5.0  # the queue showed in the latency


def obs(current: int, ready: int | None = None, **kw) -> Observation:
    fields = dict(
        t=0.0, current=current, ready=current if ready is None else ready, waiting=0, running=0,
        kv_mean=None, kv_max=None, ttft_p95_s=None, ttft_count=0, mean_prompt=None,
        mean_output=None, arrival_rate=0.0, arrival_rate_slow=0.0,
        queued_prompt_tokens=0.0,
    )  # fmt: skip
    fields.update(kw)
    return Observation(**fields)


def test_hpa_rate_limits_up_and_holds_down_for_its_window() -> None:
    hpa = bl.HpaQueue(4.0, bl.Behavior(down_window_s=60.0), 1, 40)
    assert hpa.desired(obs(2, waiting=400), 0.0) == 6  # max(100 %, 4 pods) per 15 s
    assert hpa.desired(obs(6, waiting=400), 5.0) == 6  # the 15 s period already used its step
    assert hpa.desired(obs(6, waiting=400), 16.0) == 12
    assert hpa.desired(obs(12, waiting=0), 30.0) == 12  # down: the window's highest holds
    assert hpa.desired(obs(12, waiting=0), 77.0) == 1
    fast = bl.HpaQueue(4.0, bl.UP["fast"], 1, 40)
    assert fast.desired(obs(2, waiting=400), 0.0) == 20  # 900 %: x10


def test_hpa_pods_metric_counts_starting_pods_as_zero_going_up() -> None:
    hpa = bl.HpaKv(0.5, bl.Behavior(), 1, 40)
    # 4 pods, 2 ready at 0.9 of the KV cache: ratio 1.8 over the ready ones, but the 2 starting
    # ones count as 0 going up: (0.9 + 0.9 + 0 + 0) / (4 x 0.5) = 0.9, within the tolerance
    assert hpa.desired(obs(4, 2, kv_mean=0.9), 0.0) == 4
    assert hpa.desired(obs(2, 2, kv_mean=0.9), 15.0) == 4  # all ready: ⌈2 x 1.8⌉


def test_keda_scales_to_zero_after_the_cooldown_and_activates_on_the_next_poll() -> None:
    k = bl.Keda(8.0, bl.Behavior(down_window_s=0.0), 1, 40, min_replicas=0, cooldown_s=60.0,
                polling_s=30.0)  # fmt: skip
    assert k.desired(obs(2, running=10), 0.0) == 2
    assert k.desired(obs(2), 30.0) == 1  # idle, but active 30 s ago: the HPA's floor is 1
    assert k.desired(obs(1), 60.0) == 0  # 60 s idle: cooldown over
    assert k.desired(obs(0, 0, waiting=3), 75.0) == 0  # between polls nothing activates
    assert k.desired(obs(0, 0, waiting=3), 90.0) == 1  # the poll: activation
    keep = bl.Keda(8.0, bl.Behavior(down_window_s=0.0), 1, 40, min_replicas=1)
    assert keep.desired(obs(1), 1000.0) == 1


def test_the_best_setting_rule() -> None:
    r = lambda over, hours: run.Result("x", f"{over}/{hours}", over, hours, 0)  # noqa: E731
    assert search.choose([r(0.5, 30), r(0.9, 20), r(3.0, 10)]).setting == "0.9/20"
    assert search.choose([r(4.0, 30), r(2.0, 40), r(9.0, 5)]).setting == "4.0/30"
    assert search.choose([r(9.0, 30), r(7.0, 40)]).setting == "7.0/40"
    assert search.cheapest_within([r(0.5, 30), r(4.0, 20)], 5.0).setting == "4.0/20"


def test_pagoda_follows_a_step_that_queue_depth_misses() -> None:
    """10 minutes at 2 replicas' worth, then 20 at 8: the demand floor reaches the load's size
    while the queue-depth HPA saw-tooths (no signal below saturation)."""
    shape = traffic.Shape(
        "step-test", 1800.0, 0.5,
        traffic.synthetic(lambda t: 2.0 if t < 600 else 8.0, 1800.0), "test",
    )  # fmt: skip
    traffic.SHAPES[shape.name] = shape
    try:
        pagoda = run.simulate(shape, sim.Pagoda(shape, CAP), CAP)
        hpa = run.simulate(shape, bl.HpaQueue(4.0, bl.Behavior(), 1, 40), CAP)
    finally:
        del traffic.SHAPES[shape.name]
        run.requests_for.cache_clear()
    assert pagoda.violation_pct < hpa.violation_pct
    after = [n for t, n in zip(pagoda.times_h, pagoda.replicas) if t > 11 / 60]
    need = math.ceil(8 / 0.9)  # the demand floor at 90 % of a replica's measured capacity
    assert min(after) >= need - 1 and max(after) <= 2 * need  # no run to maxReplicas
    assert pagoda.violation_pct <= 100 / 30  # at most the step's own minute


def test_a_small_end_to_end_run_prints_every_autoscaler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    shape = traffic.Shape(
        "tiny", 360.0, 0.5, traffic.synthetic(lambda t: 1.0 if t < 120 else 3.0, 360.0), "test"
    )
    monkeypatch.setitem(traffic.SHAPES, "tiny", shape)
    full = search.baseline_grid

    def tiny_grid(s, quick=False):  # two targets and one behaviour per baseline
        return {k: (v[0][:2], v[1][:1]) for k, v in full(s, quick=True).items()}

    monkeypatch.setattr(search, "baseline_grid", tiny_grid)
    run.requests_for.cache_clear()
    argv = ["--shapes", "tiny", "--jobs", "1", "--plot", str(tmp_path / "p.png")]
    assert sim.main([*argv, "--profile-errors", "1.2"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| tiny |")]
    names = {ln.split("|")[2].strip().removesuffix(" (cheapest ≤ 5 %)") for ln in rows}
    fast_sync = {n for n in names if n.endswith(", HPA sync 5 s*")}
    assert len(fast_sync) == 1 and "HPA sync 5s" in out  # the plotted baseline, re-run every 5 s
    assert names - fast_sync == {
        "**Pagoda**", bl.HpaTtft.name, bl.HpaKv.name, bl.HpaQueue.name, bl.Keda.name,
        "*Pagoda, wrong profile*", "*clairvoyant (reference)*",
    }  # fmt: skip
    assert "profile +20%" in out
    assert "busy all the time" in out and (tmp_path / "p.png").stat().st_size > 10_000
    run.requests_for.cache_clear()


def test_the_clairvoyant_prefills_a_clump_of_long_prompts_within_the_slo() -> None:
    """40 prompts of 4,000 tokens in one second, then nothing: their work at 90 % over the 15 s
    bin asks for 7 replicas, but prefilling all of them within 8 s (less the longest prompt's own
    2.1 s) takes ⌈40 × 4000 / (1915 × 0.9 × (1 + 5.7))⌉ = 14; the clairvoyant holds them ahead
    of the clump, which then meets the SLO."""
    arrival = 60.0 + np.linspace(0.0, 0.99, 40)
    reqs = traffic.Requests(arrival, np.full(40, 4000), np.full(40, 16))
    shape = traffic.Shape("clump", 180.0, 8.0, lambda work_s, seed: reqs, "test")
    traffic.SHAPES[shape.name] = shape
    try:
        oracle = sim.Clairvoyant(shape, CAP)
        result = run.simulate(shape, oracle, CAP)
    finally:
        del traffic.SHAPES[shape.name]
        run.requests_for.cache_clear()
    budget = 8.0 - CAP.overhead_s - float(CAP.step_table()[CAP.slots]) - 4000 / 1915.0
    want = math.ceil(40 * 4000 / (1915.0 * 0.9 * (1.0 + budget)))
    assert int(oracle.need[4]) == want and want > 7
    assert result.violation_pct == 0.0


def test_the_ablation_table_runs_each_variant_on_each_shape(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    shape = traffic.Shape(
        "tiny-ab", 240.0, 0.5, traffic.synthetic(lambda t: 1.0 if t < 120 else 3.0, 240.0), "test"
    )
    monkeypatch.setitem(traffic.SHAPES, shape.name, shape)
    monkeypatch.setattr(sim, "ABLATION", sim.ABLATION[:2])
    run.requests_for.cache_clear()
    assert sim.main(["--ablation", "--shapes", shape.name, "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "%" in ln]
    assert [r.split("|")[1].strip() for r in rows] == [label for label, _ in sim.ABLATION[:2]]
    run.requests_for.cache_clear()


def test_the_baselines_cache_is_reused_only_by_the_same_code_and_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    shape = traffic.Shape(
        "tiny-cache", 240.0, 0.5, traffic.synthetic(lambda t: 1.0 if t < 120 else 3.0, 240.0), "t"
    )
    monkeypatch.setitem(traffic.SHAPES, shape.name, shape)
    full = search.baseline_grid
    monkeypatch.setattr(
        search, "baseline_grid", lambda s, quick=False: {
            k: (v[0][:2], v[1][:1]) for k, v in full(s, quick=True).items()
        },
    )  # fmt: skip
    run.requests_for.cache_clear()
    cache = tmp_path / "base.json"
    argv = ["--shapes", shape.name, "--jobs", "1", "--plot", "", "--profile-errors"]

    def table() -> list[str]:
        assert sim.main([*argv, "--baselines-cache", str(cache)]) == 0
        return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| tiny-cache")]

    first = table()
    doc = json.loads(cache.read_text())
    assert doc["key"] == search._cache_key(CAP) and len(doc["results"]) >= 8
    assert table() == first  # reused: the same table
    for v in doc["results"].values():
        v[0] = 99.0  # a kept result is what the table shows ...
    cache.write_text(json.dumps(doc))
    assert any("| 99.0 % |" in ln for ln in table())
    cache.write_text(json.dumps({**doc, "key": "other code"}))  # ... but only for the same code
    assert table() == first
    run.requests_for.cache_clear()


def test_the_baselines_cache_key_hashes_the_code_a_baseline_run_depends_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    used = (run.simulate, Fleet, traffic.trace, bl.HpaTtft)  # scoring, fleet, traffic, baselines
    assert {Path(inspect.getfile(f)).name for f in used} <= set(search.CODE)
    key = search._cache_key(CAP)
    assert search._cache_key(dataclasses.replace(CAP, slots=8)) != key
    read = Path.read_bytes
    for name in search.CODE:  # an edit to any of those files gives another key
        monkeypatch.setattr(
            Path, "read_bytes", lambda p, name=name: read(p) + b"#" * (p.name == name)
        )
        assert search._cache_key(CAP) != key
