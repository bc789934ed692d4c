"""`pagoda tune` → `pagoda serve --tuned-profile`, as processes on this machine (CPU, torch backend).

One tune of the embedded model with ``--quick`` (a few small points) writes the profile; a second
run resumes it (everything kept, no model load); a server started with it reports it (metric,
log line) and uses its knobs; a profile for another device is refused, or ignored under warn.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_testlib import ROOT, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
COMMON = ["--max-model-len", "256", "--kv-cache-memory", "64MiB"]
TUNE = ["--quick", "--time-budget", "5m", "--itl-target", "5", "--ttft-target", "30", *COMMON]


def pagoda(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "pagoda.runtime.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("profile")
    return out, pagoda("tune", "--output", str(out), *TUNE)


def test_tune_writes_a_profile(tuned):
    out, run = tuned
    assert run.returncode == 0, run.stderr[-3000:]
    profile = json.loads((out / "profile.json").read_text())
    assert profile["schema_version"] == 1 and profile["complete"] is True
    assert profile["device"].startswith("cpu: ") and profile["model"] == "smollm2-135m"
    assert profile["attention_backend"] == "torch" and profile["kernels"]["status"] == "skipped"
    engine = profile["engine"]
    assert [p["chunk_tokens"] for p in engine["prefill"]] == [16, 64]
    assert {(p["batch"], p["context"]) for p in engine["decode"]} == {
        (1, 32),
        (4, 32),
        (1, 96),
        (4, 96),
    }
    assert all(
        p["step_s"] > 0 and p["tokens_per_s"] > 0 for p in engine["prefill"] + engine["decode"]
    )
    assert engine["kv_cache"]["capacity_tokens"] == engine["kv_cache"]["num_blocks"] * 16
    sched, cap = profile["scheduler"], profile["capacity"]
    assert sched["max_num_batched_tokens"] >= sched["max_num_seqs"] >= 1
    assert cap["prefill_tokens_per_s"] > 0 and cap["decode_tokens_per_s"] > 0
    # one line says why kernels were skipped; a tqdm bar ran; the summary table is printed
    assert run.stderr.count("kernels: skipped: CPU run") == 1
    assert re.search(r"pagoda tune: 100%.*6/6", run.stderr)
    assert "V_P tok/s" in run.stdout and "max_num_batched_tokens" in run.stdout


def test_second_run_resumes_without_measuring(tuned):
    out, first = tuned
    assert first.returncode == 0
    before = json.loads((out / "profile.json").read_text())
    start = time.monotonic()
    run = pagoda("tune", "--output", str(out), *TUNE)
    assert run.returncode == 0, run.stderr[-3000:]
    after = json.loads((out / "profile.json").read_text())
    assert after["engine"] == before["engine"] and after["created"] == before["created"]
    assert after["time_spent_s"] >= before["time_spent_s"]
    assert "(kept)" in run.stderr
    assert time.monotonic() - start < 60  # no model load: nothing was left to measure


def test_serve_loads_and_reports_the_profile(tuned):
    out, run = tuned
    assert run.returncode == 0
    profile = json.loads((out / "profile.json").read_text())
    srv = ServerProcess("--tuned-profile", str(out), *COMMON, "--log-level", "info")
    try:
        srv.wait_ready()
        metrics = httpx.get(f"{srv.base}/metrics", timeout=10).text
        line = (
            f'pagoda:tuned_profile_info{{created="{profile["created"]}",'
            f'device="{profile["device"]}",model="smollm2-135m"}} 1.0'
        )
        assert line in metrics
        body = {"model": "smollm2-135m", "prompt": "Hello", "max_tokens": 3}
        reply = httpx.post(f"{srv.base}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        log = srv.output()
    finally:
        srv.stop()
    sched = profile["scheduler"]
    assert f"tuned profile {out}: device '{profile['device']}'" in log
    assert f"max_num_seqs={sched['max_num_seqs']}" in log
    assert f"max_num_batched_tokens={sched['max_num_batched_tokens']}" in log
    assert "warm-up:" in log


def test_mismatched_profile_is_refused_or_ignored_under_warn(tuned, tmp_path):
    out, run = tuned
    assert run.returncode == 0
    other = tmp_path / "other"
    shutil.copytree(out, other)
    data = json.loads((other / "profile.json").read_text())
    (other / "profile.json").write_text(json.dumps({**data, "device": "NVIDIA H200"}))
    start = time.monotonic()
    refused = pagoda("serve", "--tuned-profile", str(other), *COMMON, timeout=120)
    assert time.monotonic() - start < 60  # refused before the model loads
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagoda serve: error: tuned profile")
    assert "device 'NVIDIA H200' (profile) != 'cpu: " in lines[0]

    srv = ServerProcess("--tuned-profile", str(other), "--tuned-profile-mismatch", "warn", *COMMON)
    try:
        deadline = time.monotonic() + 120
        while "serving on defaults" not in srv.output() and time.monotonic() < deadline:
            assert srv.proc.poll() is None, srv.output()
            time.sleep(0.2)
        log = srv.output()
        assert "WARNING" in log and "device 'NVIDIA H200' (profile)" in log
        while time.monotonic() < deadline:  # the HTTP side is up while the model loads
            try:
                metrics = httpx.get(f"{srv.base}/metrics", timeout=5).text
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert "pagoda:tuned_profile_info" not in metrics
    finally:
        srv.proc.kill()  # still loading the model: nothing to drain
        srv.stop()
