"""`pagoda serve --tensor-parallel-size 2` on the CPU (gloo): it serves, and a rank that dies
ends it within seconds, `/health` answering 503 before the process exits non-zero."""

from __future__ import annotations

import json
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
    """The server's tensor-parallel ranks: the spawned processes under it (children of the
    engine process, or of the server itself with --no-engine-process) that start none."""
    spawned: dict[int, list[int]] = {}

    def walk(p: int) -> None:
        for child in children(p):
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd:
                spawned[child] = [c for c in children(child)]
            walk(child)

    walk(pid)
    return [p for p, kids in spawned.items() if not any(k in spawned for k in kids)]


@pytest.mark.parametrize(
    "where", ["--engine-process", pytest.param("--no-engine-process", marks=pytest.mark.slow)]
)
def test_a_dead_rank_ends_the_server_with_health_503_first(tmp_path, where):
    from hf_oracle import make_tiny_model

    make_tiny_model(tmp_path, "Llama")
    srv = ServerProcess(
        "--model", str(tmp_path), "--tensor-parallel-size", "2", "--device", "cpu",
        "--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-model-len", "256", where,
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


@pytest.mark.slow
def test_a_group_of_two_nodes_serves_and_the_worker_node_leaves_with_it(tmp_path):
    """Two `pagoda serve` processes as the operator's LeaderWorkerSet runs them: node 0 serves
    HTTP and is rank 0, node 1 (`--node-rank 1`) is headless; they meet at --master-port.
    Greedy tokens match one rank's; a drained node 0 stops node 1, which exits 0."""
    import subprocess
    import sys

    from hf_oracle import make_tiny_model
    from pagoda.runtime import LLM, SamplingParams
    from server_testlib import ROOT, free_port

    make_tiny_model(tmp_path, "Llama")
    common = ["--model", str(tmp_path), "--tensor-parallel-size", "2", "--nnodes", "2",
              "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--device", "cpu",
              "--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-model-len", "256"]  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-m", "pagoda.runtime.cli", "serve", *common, "--node-rank", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    srv = ServerProcess(*common)
    try:
        srv.wait_ready()
        prompt = [5, 6, 7, 8, 9, 10]
        body = {"model": str(tmp_path), "prompt": prompt, "max_tokens": 6, "temperature": 0}
        r = httpx.post(f"{srv.base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        with LLM(str(tmp_path), dtype="float32", kv_cache_memory=16 << 20) as one:
            want = one.generate([prompt], SamplingParams(temperature=0, max_tokens=6))
        assert r.json()["choices"][0]["text"] == want[0].outputs[0].text
        # Kubernetes deletes a group's pods at once: the worker gets SIGTERM while the leader
        # sleeps in its preStop hook, then drains. The stream in flight must still finish.
        stream = {**body, "max_tokens": 240, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.base}/v1/completions", json=stream, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            first = next(lines)
            kids = children(worker.pid)
            worker.send_signal(signal.SIGTERM)
            try:  # a container's PID 1 gone: the kernel kills the rest of it
                worker.wait(0.5)
                for pid in kids:
                    os.kill(pid, signal.SIGKILL)
            except subprocess.TimeoutExpired:
                pass
            srv.terminate()  # SIGTERM: drain, then rank 0 tells the other ranks to stop
            events = [first, *lines]
        assert events[-1] == "data: [DONE]", events[-3:]
        last = json.loads(events[-2][6:])
        assert "error" not in last and last["choices"][0]["finish_reason"] == "length", last
        assert srv.proc.wait(30) == 0, srv.output()
        out, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, out
        assert "stopped after" in out
    finally:
        srv.stop()
        if worker.poll() is None:
            worker.kill()
