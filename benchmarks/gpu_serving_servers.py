"""The servers of gpu_serving.py: `pagoda serve` processes on free loopback ports, all started
at once; their start-to-ready times, CPU time (from /proc) and logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `pagoda serve` process on a free loopback port; its start-to-ready time and log."""

    def __init__(self, label: str, flags: list[str], tree: str | None = None) -> None:
        """`tree`: a directory holding an older `pagoda` package (`--old-ref`) to serve with."""
        self.label, self.port = label, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="gpu-serving-", suffix=".log")  # noqa: SIM115
        cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port",
               str(self.port), *flags]  # fmt: skip
        self.started = time.perf_counter()
        env = None if tree is None else dict(os.environ, PYTHONPATH=tree)
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        self.ready_s: float | None = None

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def poll_ready(self) -> bool:
        if self.ready_s is not None:
            return True
        if self.proc.poll() is not None:
            raise RuntimeError(f"server {self.label!r} exited:\n{self.output()[-4000:]}")
        try:
            with urllib.request.urlopen(self.base + "/ready", timeout=2) as r:
                if r.status == 200:
                    self.ready_s = time.perf_counter() - self.started
        except OSError:
            pass
        return self.ready_s is not None

    def pids(self) -> list[int]:
        """The server's process and its children (an engine process, where there is one)."""
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            kids = ""
        return [self.proc.pid, *map(int, kids.split())]

    def cpu_seconds(self, api_only: bool = False) -> float:
        """User + system CPU time of the server's processes so far (from /proc; 0 elsewhere);
        `api_only`: of the HTTP (API) process alone, without an engine process."""
        total = 0.0
        for pid in self.pids()[:1] if api_only else self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def settle(self, timeout: float = 120.0, window: float = 0.5, busy: float = 0.1) -> float:
        """Wait until the server idles (its processes use under `busy` of a core over a
        `window`): once ready it still makes the grammar compiler in the background (imports
        xgrammar and transformers, seconds of CPU), which would otherwise count in the first
        run's CPU per token and compete with it. Returns the seconds waited."""
        start = time.perf_counter()
        last = self.cpu_seconds()
        while time.perf_counter() - start < timeout:
            time.sleep(window)
            now = self.cpu_seconds()
            if now - last < busy * window:
                break
            last = now
        return time.perf_counter() - start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def start_servers(
    specs: list[str], common: list[str], timeout: float, trees: dict[str, str | None] | None = None
) -> list[Server]:
    """One server per spec and tree (`trees`: label suffix → an older `pagoda` package's
    directory, None for this tree's), in that order."""
    servers = []
    for spec in specs:  # "FLAGS" or "LABEL=FLAGS" (a label lets flags start with "--")
        label, eq, flags = spec.partition("=")
        if not eq or label.startswith("-"):
            label, flags = spec.strip() or "default", spec
        for tag, tree in (trees or {"": None}).items():
            servers.append(Server(label + tag, [*common, *flags.split()], tree))
    deadline = time.perf_counter() + timeout
    try:
        while not all(s.poll_ready() for s in servers):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"servers not ready after {timeout:.0f} s")
            time.sleep(0.05)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def startup_lines(server: Server) -> list[str]:
    """The server log's start-up breakdown and warm-up lines."""
    keys = ("start-up", "warm-up", "ready:")
    return [ln.strip() for ln in server.output().splitlines() if any(k in ln for k in keys)]
