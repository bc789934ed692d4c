"""Helpers for the autoscaling tests: a stand-in Deployment controller and status/event readers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kube_emulator import Emulator
from operator_harness import DEPLOY, ISVC
from operator_helpers import in_background, mark_available
from pagoda.operator.kube.client import ApiError, KubeApi
from prometheus_testlib import require_tool as require_tool  # Prometheus, Alertmanager


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
