"""Real processes for the autoscaling end-to-end test: `pagoda serve` replicas, Prometheus and
Alertmanager (Debian's packages) on loopback, with the configurations the test needs.

Every process logs to a file under the test's tmp_path and is stopped by `Processes.stop_all`
(SIGTERM, then SIGKILL), so a failing test leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from operator_harness import ROOT

AM_EXAMPLE = ROOT / "charts" / "pagoda" / "files" / "alertmanager-example.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, cmd: list[str], log_dir: Path, env: dict[str, str] | None = None):
        self.name, self.cmd = name, cmd
        self.log_path = log_dir / f"{name}.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )  # fmt: skip

    def output(self, tail: int = 4000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


class Processes:
    """Starts and always stops the test's processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, cmd, self.tmp, env)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def wait_http(proc: Proc, url: str, timeout: float) -> float:
    """Poll `url` until 200; returns the seconds it took. Fails fast if the process died."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.proc.poll() is not None:
            raise AssertionError(f"{proc.name} exited {proc.proc.returncode}:\n{proc.output()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{proc.name} not ready at {url} after {timeout} s:\n{proc.output()}")


def serve_cmd(port: int, max_num_seqs: int = 4) -> list[str]:
    """A replica with few slots: under load, requests queue and TTFT rises with the queue, by
    an amount that does not depend on how fast the engine has become (with 256 slots a faster
    engine kept p95 TTFT near the alert threshold, and the alert fired in only some runs)."""
    return [
        sys.executable, "-m", "pagoda.runtime.cli", "serve", "--port", str(port),
        "--kv-cache-memory", "64MiB", "--max-model-len", "512", "--log-level", "warning",
        "--max-num-seqs", str(max_num_seqs),
    ]  # fmt: skip


def prometheus_config(
    replicas: list[int], services: list[str], alertmanager_port: int, rule_file: Path
) -> dict[str, Any]:
    """1 s scrape and evaluation; the replicas scraped once per service with the labels the
    chart's relabeling adds in a cluster (namespace, inferenceservice)."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(rule_file)],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
        },
        "scrape_configs": [
            {
                "job_name": f"pagoda-{svc}",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{p}" for p in replicas],
                        "labels": {"namespace": "default", "inferenceservice": svc},
                    }
                ],
            }
            for svc in services
        ],
    }


def alertmanager_config(operator_port: int, token_file: Path) -> dict[str, Any]:
    """The chart's example route to the operator, pointed at this test's operator and made fast."""
    config = yaml.safe_load(AM_EXAMPLE.read_text())
    config["route"].update(group_wait="0s", group_interval="1s")
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "pagoda-operator"]
    route.update(group_wait="0s", group_interval="1s", repeat_interval="1h")
    (receiver,) = [r for r in config["receivers"] if r["name"] == "pagoda-operator"]
    (hook,) = receiver["webhook_configs"]
    hook["url"] = f"http://127.0.0.1:{operator_port}/alerts"
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


def prometheus_cmd(binary: str, config: Path, data: Path, port: int) -> list[str]:
    return [
        binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ]  # fmt: skip


def alertmanager_cmd(binary: str, config: Path, data: Path, port: int) -> list[str]:
    return [
        binary, f"--config.file={config}", f"--storage.path={data}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn",
    ]  # fmt: skip
