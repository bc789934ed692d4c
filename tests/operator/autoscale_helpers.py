"""Helpers for the autoscaling tests: a stand-in Deployment controller and status/event readers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_emulator import Emulator
from operator_harness import DEPLOY, ISVC
from operator_helpers import in_background, mark_available
from pagoda.operator.kube.client import ApiError, KubeApi


def require_tool(*names: str) -> str:
    """The first of `names` on PATH; else skip, or fail in CI (PAGODA_REQUIRE_E2E=1, as
    tests/conftest.py's skip_or_fail: .ci/run installs Prometheus and Alertmanager)."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    reason = (
        f"{' or '.join(names)} not installed (apt-get install prometheus prometheus-alertmanager)"
    )
    if os.environ.get("PAGODA_REQUIRE_E2E") == "1":
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def replicas(emulator: Emulator, name: str, namespace: str = "default") -> int | None:
    deploy = emulator.live(DEPLOY, namespace, name)
    return None if deploy is None else deploy["spec"]["replicas"]


def autoscaling(emulator: Emulator, name: str) -> dict[str, Any]:
    body = emulator.live(ISVC, "default", name) or {}
    return (body.get("status") or {}).get("autoscaling") or {}


def events(emulator: Emulator, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in emulator.live_all("v1/events")
        if e["reason"] == reason and e["involvedObject"]["name"] == name
    ]


@contextlib.asynccontextmanager
async def deployment_controller(
    kube: KubeApi, *names: str, delay: float = 0.0
) -> AsyncIterator[None]:
    """Play the Deployment controller: `delay` s after spec.replicas changes, all are ready."""

    async def loop() -> None:
        seen: dict[str, int] = {}
        while True:
            for name in names:
                try:
                    deploy = await kube.get("Deployment", "default", name)
                except ApiError:
                    continue
                if deploy is None:
                    continue
                want = deploy["spec"]["replicas"]
                if (
                    seen.get(name) != want
                    or (deploy.get("status") or {}).get("readyReplicas") != want
                ):
                    if delay:
                        await asyncio.sleep(delay)
                    await mark_available(kube, name)
                    seen[name] = want
            await asyncio.sleep(0.05)

    async with in_background(loop()):
        yield
