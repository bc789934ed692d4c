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
     "PVCLost", "InsufficientGPU", "ChildRejected"}
)  # fmt: skip


def parse(body: Mapping[str, Any], config: OperatorConfig) -> InferenceServiceSpec:
    """The CR's spec, parsed and defaulted (raises SpecError)."""
    meta = body.get("metadata") or {}
    return InferenceServiceSpec.from_dict(
        body.get("spec") or {}, name=meta.get("name", ""), default_image=config.default_image
    )


def gpu_capacity(nodes: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str]) -> int:
    """The most GPUs any one node matching `node_selector` can offer a pod."""
    best = 0
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in node_selector.items()):
            continue
        allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
        amount = parse_quantity(allocatable) if allocatable is not None else None
        best = max(best, int(amount or 0))
    return best


async def check_cluster(
    api: KubeApi, spec: InferenceServiceSpec, namespace: str, logger: logging.Logger
) -> None:
    """Raise SpecError when the cluster cannot run this spec as written."""
    if spec.model.source == "pvc" and spec.model.claim:
        pvc = await api.get("PersistentVolumeClaim", namespace, spec.model.claim)
        if pvc is None:
            raise SpecError(
                "PVCNotFound",
                f"PersistentVolumeClaim {show(spec.model.claim)} (from spec.model {show(spec.model.uri)}) "
                f"does not exist in namespace {show(namespace)}",
            )
        if ((pvc.get("status") or {}).get("phase")) == "Lost":
            raise SpecError(
                "PVCLost", f"PersistentVolumeClaim {show(spec.model.claim)} lost its volume"
            )
    if spec.resources.gpus:
        try:
            nodes = await api.list("Node")
        except ApiError as e:
            if e.status != 403:
                raise
            logger.warning("Cannot list nodes (forbidden); skipping the GPU capacity check.")
            return
        capacity = gpu_capacity(nodes, dict(spec.node_selector))
        if capacity < spec.resources.gpus:
            where = " matching spec.nodeSelector" if spec.node_selector else ""
            raise SpecError(
                "InsufficientGPU",
                f"each replica requests {spec.resources.gpus} {GPU_RESOURCE} but no node{where} "
                f"offers that many (the most on one node: {capacity})",
            )
