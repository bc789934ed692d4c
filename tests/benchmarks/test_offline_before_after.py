"""Smoke run of the offline benchmark's before/after mode (`--old-ref`) on a tiny workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_old_ref_runs_that_commits_runtime_side_by_side(tmp_path):
    out = tmp_path / "ab.json"
    cmd = [sys.executable, "-P", str(ROOT / "benchmarks" / "offline_throughput.py"),
           "--num-prompts", "2", "--max-len", "24", "--output-len", "3", "--skip-hf",
           "--long-context", "0", "--old-ref", "HEAD", "--rounds", "1", "--json", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "after / before (HEAD):" in res.stdout
    runs = json.loads(out.read_text())["runs"]
    assert len(runs["before"]) == len(runs["after"]) == 1
    assert all(x > 0 for x in runs["before"] + runs["after"])
