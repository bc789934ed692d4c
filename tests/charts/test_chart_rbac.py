"""The chart's RBAC grants exactly what the operator uses: `pagoda.operator.kube.rbac.API_PERMISSIONS`
(every group/resource/verb its API client and kopf call), nothing more, never `*`."""

from __future__ import annotations

from typing import Any

from chart_helpers import NAMESPACE, VALUE_SETS, of_kind, one, render, render_cached
from pagoda.operator.kube.names import RESOURCES
from pagoda.operator.kube.rbac import API_PERMISSIONS, permissions

Triple = tuple[str, str, str]  # (apiGroup, resource, verb)

# Cluster-scoped resources: granted by the ClusterRole even when the operator is namespaced.
CLUSTER_SCOPED = {
    ("", "namespaces"),
    ("", "nodes"),
    ("", "persistentvolumes"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("storage.k8s.io", "storageclasses"),
    ("rbac.authorization.k8s.io", "clusterroles"),
} | {(r.group, r.plural) for r in RESOURCES.values() if not r.namespaced}


def features(values: dict[str, Any]) -> set[str]:
    """Optional permission features a value set switches on (rbac.Permission.feature)."""
    chosen = {
        feature
        for feature in ("autotune", "modelPinning")
        if (values.get(feature) or {}).get("enabled") is not False
    }
    if (values.get("operator") or {}).get("replicas", 1) > 1:
        chosen.add("peering")
    return chosen


def needed(values: dict[str, Any] | None = None) -> set[Triple]:
    values = values or {}
    chosen = permissions(features(values))
    # kopf peers in the ClusterKopfPeering (cluster-wide) or a KopfPeering per namespace
    unused = "clusterkopfpeerings" if values.get("watchNamespaces") else "kopfpeerings"
    return {(p.group, p.resource, v) for p in chosen for v in p.verbs if p.resource != unused}


def triples(role: dict[str, Any]) -> set[Triple]:
    out: set[Triple] = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected rule fields {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def assert_no_wildcards(docs: Any) -> None:
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert all("*" not in item for item in rule[key]), f"wildcard in {rule}"
            assert "nonResourceURLs" not in rule


def is_cluster_scoped(triple: Triple) -> bool:
    group, resource, _ = triple
    return (group, resource.split("/")[0]) in CLUSTER_SCOPED


def test_permissions_cover_every_resource_the_api_client_knows() -> None:
    """Every kind in the operator's REST client has at least one permission (a new kind added
    to operator/kube/names.py without RBAC (operator/kube/rbac.py) would fail here and in the cluster)."""
    granted = {(p.group, p.resource) for p in API_PERMISSIONS}
    for kind, res in RESOURCES.items():
        assert (res.group, res.plural) in granted, f"{kind} has no entry in API_PERMISSIONS"


def test_cluster_wide_cluster_role_is_exactly_what_the_operator_uses() -> None:
    docs = render_cached("defaults")
    assert_no_wildcards(docs)
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    role = one(docs, "ClusterRole")
    granted = triples(role)
    assert granted - needed() == set(), "broader than the operator needs"
    assert needed() - granted == set(), "missing permissions the operator uses"
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_namespaced_mode_uses_a_role_per_namespace() -> None:
    namespaces = VALUE_SETS["namespaced"]["watchNamespaces"]
    docs = render_cached("namespaced")
    assert_no_wildcards(docs)
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    cluster = triples(one(docs, "ClusterRole"))
    assert cluster == {t for t in needed() if is_cluster_scoped(t)}
    assert all(is_cluster_scoped(t) for t in cluster)
    roles = of_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    for role in roles:
        assert triples(role) == {t for t in needed() if not is_cluster_scoped(t)}
    bindings = of_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}
        ]
    union = cluster.union(*(triples(r) for r in roles))
    assert union == needed()


def test_every_value_set_grants_the_same_permissions() -> None:
    for name in VALUE_SETS:
        docs = render_cached(name)
        assert_no_wildcards(docs)
        granted = set().union(
            *(triples(r) for r in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"))
        )
        assert granted == needed(VALUE_SETS[name]), name


def test_autotune_off_drops_its_permissions_and_tells_the_operator() -> None:
    docs = render_cached("autotune-off")
    granted = set().union(
        *(triples(r) for r in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"))
    )
    assert not {r for (_, r, _) in granted} & {"jobs", "serviceaccounts", "roles", "rolebindings"}
    assert ("", "configmaps", "delete") not in granted
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--no-autotune" in container["args"]
    (default,) = one(render_cached("defaults"), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--no-autotune" not in default["args"]


def test_secret_access_is_get_only_and_only_for_model_pinning() -> None:
    """The webhook token reaches the operator as an env var from the Secret; the operator reads
    a Secret through the API only to pin an hf:// branch (the one spec.modelSecretRef names:
    `get`, never list or watch), and not at all with modelPinning off."""
    for role in of_kind(render(VALUE_SETS["monitoring"]), "ClusterRole"):
        assert {v for (_, r, v) in triples(role) if r == "secrets"} == {"get"}
    docs = render_cached("autotune-off")
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        assert not any(r for (_, r, _) in triples(role) if r == "secrets")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--no-pin-models" in container["args"]


def test_children_with_block_owner_deletion_are_permitted() -> None:
    """kopf.adopt sets blockOwnerDeletion on every child's owner reference; clusters running the
    OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters) refuse
    such a child unless its creator may update the owner's finalizers."""
    from pagoda.operator.children.build import build_children
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

    spec = InferenceServiceSpec.from_dict(
        {"model": "smollm2-135m", "replicas": 2}, name="x", default_image="i"
    )
    owner = Owner(name="x", namespace="team-a", uid="u-1", labels=())
    for child in build_children(owner, spec, service_monitor=True).desired:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["blockOwnerDeletion"] is True and ref["controller"] is True
    for values in ("defaults", "namespaced"):
        docs = render_cached(values)
        role = of_kind(docs, "Role")[0] if values == "namespaced" else one(docs, "ClusterRole")
        assert ("serving.pagoda.dev", "inferenceservices/finalizers", "update") in triples(role)


def test_tuning_objects_owned_by_their_profile_config_map_are_permitted() -> None:
    """The tuning Job, its ServiceAccount, Role and RoleBinding are owned by the profile
    ConfigMap. An owner reference with blockOwnerDeletion needs `update` on the owner's
    finalizers (configmaps/finalizers) under the OwnerReferencesPermissionEnforcement admission
    plugin (OpenShift, hardened clusters); without it every tuning Job would be refused (403)."""
    from pagoda.operator.autotune import jobs, profiles
    from pagoda.operator.autotune.keys import key_for
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

    spec = InferenceServiceSpec.from_dict(
        {"model": "smollm2-135m", "resources": {"gpus": 1}, "autotune": {"enabled": True}},
        name="x",
        default_image="i",
    )
    key = key_for(spec, "NVIDIA-H200")
    cm = profiles.build_profile_config_map(key, "team-a")
    cm["metadata"]["uid"] = "u-cm"
    role = one(render_cached("defaults"), "ClusterRole")
    for obj in (*jobs.build_rbac(key, "team-a", cm), jobs.build_job(key, spec, "team-a", cm)):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"]) == ("ConfigMap", "u-cm") and ref["controller"] is True
        if ref.get("blockOwnerDeletion"):
            assert ("", "configmaps/finalizers", "update") in triples(role), obj["kind"]
