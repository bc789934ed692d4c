"""Smoke run of benchmarks/step_overhead.py: a few decode steps at a small batch, greedy and
sampled, with the native and the PyTorch sampler side by side, and with the LM head's sampling
(where qgemm runs it) on and off; the table has every phase."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.timeout(180)
def test_small_run_reports_each_sampler_and_phase(capsys, monkeypatch):
    import step_overhead

    monkeypatch.setenv("PAGODA_NATIVE_SAMPLER", "1")  # the run switches it; restored after

    args = ["--seqs", "4", "--steps", "2", "--samplers", "native", "torch", "--head", "on", "off"]
    step_overhead.main(args)
    out = capsys.readouterr().out
    assert "machine: " in out
    table = [ln for ln in out.splitlines() if ln.startswith("| 4 |")]
    assert len(table) == 8  # greedy and sampled, each with both samplers, head sampling or not
    labels = [ln.split("|")[3].strip() for ln in table]
    assert {lb.removesuffix(" + LM head") for lb in labels} <= {"native", "torch"}
    assert not any(lb.endswith("LM head") for lb in labels[1::2])  # --head off
    header = next(ln for ln in out.splitlines() if ln.startswith("| seqs"))
    assert all(p in header for p in step_overhead.PHASES)
    assert step_overhead.use_sampler("native") in ("native", "torch")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_old_ref_times_that_commits_runtime_beside_this_one(capsys):
    import step_overhead

    step_overhead.main(["--seqs", "2", "--steps", "1", "--old-ref", "HEAD", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "before = HEAD" in out
    totals, phases = out.split("phases, median ms before / after:")
    rows = [ln for ln in totals.splitlines() if ln.startswith("| 2 |")]
    assert len(rows) == 2  # greedy and sampled
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[4].endswith("x") and float(cells[5]) > 0 and float(cells[6]) > 0
    phase_rows = [ln for ln in phases.splitlines() if ln.startswith("| 2 |")]
    assert len(phase_rows) == 2
    for row in phase_rows:  # each phase as "before / after", both measured
        cells = [c.strip() for c in row.strip("|").split("|")][2:]
        assert len(cells) == len(step_overhead.PHASES)
        assert all(len(c.split(" / ")) == 2 for c in cells)
        assert sum(float(c.split(" / ")[1]) for c in cells) > 0


@pytest.mark.timeout(180)
def test_filters_add_top_p_top_k_and_mixed_cases(capsys):
    import step_overhead

    step_overhead.main(["--seqs", "3", "--steps", "2", "--filters"])
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("| 3 |")]
    cases = [ln.split("|")[2].strip() for ln in table]
    assert cases == [
        "greedy",
        "sampled T=0.6",
        "T=0.6 top-p 0.9",
        "T=0.6 top-k 40",
        "half top-k 40",
    ]
    assert all(float(ln.split("|")[4]) > 0 for ln in table)  # step ms
    names = [name for name, _ in step_overhead.cases(True)]
    assert names == cases and [n for n, _ in step_overhead.cases(False)] == cases[:2]


@pytest.mark.timeout(180)
def test_decoded_tokens_come_before_the_timed_steps_and_cases_pick_rows(capsys, monkeypatch):
    import step_overhead

    seen = []
    real = step_overhead.running_engine

    def spy(*args, **kwargs):
        engine = real(*args, **kwargs)
        seen.append(min(r.num_output_tokens for r in engine.scheduler.running))
        return engine

    monkeypatch.setattr(step_overhead, "running_engine", spy)
    step_overhead.main(["--seqs", "2", "--steps", "1", "--decoded", "20", "--cases", "greedy"])
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 2 |")]
    assert [ln.split("|")[2].strip() for ln in table] == ["greedy"]
    assert seen and min(seen) >= 20  # every sequence has 20 tokens out before the timing
