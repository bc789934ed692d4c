"""Names every other operator module agrees on: the API group, labels, selectors, owned kinds.

The bottom floor of the operator: it imports nothing from `pagoda.operator` (from the runtime only
its torch-free options, for the port), so any module may import it. Pure constants and tiny pure
helpers only (no I/O, no kopf, no aiohttp).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.runtime import options

# --- the custom resource ----------------------------------------------------------------------
GROUP = "serving.pagoda.dev"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"
ISVC = (GROUP, VERSION, PLURAL)

# --- labels and annotations on the children ---------------------------------------------------
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "pagoda-operator"
COMPONENT = "inference-server"
CONFIG_HASH_ANNOTATION = "serving.pagoda.dev/config-hash"
GPU_RESOURCE = "nvidia.com/gpu"
SERVER_PORT = options.DEFAULT_PORT  # `pagoda serve --port` in the pods (port `http`)


def selector_labels(name: str) -> dict[str, str]:
    """The pods' selector: fixed labels only, never the owner's, so it stays immutable."""
    return {LABEL_NAME: "pagoda", LABEL_INSTANCE: name, LABEL_COMPONENT: COMPONENT}


def standard_labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY, LABEL_PART_OF: "pagoda"}


def config_map_name(name: str) -> str:
    return f"{name}-config"


def owned_by(obj: Mapping[str, Any] | None, uid: str) -> bool:
    """Whether `obj` has a controller owner reference to the object with this uid."""
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def now_iso() -> str:
    """The current UTC time as Kubernetes writes timestamps (second precision)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the kinds the operator reads or owns ----------------------------------------------------


@dataclass(frozen=True)
class ResourceKind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        parts = [
            base,
            self.plural,
            *([name] if name else []),
            *([subresource] if subresource else []),
        ]
        return "/".join(parts)


RESOURCES: Mapping[str, ResourceKind] = {
    KIND: ResourceKind(GROUP, VERSION, PLURAL, KIND),
    "Deployment": ResourceKind("apps", "v1", "deployments", "Deployment"),
    "Service": ResourceKind("", "v1", "services", "Service"),
    "ConfigMap": ResourceKind("", "v1", "configmaps", "ConfigMap"),
    "PodDisruptionBudget": ResourceKind(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"
    ),
    "ServiceMonitor": ResourceKind(
        "monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor"
    ),
    "PrometheusRule": ResourceKind(
        "monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule"
    ),
    "PersistentVolumeClaim": ResourceKind(
        "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"
    ),
    "Node": ResourceKind("", "v1", "nodes", "Node", namespaced=False),
    # autotuning (autotune/): the tuning Job and its least-privilege hand-back RBAC
    "Job": ResourceKind("batch", "v1", "jobs", "Job"),
    "ServiceAccount": ResourceKind("", "v1", "serviceaccounts", "ServiceAccount"),
    "Role": ResourceKind("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    "RoleBinding": ResourceKind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
}
# Maps inside a child that belong to the operator as a whole: keys missing from the desired
# manifest are removed from the live object (a JSON merge patch alone would keep them).
OWNED_MAPS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "template", "spec", "nodeSelector"),),
    "ConfigMap": (("data",),),
}
MONITORING_KINDS = ("ServiceMonitor", "PrometheusRule")  # only if the Prometheus Operator is there
WATCHED_CHILD_KINDS = ("Deployment", "Service", "ConfigMap", "PodDisruptionBudget")


def container_security() -> dict[str, Any]:
    """The restricted security context of every container the operator creates."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def cache_env() -> list[dict[str, str]]:
    """The root filesystem is read-only: HOME and the caches go to the /tmp emptyDir."""
    return [
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
        {"name": "TRITON_CACHE_DIR", "value": "/tmp/.triton"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
