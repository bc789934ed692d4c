"""Every (group, resource, verbs) the operator process needs, kopf's calls included.

The Helm chart's ClusterRole grants exactly these (`permissions(features)`: the autotuning rows
only with the chart value `autotune.enabled`); the end-to-end tests check that each request the
operator made is covered.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.operator.kube.names import GROUP, PLURAL


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str
    feature: str | None = None  # granted only when this chart feature is on (None: always)


_CHILD_VERBS = ("get", "list", "watch", "create", "patch")
API_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        GROUP,
        PLURAL,
        ("get", "list", "watch", "patch"),
        "kopf watches CRs, stores progress annotations",
    ),
    Permission(
        GROUP, f"{PLURAL}/status", ("get", "patch"), "conditions, replicas, url, autoscaling"
    ),
    Permission(
        GROUP,
        f"{PLURAL}/finalizers",
        ("update",),
        "children's owner references set blockOwnerDeletion: the OwnerReferencesPermissionEnforcement "
        "admission plugin refuses them without it",
    ),
    Permission("", "events", ("create",), "Degraded/Reconciled events; kopf's handler failures"),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("list", "watch"),
        "kopf resource scanning",
    ),
    Permission("", "namespaces", ("list", "watch"), "kopf, only with namespace glob patterns"),
    Permission(
        "apps",
        "deployments",
        (*_CHILD_VERBS, "delete"),
        "the model server; the autoscaler's replicas; deleted on a switch to a multi-node group",
    ),
    Permission("", "services", _CHILD_VERBS, "ClusterIP in front of the pods"),
    Permission("", "configmaps", _CHILD_VERBS, "engine configuration; tuned profiles"),
    Permission(
        "policy", "poddisruptionbudgets", (*_CHILD_VERBS, "delete"), "when more than one replica"
    ),
    Permission(
        "monitoring.coreos.com",
        "servicemonitors",
        ("get", "create", "patch", "delete"),
        "if the CRD exists",
    ),
    Permission(
        "monitoring.coreos.com",
        "prometheusrules",
        ("get", "create", "patch", "delete"),
        "per-service alerts, if the CRD exists",
    ),
    Permission(
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        (*_CHILD_VERBS, "delete"),
        "multi-node groups; the autoscaler's replicas; deleted on a switch to one node",
    ),
    Permission("", "persistentvolumeclaims", ("get",), "pvc:// models, spec.modelCache must exist"),
    Permission(
        "",
        "secrets",
        ("get",),
        "the one spec.modelSecretRef names (HF_TOKEN, HF_ENDPOINT): an hf:// branch pinned to a "
        "commit (reconcile/model_pin.py)",
        feature="modelPinning",
    ),
    Permission(
        "", "pods", ("get", "list", "watch"), "a container's termination message → conditions"
    ),
    Permission("", "nodes", ("list",), "GPU requests must fit some node; GPU products to tune"),
    # autotuning (autotune/, chart value autotune.enabled)
    Permission("", "configmaps", ("delete",), "unused tuned profiles", "autotune"),
    Permission("batch", "jobs", ("get", "create", "delete"), "one tuning Job per key", "autotune"),
    Permission(
        "",
        "serviceaccounts",
        ("get", "create"),
        "the tuning Job's identity; the default one's imagePullSecrets, which the Job's pod names",
        "autotune",
    ),
    Permission(
        "rbac.authorization.k8s.io", "roles", ("create",), "patch one profile ConfigMap", "autotune"
    ),
    Permission("rbac.authorization.k8s.io", "rolebindings", ("create",), "", "autotune"),
    # several replicas (chart value operator.replicas > 1: `--peering`, kube/peering.py)
    Permission(
        "kopf.dev",
        "clusterkopfpeerings",
        ("get", "list", "watch", "patch"),
        "kopf's keep-alives and pauses, cluster-wide operators",
        "peering",
    ),
    Permission(
        "kopf.dev",
        "kopfpeerings",
        ("get", "list", "watch", "patch"),
        "kopf's keep-alives and pauses, one per served namespace",
        "peering",
    ),
    Permission(
        "",
        "pods",
        ("patch",),
        "the operator's own pod: the peering=active label the operator Service selects",
        "peering",
    ),
)


def permissions(
    features: frozenset[str] | set[str] = frozenset({"autotune", "modelPinning", "peering"}),
) -> tuple[Permission, ...]:
    """The permissions with these optional features on."""
    return tuple(p for p in API_PERMISSIONS if p.feature is None or p.feature in features)


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(
        p.group == group and p.resource == resource and verb in p.verbs for p in API_PERMISSIONS
    )
