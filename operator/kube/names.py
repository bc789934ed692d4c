"""Names every other operator module agrees on: the API group, labels, selectors, owned kinds.

The bottom floor of the operator: it imports nothing from `pagoda.operator` (from the runtime only
its torch-free options, for the port), so any module may import it. Pure constants and tiny pure
helpers only (no I/O, no kopf, no aiohttp).
"""

from __future__ import annotations

import datetime
import re
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
# on the pod template while a tuned profile is mounted: CONFIGMAP@DATA_HASH (autotune/mount.py)
TUNED_PROFILE_ANNOTATION = "serving.pagoda.dev/tuned-profile"
# on every child: the keys of the labels the operator set on it (kube/drift.py)
APPLIED_LABELS_ANNOTATION = "serving.pagoda.dev/applied-labels"
GPU_RESOURCE = "nvidia.com/gpu"
SERVER_PORT = options.DEFAULT_PORT  # `pagoda serve --port` in the pods (port `http`)
RUN_AS_ID = 1000  # the image's user (Dockerfile), every pod's
MODEL_CACHE_MOUNT = "/var/cache/pagoda/models"  # hf:// and s3:// models: `--download-dir` in pods
# hf:// and s3:// LoRA adapters: a link per adapter to its download (children/model_cache.py)
ADAPTERS_MOUNT = "/var/cache/pagoda/adapters"
# an hf:// or s3:// draft model (spec.engine.speculative.model): a link to its download
DRAFT_MOUNT = "/var/cache/pagoda/draft"
DRAFT_LINK = "model"  # the link's name there

# vLLM's LoRA flags as `pagoda serve` takes them (the runtime's branch lora adds them to
# pagoda.runtime.options). The runtime's own definitions win where it has them; these stand in
# for a runtime that does not have them yet, with vLLM's spelling and kinds.
_VLLM_LORA_FLAGS = (
    options.Flag("--enable-lora", "serve LoRA adapters", False, kind="switch"),
    options.Flag("--max-loras", "adapters in one batch", 1, int),
    options.Flag("--max-lora-rank", "largest adapter rank", 16, int),
    options.Flag("--max-cpu-loras", "adapters kept in host memory", None, int),
    options.Flag("--lora-modules", "NAME=PATH ...", None, kind="multi", metavar="NAME=PATH"),
)
LORA_FLAGS: Mapping[str, options.Flag] = {
    f.dest: options.SERVE_FLAGS.get(f.dest, f) for f in _VLLM_LORA_FLAGS
}


# Kubernetes label syntax (what the API server accepts): key `[DNS-1123 subdomain/]name`
_DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^(?:({_DNS1123_SUBDOMAIN})/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_MAX_LABEL_PREFIX = 253  # a DNS-1123 subdomain; the name after it: 63 (`_LABEL_NAME`)


def is_label_key(key: object) -> bool:
    """`[prefix/]name`: the prefix a DNS-1123 subdomain of at most 253 characters (a longer one
    passed while the key as a whole stayed within 253 + 1 + 63), the name at most 63."""
    m = _LABEL_KEY.match(key) if isinstance(key, str) else None
    return m is not None and len(m.group(1) or "") <= _MAX_LABEL_PREFIX


def is_label_value(value: object) -> bool:
    """At most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric; or empty."""
    return isinstance(value, str) and bool(_LABEL_VALUE.match(value))


def selector_labels(name: str) -> dict[str, str]:
    """The pods' selector: fixed labels only, never the owner's, so it stays immutable."""
    return {LABEL_NAME: "pagoda", LABEL_INSTANCE: name, LABEL_COMPONENT: COMPONENT}


def standard_labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY, LABEL_PART_OF: "pagoda"}


def config_map_name(name: str) -> str:
    return f"{name}-config"


# --- multi-node groups (LeaderWorkerSet, kubernetes-sigs/lws) -----------------------------------
LABEL_ROLE = "serving.pagoda.dev/role"  # on a group's pods: leader (serves HTTP) or worker
LEADER, WORKER = "leader", "worker"
LWS_SUFFIX = "-lws"
# LWS names its headless Service after itself: a suffix keeps it off our Service's name. Its
# worker StatefulSets are named LWS-GROUP and their pods' controller-revision-hash label adds an
# 11-character hash; 63 - 11 - 3 (group index up to 99) - len(LWS_SUFFIX) leaves this:
MAX_GROUP_NAME_LENGTH = 45
# Set by LWS's pod webhook in every container of a group; `$(VAR)` in args expands to them.
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX_ENV = "LWS_WORKER_INDEX"


def lws_name(name: str) -> str:
    return name + LWS_SUFFIX


def workload_name(kind: str, name: str) -> str:
    """The name of the InferenceService `name`'s Deployment or LeaderWorkerSet."""
    return lws_name(name) if kind == "LeaderWorkerSet" else name


