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
     "PVCLost", "PVCAccessMode", "InsufficientGPU", "ChildRejected", "LeaderWorkerSetNotInstalled"}
)  # fmt: skip


def parse(body: Mapping[str, Any], config: OperatorConfig) -> InferenceServiceSpec:
    """The CR's spec, parsed and defaulted (raises SpecError)."""
    meta = body.get("metadata") or {}
    return InferenceServiceSpec.from_dict(
        body.get("spec") or {},
        name=meta.get("name", ""),
        default_image=config.default_image,
        pod_ids=config.pod_ids,
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
) -> str | None:
    """Raise SpecError when the cluster cannot run this spec as written. Returns why its pods
    must share one node (a ReadWriteOnce claim that several pods mount), else None."""
    one_node = None
    if spec.model.source == "pvc" and spec.model.claim:
        where = f"spec.model {show(spec.model.uri)}"
        one_node = await _check_claim(api, namespace, spec.model.claim, where, spec, writes=False)
    if spec.downloads and spec.model_cache.claim_name:
        claim = spec.model_cache.claim_name
        cache = await _check_claim(api, namespace, claim, "spec.modelCache", spec, writes=True)
        one_node = one_node or cache
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
            return one_node
        check_gpu_nodes(spec, nodes)
    return one_node


def check_gpu_nodes(spec: InferenceServiceSpec, nodes: Iterable[Mapping[str, Any]]) -> None:
    """`check_gpu_capacity` over the nodes matching spec.nodeSelector; none matching says so,
    with the values the nodes have for the selector's keys (a GPU product's exact spelling:
    "NVIDIA-H100-80GB-HBM3", not "H100")."""
    nodes = list(nodes)
    selector = dict(spec.node_selector)
    capacities = gpu_capacities(nodes, selector)
    if selector and not capacities:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
        seen = []
        for key in sorted(selector):
            values = sorted({str(lb[key]) for n in nodes
                             if key in (lb := (n.get("metadata") or {}).get("labels") or {})})  # fmt: skip
            found = ", ".join(values[:10]) + (", ..." if len(values) > 10 else "")
            seen.append(f"{key}: {found}" if values else f"no node has {key}")
        raise SpecError(
            "InsufficientGPU",
            f"no node matches spec.nodeSelector ({wanted}); the nodes' labels: {'; '.join(seen)}",
        )
    check_gpu_capacity(spec, capacities)


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


async def _check_claim(
    api: KubeApi,
    namespace: str,
    claim: str,
    where: str,
    spec: InferenceServiceSpec,
    *,
    writes: bool,
) -> str | None:
    pvc = await api.get("PersistentVolumeClaim", namespace, claim)
    if pvc is None:
        raise SpecError(
            "PVCNotFound",
            f"PersistentVolumeClaim {show(claim)} (from {where}) does not exist in namespace "
            f"{show(namespace)}",
        )
    if ((pvc.get("status") or {}).get("phase")) == "Lost":
        raise SpecError("PVCLost", f"PersistentVolumeClaim {show(claim)} lost its volume")
    # the bound volume's modes, else the claim's request
    modes = (pvc.get("status") or {}).get("accessModes") or (pvc.get("spec") or {}).get(
        "accessModes"
    )
    return check_access_modes(spec, claim, where, modes or [], writes=writes)


def _several_pods(spec: InferenceServiceSpec) -> str | None:
    """Why this service may run more than one pod at a time (None: it never does)."""
    if spec.multi_node:
        return f"groups of {spec.parallelism.nodes} pods (spec.parallelism.nodes)"
    most = spec.autoscaling.max_replicas if spec.autoscaling else spec.replicas
    if most > 1:
        return f"up to {most} replicas"
    if not spec.resources.gpus:  # CPU pods roll out with one surge pod (children/deployment.py)
        return "a second pod during each rollout (CPU pods surge by one)"
    return None


def check_access_modes(
    spec: InferenceServiceSpec, claim: str, where: str, modes: list[str], *, writes: bool
) -> str | None:
    """Modes no pod of this service could use as it does: a ReadWriteOncePod claim for a
    service of several pods (the scheduler admits one pod cluster-wide; the others stay
    Pending, a rollout never ends), a ReadWriteOnce claim for a multi-node group (its volume
    attaches to one node at a time), a read-only claim as the download cache. Unknown modes
    (empty) pass. A ReadWriteOnce claim that several pods of one Deployment mount returns why
    they must share a node: the scheduler does not see the attachment, so a pod placed on a
    second node would hang in ContainerCreating (Multi-Attach error); the builder pins them."""
    several = _several_pods(spec)
    if set(modes) == {"ReadWriteOnce"} and several is not None:
        if spec.multi_node:
            raise SpecError(
                "PVCAccessMode",
                f"PersistentVolumeClaim {show(claim)} (from {where}) is ReadWriteOnce: its "
                f"volume attaches to one node at a time, and this service runs {several} on "
                f"different nodes; use a ReadWriteMany claim{'' if writes else ' (or ReadOnlyMany)'}",
            )
        return f"PersistentVolumeClaim {show(claim)} (from {where}) is ReadWriteOnce and this service runs {several}"
    if set(modes) == {"ReadWriteOncePod"} and several is not None:
        raise SpecError(
            "PVCAccessMode",
            f"PersistentVolumeClaim {show(claim)} (from {where}) is ReadWriteOncePod: one pod "
            f"in the whole cluster may use it, and this service runs {several}; use a "
            f"ReadWriteMany claim{'' if writes else ' (or ReadOnlyMany)'}",
        )
    if writes and modes and set(modes) <= {"ReadOnlyMany"}:
        raise SpecError(
            "PVCAccessMode",
            f"PersistentVolumeClaim {show(claim)} (from {where}) is ReadOnlyMany: the "
            "model-download init container writes the cache into it; use ReadWriteMany (or "
            "ReadWriteOnce while every pod runs on one node)",
        )
    return None
