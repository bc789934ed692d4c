"""`pagoda serve --tensor-parallel-size 2` on the CPU (gloo): it serves, and a rank that dies
ends it within seconds, `/health` answering 503 before the process exits non-zero."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from server_testlib import ServerProcess

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def rank_processes(pid: int) -> list[int]:
    """The server's tensor-parallel ranks: its children that run `pagoda.runtime` (spawn's
    resource tracker is a child too)."""
    found = []
    for child in children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            found.append(child)
    return found


def test_a_dead_rank_ends_the_server_with_health_503_first(tmp_path):
    from hf_oracle import make_tiny_model

    make_tiny_model(tmp_path, "Llama")
    srv = ServerProcess(
        "--model", str(tmp_path), "--tensor-parallel-size", "2", "--device", "cpu",
        "--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-model-len", "256",
    )  # fmt: skip
    try:
        srv.wait_ready()
        body = {"model": str(tmp_path), "prompt": [5, 6, 7, 8], "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{srv.base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        ranks = rank_processes(srv.proc.pid)
        assert len(ranks) == 1, (ranks, srv.output())
        os.kill(ranks[0], signal.SIGKILL)
        killed, statuses = time.monotonic(), []
        while srv.proc.poll() is None and time.monotonic() - killed < 20:
            try:
                statuses.append(httpx.get(f"{srv.base}/health", timeout=2).status_code)
            except httpx.HTTPError:
                statuses.append(0)
            time.sleep(0.1)
        code = srv.proc.wait(10)
        took = time.monotonic() - killed
        assert code != 0 and took < 20, (code, took, srv.output())
        assert 503 in statuses, (statuses, srv.output())
        assert "tensor-parallel rank 1" in srv.output() and "exited with code -9" in srv.output()
    finally:
        srv.stop()