def leader_selector_labels(name: str) -> dict[str, str]:
    """The group leaders of a multi-node service (the pods that serve HTTP)."""
    return {**selector_labels(name), LABEL_ROLE: LEADER}


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
    # spec.modelSecretRef's HF_TOKEN: an hf:// branch resolved to a commit (reconcile/model_pin.py)
    "Secret": ResourceKind("", "v1", "secrets", "Secret"),
    # multi-node services (spec.parallelism.nodes > 1), only if the LWS CRD is installed
    "LeaderWorkerSet": ResourceKind(
        "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"
    ),
    # watched only (kopf): a container's termination message → the owner's conditions
    "Pod": ResourceKind("", "v1", "pods", "Pod"),
    # autotuning (autotune/): the tuning Job and its least-privilege hand-back RBAC
    "Job": ResourceKind("batch", "v1", "jobs", "Job"),
    "ServiceAccount": ResourceKind("", "v1", "serviceaccounts", "ServiceAccount"),
    "Role": ResourceKind("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    "RoleBinding": ResourceKind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    # several replicas (`--peering`): kopf's peering records, read by kube/peering.py
    "ClusterKopfPeering": ResourceKind(
        "kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering", namespaced=False
    ),
    "KopfPeering": ResourceKind("kopf.dev", "v1", "kopfpeerings", "KopfPeering"),
}
# Maps inside a child that belong to the operator as a whole: keys missing from the desired
# manifest are removed from the live object (a JSON merge patch alone would keep them).
OWNED_MAPS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "template", "spec", "nodeSelector"),),
    "LeaderWorkerSet": tuple(
        ("spec", "leaderWorkerTemplate", template, "spec", "nodeSelector")
        for template in ("leaderTemplate", "workerTemplate")
    ),
    "ConfigMap": (("data",),),
    "Service": (("spec", "selector"),),  # a leaders-only selector loses its role key on a switch
}
# Optional fields of a child that only the operator writes: live but absent from the desired
# manifest (a model switched from hf:// to a PVC drops its download init container, a service
# that no longer asks for GPUs drops the GPU toleration, a Deployment whose pods no longer share a
# ReadWriteOnce claim drops its one-node pod affinity, one that no longer mounts a tuned profile
# its annotation), they are removed.
_POD_OPTIONAL = ("initContainers", "tolerations")
_TEMPLATE = ("spec", "template")
OWNED_OPTIONAL: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (
        *((*_TEMPLATE, "spec", key) for key in _POD_OPTIONAL),
        (*_TEMPLATE, "spec", "affinity", "podAffinity"),  # children/deployment.pin_to_one_node
        (*_TEMPLATE, "metadata", "annotations", TUNED_PROFILE_ANNOTATION),  # autotune/mount.py
    ),
    "LeaderWorkerSet": tuple(
        ("spec", "leaderWorkerTemplate", template, "spec", key)
        for template in ("leaderTemplate", "workerTemplate")
        for key in _POD_OPTIONAL
    ),
}
MONITORING_KINDS = ("ServiceMonitor", "PrometheusRule")  # only if the Prometheus Operator is there
# Kinds served only when their CRD is installed: nothing to build, read or delete without it.
OPTIONAL_KINDS = (*MONITORING_KINDS, "LeaderWorkerSet")
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")  # what runs the pods (one per service)
WATCHED_CHILD_KINDS = (
    "Deployment",
    "LeaderWorkerSet",
    "Service",
    "ConfigMap",
    "PodDisruptionBudget",
)


def pod_labels() -> dict[str, str]:
    """What the pod watch filters on: the serving pods the operator's Deployments create."""
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: COMPONENT}


MAX_ID = 2**31 - 1  # Kubernetes' bound on a uid/gid


@dataclass(frozen=True)
class PodIds:
    """The ids of the pods the operator creates (model servers, tuning Jobs): by default the
    image's non-root user (`RUN_AS_ID`, the Dockerfile's), which owns the volumes too. None
    leaves one out for the platform to assign (OpenShift's restricted SCC picks a uid from the
    namespace's range and refuses a pod that names another)."""

    run_as_user: int | None = RUN_AS_ID
    run_as_group: int | None = RUN_AS_ID
    fs_group: int | None = RUN_AS_ID

    def __post_init__(self) -> None:
        for name, value, low in (
            ("run_as_user", self.run_as_user, 1),  # runAsNonRoot refuses uid 0
            ("run_as_group", self.run_as_group, 0),
            ("fs_group", self.fs_group, 0),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_ID
            ):
                raise ValueError(f"{name} must be an id in {low}..{MAX_ID} or None, got {value!r}")


def pod_security(ids: PodIds = PodIds()) -> dict[str, Any]:
    """The security context of every pod the operator creates: non-root, RuntimeDefault
    seccomp, and the ids `ids` sets (those that are None are left out)."""
    set_ids = {
        "runAsUser": ids.run_as_user,
        "runAsGroup": ids.run_as_group,
        "fsGroup": ids.fs_group,
    }
    return {
        "runAsNonRoot": True,
        **{k: v for k, v in set_ids.items() if v is not None},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


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
