"""Helpers shared by the operator's end-to-end tests (emulator + running operator)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import yaml
from kube_emulator import Emulator
from operator_harness import DEPLOY, ISVC, ROOT
from pagoda.operator.kube import client as k8s
from pagoda.operator.kube import rbac
from pagoda.operator.kube.client import KubeApi
from prometheus_client.parser import text_string_to_metric_families

SVC, CM, PDB = "v1/services", "v1/configmaps", "policy/v1/poddisruptionbudgets"
ISVC_PATH = "/apis/serving.pagoda.dev/v1alpha1/namespaces/default/inferenceservices"
EXAMPLE_SPEC = next(
    d for d in yaml.safe_load_all((ROOT / "examples/smollm2-cpu.yaml").read_text()) if d
)["spec"]
OPERATOR_AGENTS = ("kopf/", k8s.USER_AGENT)
__all__ = ["CM", "DEPLOY", "EXAMPLE_SPEC", "ISVC", "ISVC_PATH", "PDB", "SVC"]


@contextlib.asynccontextmanager
async def in_background(coro: Coroutine[Any, Any, None]) -> AsyncIterator[asyncio.Task]:
    """`coro` runs as a task while the block runs (a controller the emulator lacks); after it,
    the task is cancelled and awaited."""
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def create_isvc(kube: KubeApi, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": "serving.pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }
    return await kube.request("POST", ISVC_PATH, body=body)


async def patch_isvc(kube: KubeApi, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    return await kube.patch("InferenceService", "default", name, patch)


def children(emulator: Emulator, name: str) -> dict[str, dict[str, Any] | None]:
    return {
        "Deployment": emulator.live(DEPLOY, "default", name),
        "Service": emulator.live(SVC, "default", name),
        "ConfigMap": emulator.live(CM, "default", f"{name}-config"),
    }


def condition(emulator: Emulator, name: str, type_: str) -> dict[str, Any]:
    body = emulator.live(ISVC, "default", name) or {}
    return next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


async def mark_available(kube: KubeApi, name: str, ready: int | None = None) -> None:
    """Play the Deployment controller: all replicas of the current generation are ready."""
    deploy = await kube.get("Deployment", "default", name)
    assert deploy is not None
    replicas = deploy["spec"]["replicas"] if ready is None else ready
    status = {
        "observedGeneration": deploy["metadata"]["generation"],
        "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
        ],
    }  # fmt: skip
    await kube.patch("Deployment", "default", name, {"status": status}, subresource="status")


def operator_requests(emulator: Emulator, since: int = 0) -> Iterator[Any]:
    for r in emulator._requests[since:]:
        if r.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS):
            yield r


def verb(r: Any) -> str:
    if r.method.value == "GET":
        return "watch" if r.params.get("watch") == "true" else ("get" if r.name else "list")
    return {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}[r.method.value]


def assert_permitted(emulator: Emulator) -> None:
    """Every API call the operator made is covered by API_PERMISSIONS (what the chart's RBAC grants)."""
    seen = set()
    for r in operator_requests(emulator):
        if r.resource is None or not r.resource.plural:
            continue  # discovery (/api, /apis/...) needs no RBAC rule
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        seen.add((r.resource.group, resource, verb(r)))
    missing = {call for call in seen if not rbac.allowed(*call)}
    assert not missing, f"calls outside API_PERMISSIONS: {sorted(missing)}"
    workloads = {("apps", "deployments"), ("leaderworkerset.x-k8s.io", "leaderworkersets")}
    assert {(g, r, "create") for g, r in workloads} & seen  # the check saw the operator at work


async def writes_during(emulator: Emulator, seconds: float) -> list[str]:
    start = len(emulator._requests)
    await asyncio.sleep(seconds)
    return [
        f"{r.method.value} {r.url.path}"
        for r in operator_requests(emulator, start)
        if r.method.value != "GET"
    ]


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name{labels}` in a Prometheus text exposition (None: absent);
    labels not given are summed over."""
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None
