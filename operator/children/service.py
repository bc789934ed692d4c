"""The ClusterIP Service in front of the pods (port `http`). Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagoda.operator.children.owner import adopt, child
from pagoda.operator.kube.names import SERVER_PORT, selector_labels

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner


def build_service(owner: Owner) -> dict[str, Any]:
    obj = child(owner, "Service", "v1", owner.name)
    obj["spec"] = {
        "type": "ClusterIP",
        "selector": selector_labels(owner.name),
        "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    return adopt(obj, owner)
