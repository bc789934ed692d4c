"""The PodDisruptionBudget: one pod down at a time, for services meant to run more than one. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagoda.operator.children.owner import adopt, child
from pagoda.operator.kube.names import selector_labels

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec


def wants_pdb(spec: InferenceServiceSpec) -> bool:
    """A PDB only makes sense for a service meant to run more than one replica."""
    return (spec.autoscaling.max_replicas if spec.autoscaling else spec.replicas) > 1


def build_pdb(owner: Owner) -> dict[str, Any]:
    obj = child(owner, "PodDisruptionBudget", "policy/v1", owner.name)
    obj["spec"] = {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}}
    return adopt(obj, owner)
