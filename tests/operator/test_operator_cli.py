"""`pagoda operator`: arguments, settings, and the real process against the emulator."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

import aiohttp
import pytest
from kube_emulator import Emulator
from operator_harness import DEPLOY, wait_for
from operator_helpers import create_isvc
from pagoda.operator import flags, main
from pagoda.operator.kube.client import KubeApi


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_dispatch_shows_operator_help(capsys: pytest.CaptureFixture[str]) -> None:
    from pagoda.runtime import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["operator", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--namespace",
        "--all-namespaces",
        "--http-port",
        "--log-format",
        "--watch-timeout",
        "--request-timeout",
    ):
        assert flag in out


def test_arguments_to_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGODA_DEFAULT_IMAGE", raising=False)
    monkeypatch.delenv("PAGODA_OPERATOR_NAMESPACES", raising=False)
    config = flags.config_from_args(parse())
    assert config.clusterwide and config.http_port == 8080 and config.log_format == "plain"
    config = flags.config_from_args(
        parse("-n", "team-a", "-n", "team-b", "--no-http", "--log-format", "json", "--default-image", "img:2",
              "--watch-timeout", "60", "--request-timeout", "7", "--resync-interval", "30", "--cluster-domain", "corp.local")
    )  # fmt: skip
    assert config.namespaces == ("team-a", "team-b") and not config.clusterwide
    assert (
        config.http_port is None and config.log_format == "json" and config.default_image == "img:2"
    )
    assert (config.watch_timeout_s, config.request_timeout_s, config.resync_interval_s) == (
        60,
        7,
        30,
    )
    assert config.service_url("m", "ns") == "http://m.ns.svc.corp.local:8000/v1"
    with pytest.raises(SystemExit):
        parse("-n", "a", "-A")  # mutually exclusive


def test_invalid_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(parse("-n", "Not_A_Namespace")) == 2
    assert "invalid namespace" in capsys.readouterr().err


def test_monitoring_labels(capsys: pytest.CaptureFixture[str]) -> None:
    config = flags.config_from_args(
        parse("--monitoring-label", "release=kube-prometheus-stack", "--monitoring-label", "a/b=")
    )
    assert config.monitoring_labels == (("release", "kube-prometheus-stack"), ("a/b", ""))
    longest = "p" * 253 + "/" + "n" * 63  # the longest key Kubernetes takes
    assert flags.config_from_args(parse("--monitoring-label", longest + "=v")).monitoring_labels
    for bad, why in [
        ("release", "expected KEY=VALUE"),
        ("Bad_/x=1", "not a Kubernetes label key"),
        ("release=-x", "not a label value"),
        ("release=" + "v" * 64, "not a label value"),
        ("p" * 254 + "/release=x", "not a Kubernetes label key"),  # a prefix past 253
        ("p/" + "n" * 64 + "=x", "not a Kubernetes label key"),
        ("app.kubernetes.io/managed-by=helm", "one the operator sets itself"),
    ]:
        assert main.run(parse("--monitoring-label", bad)) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err
    assert main.run(parse("--monitoring-label", "a=1", "--monitoring-label", "a=2")) == 2
    assert "given twice" in capsys.readouterr().err


def test_kopf_settings() -> None:
    settings = main.kopf_settings(
        flags.config_from_args(parse("--watch-timeout", "120", "--request-timeout", "9"))
    )
    assert settings.watching.server_timeout == 120 and settings.watching.client_timeout > 120
    assert settings.networking.request_timeout == 9
    assert settings.peering.standalone is True
    # kopf keeps its state in annotations only: the status schema stays ours
    assert type(settings.persistence.progress_storage).__name__ == "AnnotationsProgressStorage"
    assert settings.posting.level == logging.WARNING


@pytest.mark.e2e
async def test_pagoda_operator_process(
    emulator: Emulator, kube: KubeApi, unused_tcp_port: int
) -> None:
    """The real command: liveness/readiness, JSON logs, reconciles, exits 0 on SIGTERM."""
    env = {**os.environ, "KUBECONFIG": str(emulator.kubeconfig), "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pagoda.runtime.cli", "operator", "--http-host", "127.0.0.1",
        "--http-port", str(unused_tcp_port), "--log-format", "json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:

        async def probe(path: str) -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(f"http://127.0.0.1:{unused_tcp_port}{path}") as r,
                ):
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(lambda: probe("/healthz"), timeout=30, interval=0.2, what="/healthz")
        await wait_for(lambda: probe("/readyz"), timeout=15, interval=0.2, what="/readyz")
        await create_isvc(kube, "cli", {"model": "smollm2-135m"})
        await wait_for(
            lambda: emulator.live(DEPLOY, "default", "cli"),
            what="a Deployment from the CLI operator",
        )
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = (await proc.stdout.read()).decode()
    assert code == 0, output
    records: list[dict[str, Any]] = [
        json.loads(line) for line in output.splitlines() if line.startswith("{")
    ]
    assert records and any("Pagoda operator started" in r.get("message", "") for r in records), (
        output[-2000:]
    )
