"""benchmarks/start_to_ready.py: one start of `pagoda serve` (embedded model, engine thread)
timed from outside to its first /ready 200, with the log's milestones in the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_start_reports_ready_and_milestones(capsys):
    import start_to_ready

    start_to_ready.main(["--rounds", "1", "--modes", "thread"])
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| thread |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    listening, core_built, ready = float(cells[1]), float(cells[3]), float(cells[5])
    # checks, then the core, then ready (the table's 0.1 s rounding can make neighbours equal)
    assert 0 < listening <= core_built <= ready
    assert listening < ready
