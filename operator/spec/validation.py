"""Semantic checks the CRD schema cannot do: they need the cluster (PVCs, node capacity).

Each failure is a :class:`SpecError`; the handlers turn it into a `Degraded` condition, an
Event and a `kopf.PermanentError` (no retry storm). The periodic resync re-runs these checks,
so creating the missing PVC or adding a GPU node heals the service without a spec change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.operator.kube.drift import parse_quantity
from pagoda.operator.kube.names import GPU_RESOURCE
from pagoda.operator.spec.fields import SpecError, show
from pagoda.operator.spec.inference_service import InferenceServiceSpec

if TYPE_CHECKING:
    from pagoda.operator.spec.config import OperatorConfig

# Reasons that come from the spec (or the cluster's answer to it), not from a failing rollout.
SPEC_REASONS = frozenset(
    {"InvalidSpec", "InvalidName", "InvalidModel", "UnknownModel", "UnsupportedModelURI", "PVCNotFound",
     "PVCLost", "InsufficientGPU", "ChildRejected", "LeaderWorkerSetNotInstalled"}
)  # fmt: skip


def parse(body: Mapping[str, Any], config: OperatorConfig) -> InferenceServiceSpec:
    """The CR's spec, parsed and defaulted (raises SpecError)."""
    meta = body.get("metadata") or {}
    return InferenceServiceSpec.from_dict(
        body.get("spec") or {}, name=meta.get("name", ""), default_image=config.default_image
    )


def gpu_capacities(
    nodes: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str]
) -> list[int]:
    """The GPUs each node matching `node_selector` can offer a pod, most first."""
    found = []
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in node_selector.items()):
            continue
        allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
        amount = parse_quantity(allocatable) if allocatable is not None else None
        found.append(int(amount or 0))
    return sorted(found, reverse=True)


def gpu_capacity(nodes: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str]) -> int:
    """The most GPUs any one node matching `node_selector` can offer a pod."""
    return max(gpu_capacities(nodes, node_selector), default=0)


async def check_cluster(
    api: KubeApi, spec: InferenceServiceSpec, namespace: str, logger: logging.Logger
) -> None:
    """Raise SpecError when the cluster cannot run this spec as written."""
    if spec.model.source == "pvc" and spec.model.claim:
        await _check_claim(api, namespace, spec.model.claim, f"spec.model {show(spec.model.uri)}")
    if spec.model.remote and spec.model_cache.claim_name:
        await _check_claim(api, namespace, spec.model_cache.claim_name, "spec.modelCache")
    if spec.multi_node and not await api.has_resource("LeaderWorkerSet"):
        raise SpecError(
            "LeaderWorkerSetNotInstalled",
            f"spec.parallelism.nodes {spec.parallelism.nodes} runs a LeaderWorkerSet "
            "(leaderworkerset.x-k8s.io/v1), whose CRD is not installed: install LeaderWorkerSet "
            "(kubernetes-sigs/lws) or set spec.parallelism.nodes to 1",
        )
    if spec.resources.gpus:
        try:
            nodes = await api.list("Node")
        except ApiError as e:
            if e.status != 403:
                raise
            logger.warning("Cannot list nodes (forbidden); skipping the GPU capacity check.")
            return
        check_gpu_capacity(spec, gpu_capacities(nodes, dict(spec.node_selector)))


def check_gpu_capacity(spec: InferenceServiceSpec, capacities: list[int]) -> None:
    """Some node offers one pod's GPUs; for a group, the nodes have room for all its pods."""
    gpus, pods = spec.resources.gpus, spec.parallelism.nodes
    room = sum(c // gpus for c in capacities)
    if room >= pods:
        return
    where = " matching spec.nodeSelector" if spec.node_selector else ""
    most = capacities[0] if capacities else 0
    if pods == 1 or not room:
        raise SpecError(
            "InsufficientGPU",
            f"each pod requests {gpus} {GPU_RESOURCE} but no node{where} "
            f"offers that many (the most on one node: {most})",
        )
    raise SpecError(
        "InsufficientGPU",
        f"a group of {pods} pods (spec.parallelism.nodes) with {gpus} {GPU_RESOURCE} each does "
        f"not fit: the nodes{where} have room for {room} such pod{'s' if room > 1 else ''}",
    )


async def _check_claim(api: KubeApi, namespace: str, claim: str, where: str) -> None:
    pvc = await api.get("PersistentVolumeClaim", namespace, claim)
    if pvc is None:
        raise SpecError(
            "PVCNotFound",
            f"PersistentVolumeClaim {show(claim)} (from {where}) does not exist in namespace "
            f"{show(namespace)}",
        )
    if ((pvc.get("status") or {}).get("phase")) == "Lost":
        raise SpecError("PVCLost", f"PersistentVolumeClaim {show(claim)} lost its volume")
