"""Start and stop a real `pagoda serve` process on a free loopback port (used by fixtures)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 512


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m pagoda.runtime.cli serve ...` on 127.0.0.1; log in a temp file."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="pagoda-serve-", suffix=".log")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, *args],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait_ready(self, timeout: float = 180.0) -> list[int]:
        """Poll /ready until 200; returns every status seen (connection errors as 0)."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.output()}")
            try:
                code = httpx.get(f"{self.base}/ready", timeout=5).status_code
            except httpx.HTTPError:
                code = 0
            seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.output()}")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
