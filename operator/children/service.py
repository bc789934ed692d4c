"""The ClusterIP Service in front of the pods (port `http`); a group's leaders only. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagoda.operator.children.owner import adopt, child
from pagoda.operator.kube.names import SERVER_PORT, leader_selector_labels, selector_labels

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner


def build_service(owner: Owner, *, leaders_only: bool = False) -> dict[str, Any]:
    """`leaders_only`: a multi-node service's groups answer HTTP on their leader pod only."""
    obj = child(owner, "Service", "v1", owner.name)
    selector = leader_selector_labels if leaders_only else selector_labels
    obj["spec"] = {
        "type": "ClusterIP",
        "selector": selector(owner.name),
        "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    return adopt(obj, owner)
