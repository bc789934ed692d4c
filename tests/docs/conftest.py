"""The docs' run-as-written tests share one way of starting the server: `make serve`'s."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin, i.e. what the README calls `.venv/bin`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """`make serve`'s command line (`.venv/bin/pagoda serve --host 127.0.0.1 --port P`)."""
    port = _free_port()
    pagoda = BIN / "pagoda"
    cmd = [str(pagoda)] if pagoda.exists() else [sys.executable, "-m", "pagoda.runtime.cli"]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*cmd, "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    base = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"pagoda serve exited {proc.returncode}:\n{log.read()}")
            try:
                if httpx.get(f"http://{base}/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "pagoda serve not ready after 180 s"
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
