"""`pagoda serve` with its engine in a process of its own (the default): the engine process
killed while a stream runs turns the stream into an error event and /health into 503, and the
server then exits 1 (the pod restarts at once instead of serving errors)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pagoda.runtime.termination import parse
from server_testlib import ServerProcess

pytestmark = pytest.mark.e2e


def engine_pid(server_pid: int) -> int:
    kids = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    for pid in map(int, kids):
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no engine process among {kids}")


@pytest.fixture(scope="module")
def engine_process_server(tmp_path_factory) -> Iterator[tuple[ServerProcess, Path]]:
    """One engine-process-mode server for this file: the ready-and-chat test uses it first, then
    the last test kills its engine (one model load instead of two)."""
    log = tmp_path_factory.mktemp("engine-process") / "termination-log"
    srv = ServerProcess(
        "--kv-cache-memory", "32MiB", "--max-model-len", "256", "--log-level", "info",
        env={"PAGODA_TERMINATION_LOG": str(log)},
    )  # fmt: skip
    try:
        srv.wait_ready()
        yield srv, log
    finally:
        srv.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_ready_and_a_chat_answer_in_both_engine_modes(mode, request):
    """Both start-up paths reach ready and serve: in the engine-process mode the start-up
    checks ran in the engine process (`EngineProcClient.preflight`) and the API process applies
    the chat template with the tokenizer the engine's ready message carried."""
    if mode == "process":
        srv, _ = request.getfixturevalue("engine_process_server")
    else:
        srv = ServerProcess(
            "--kv-cache-memory", "32MiB", "--max-model-len", "256", "--log-level", "info",
            "--no-engine-process",
        )  # fmt: skip
    try:
        srv.wait_ready()
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 8, "temperature": 0}  # fmt: skip
        with httpx.Client(base_url=srv.base, timeout=60) as c:
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert "Paris" in r.json()["choices"][0]["message"]["content"]
            assert r.json()["usage"]["prompt_tokens"] > 10  # the template's tokens too
        log = srv.output()
        assert "engine core built" in log and "ready: OpenAI API" in log
        assert ("engine process:" in log) == (mode == "process"), log[-2000:]
    finally:
        if mode == "thread":
            srv.stop()


def test_the_api_process_starts_without_torch():
    """What `pagoda serve`'s API process imports up to ready with the engine in its own
    process (the parser, the engine client, `api_process.prepare`'s app modules, the plan and
    the ready message's `EngineInfo` it unpickles), in a fresh interpreter: no torch, Triton
    or model code. (The grammar compiler, made once ready, imports xgrammar, which imports
    torch: docs/runtime.md, start-up.)"""
    code = (
        "import sys\n"
        "from pagoda.runtime.server import cli, api_process\n"
        "from pagoda.runtime.engine import core_client, core_proc, info\n"
        "cli.build_parser()\n"
        "api_process.prepare()\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'xgrammar')\n"
        "       or m.startswith(('pagoda.runtime.model.llama', 'pagoda.runtime.engine.core',\n"
        "                        'pagoda.runtime.worker', 'pagoda.kernels'))\n"
        "       and m not in ('pagoda.runtime.engine.core_client', 'pagoda.runtime.engine.core_proc')]\n"
        "print(sorted({m.split('.')[0] if m.startswith(('torch', 'triton', 'xgrammar')) else m\n"
        "              for m in bad}))\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.timeout(300)
def test_a_killed_engine_process_fails_streams_health_and_the_server(engine_process_server):
    """Last in this file: it kills the module's server."""
    srv, log = engine_process_server
    body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        assert c.get("/health").json() == {"status": "ok"}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            first = json.loads(next(lines)[6:])
            assert first["choices"][0]["finish_reason"] is None
            os.kill(engine_pid(srv.proc.pid), signal.SIGKILL)
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][6:])["error"]
        assert error["code"] == "unavailable" and "exited with code -9" in error["message"]
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "dead"
    deadline = time.monotonic() + 30
    while srv.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.proc.returncode == 1, srv.output()[-2000:]
    assert "engine died" in srv.output()
    # the pod's termination message, which the operator turns into the condition's reason
    said = parse(log.read_text())
    assert said.reason == "EngineDied" and "exited with code -9" in said.message, said
