"""Drift detection and the merge patch that repairs it (pure)."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest
from kube_emulator import merge_patch as apply_merge_patch
from pagoda.operator.children.build import build_children
from pagoda.operator.children.owner import Owner
from pagoda.operator.kube import drift
from pagoda.operator.spec.inference_service import InferenceServiceSpec

OWNER = Owner("demo", "default", "uid-1")


def deployment(spec: dict) -> dict:
    parsed = InferenceServiceSpec.from_dict(spec, name="demo", default_image="img:1")
    return build_children(OWNER, parsed).get("Deployment")


def served(desired: dict) -> dict:
    """What a real API server returns: defaults added, quantities normalised, status, extras."""
    live = copy.deepcopy(desired)
    live["metadata"].update(
        uid="d-1",
        resourceVersion="7",
        generation=1,
        annotations={"deployment.kubernetes.io/revision": "1"},
    )
    pod = live["spec"]["template"]["spec"]
    pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    c = pod["containers"][0]
    c["terminationMessagePath"] = "/dev/termination-log"
    c["resources"]["requests"]["cpu"] = "1000m"
    c["livenessProbe"]["successThreshold"] = 1
    live["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = (
        "2026-01-01T00:00:00Z"
    )
    live["status"] = {"replicas": 1}
    return live


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("1", "1000m", True),
        ("2Gi", "2147483648", True),
        ("1Gi", "1G", False),
        ("500m", 0.5, True),
        ("x", "x", True),
    ],
)
def test_quantities(a: object, b: object, equal: bool) -> None:
    assert drift.is_subset({"limits": {"q": a}}, {"limits": {"q": b}}) is equal


def test_parse_quantity() -> None:
    assert drift.parse_quantity("16Gi") == Decimal(16 * 2**30)
    assert drift.parse_quantity("1e3") == Decimal(1000)
    assert drift.parse_quantity("abc") is None and drift.parse_quantity(True) is None
    # exa: "E" and "Ei" are suffixes, not an exponent without digits
    assert drift.parse_quantity("2E") == Decimal("2e18")
    assert drift.parse_quantity("1Ei") == Decimal(2**60)
    assert drift.parse_quantity("1E3") == Decimal(1000)
    spec = {"model": "hf://org/m", "modelCache": {"sizeLimit": "1Ei"}}  # the CRD admits it
    parsed = InferenceServiceSpec.from_dict(spec, name="demo", default_image="i")
    assert parsed.model_cache.size_limit_bytes == 2**60


def test_served_object_is_in_sync() -> None:
    desired = deployment({"model": "smollm2-135m"})
    assert not drift.needs_update(desired, served(desired))


def test_hand_edits_are_drift_and_the_patch_repairs_them() -> None:
    desired = deployment({"model": "smollm2-135m", "nodeSelector": {"pool": "cpu"}})
    live = served(desired)
    live["spec"]["replicas"] = 5
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    live["spec"]["template"]["spec"]["nodeSelector"]["extra"] = "x"
    assert drift.needs_update(desired, live)
    patch = drift.merge_patch(desired, live)
    assert patch["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu", "extra": None}
    repaired = apply_merge_patch(live, patch)
    assert not drift.needs_update(desired, repaired)
    # what other controllers own survives
    assert repaired["status"] == {"replicas": 1}
    assert (
        "kubectl.kubernetes.io/restartedAt"
        in repaired["spec"]["template"]["metadata"]["annotations"]
    )


def test_removed_node_selector_is_removed() -> None:
    live = served(deployment({"model": "smollm2-135m", "nodeSelector": {"pool": "gpu"}}))
    desired = deployment({"model": "smollm2-135m"})
    assert drift.needs_update(desired, live)
    patch = drift.merge_patch(desired, live)
    assert patch["spec"]["template"]["spec"]["nodeSelector"] is None
    assert "nodeSelector" not in apply_merge_patch(live, patch)["spec"]["template"]["spec"]


def test_removed_gpu_and_env_are_removed() -> None:
    live = served(
        deployment({"model": "/w", "resources": {"gpus": 1}, "env": [{"name": "A", "value": "1"}]})
    )
    desired = deployment({"model": "/w"})
    repaired = apply_merge_patch(live, drift.merge_patch(desired, live))
    c = repaired["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert "A" not in [e["name"] for e in c["env"]]
    assert not drift.needs_update(desired, repaired)


def test_missing_owner_reference_is_drift() -> None:
    desired = deployment({"model": "smollm2-135m"})
    live = served(desired)
    live["metadata"]["ownerReferences"] = []
    assert drift.needs_update(desired, live)


@pytest.mark.parametrize(
    ("before", "after", "gone"),
    [
        ({"model": "hf://org/m"}, {"model": "smollm2-135m"}, "initContainers"),
        ({"model": "s3://models/p"}, {"model": "pvc://c/m"}, "initContainers"),
        ({"model": "/w", "resources": {"gpus": 1}}, {"model": "/w"}, "tolerations"),
        ({"model": "/w", "tolerations": [{"operator": "Exists"}]}, {"model": "/w"}, "tolerations"),
    ],
)
def test_dropped_init_container_and_tolerations_are_removed(
    before: dict, after: dict, gone: str
) -> None:
    """A merge patch keeps pod-spec lists it does not name: the download init container would
    stay (its cache volume gone: the API server refuses the patch) and so would tolerations."""
    live = served(deployment(before))
    desired = deployment(after)
    assert gone in live["spec"]["template"]["spec"] and drift.needs_update(desired, live)
    repaired = apply_merge_patch(live, drift.merge_patch(desired, live))
    pod = repaired["spec"]["template"]["spec"]
    assert gone not in pod
    mounts = [m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])]
    assert set(mounts) <= {v["name"] for v in pod["volumes"]}
    assert not drift.needs_update(desired, repaired)
    assert not drift.needs_update(deployment(before), served(deployment(before)))  # no churn


def test_leader_worker_set_drops_the_init_container_in_both_templates() -> None:
    def lws(spec: dict) -> dict:
        parsed = InferenceServiceSpec.from_dict(spec, name="demo", default_image="img:1")
        return build_children(OWNER, parsed).get("LeaderWorkerSet")

    group = {"parallelism": {"nodes": 2}}
    live = copy.deepcopy(lws({"model": "hf://org/m", **group}))
    desired = lws({"model": "pvc://models/m", **group})
    assert drift.needs_update(desired, live)
    repaired = apply_merge_patch(live, drift.merge_patch(desired, live))
    for role in ("leaderTemplate", "workerTemplate"):
        pod = repaired["spec"]["leaderWorkerTemplate"][role]["spec"]
        assert "initContainers" not in pod, role
    assert not drift.needs_update(desired, repaired)


def test_labels_the_operator_applied_and_no_longer_wants_are_removed_others_stay() -> None:
    owner = Owner("demo", "default", "uid-1", labels=(("team", "a"),))
    spec = InferenceServiceSpec.from_dict({"model": "smollm2-135m"}, name="demo", default_image="i")
    before = drift.recorded(build_children(owner, spec).get("Deployment"))
    live = served(before)
    live["metadata"]["annotations"].update(before["metadata"]["annotations"])  # kept by a server
    live["metadata"]["labels"]["mesh"] = "on"  # someone else's
    assert not drift.needs_update(before, live)
    after = drift.recorded(build_children(OWNER, spec).get("Deployment"))  # "team" taken off
    assert drift.needs_update(after, live)
    patch = drift.merge_patch(after, live)
    assert patch["metadata"]["labels"]["team"] is None and "mesh" not in patch["metadata"]["labels"]
    repaired = apply_merge_patch(live, patch)
    assert "team" not in repaired["metadata"]["labels"] and repaired["metadata"]["labels"]["mesh"]
    assert not drift.needs_update(after, repaired)
    unrecorded = served(build_children(owner, spec).get("Deployment"))  # made before the record
    assert "team" not in drift.merge_patch(after, unrecorded)["metadata"]["labels"]


def test_a_one_node_pin_no_longer_needed_is_removed() -> None:
    """A ReadWriteOnce claim shared by several pods pins them to one node (pod affinity to
    themselves, validation.check_cluster); once the spec no longer needs it (the claim switched
    to ReadWriteMany, one GPU replica) the affinity must go, else the pods stay on one node."""
    spec = InferenceServiceSpec.from_dict({"model": "pvc://c/m"}, name="demo", default_image="i")
    pinned = build_children(OWNER, spec, one_node=True).get("Deployment")
    live = served(pinned)
    assert not drift.needs_update(pinned, live)  # in sync: no churn
    desired = build_children(OWNER, spec).get("Deployment")
    assert drift.needs_update(desired, live)
    repaired = apply_merge_patch(live, drift.merge_patch(desired, live))
    assert "podAffinity" not in (repaired["spec"]["template"]["spec"].get("affinity") or {})
    assert not drift.needs_update(desired, repaired)


def test_a_size_limit_the_api_server_rewrote_is_in_sync() -> None:
    """The API server stores quantities in canonical form ("1.5Gi" reads back "1536Mi"), the
    emptyDir's sizeLimit too: the same amount is no drift (else a PATCH on every reconcile)."""
    desired = deployment({"model": "hf://org/m", "modelCache": {"sizeLimit": "1.5Gi"}})
    live = served(desired)
    (cache,) = [
        v for v in live["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-cache"
    ]
    cache["emptyDir"]["sizeLimit"] = "1536Mi"
    assert not drift.needs_update(desired, live)
    cache["emptyDir"]["sizeLimit"] = "2Gi"
    assert drift.needs_update(desired, live)
    ref = {"resource": "limits.memory", "divisor": "1024Ki"}  # an env var's divisor likewise
    desired = deployment(
        {"model": "/w", "env": [{"name": "M", "valueFrom": {"resourceFieldRef": ref}}]}
    )
    live = served(desired)
    (env,) = [
        e for e in live["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "M"
    ]
    env["valueFrom"]["resourceFieldRef"]["divisor"] = "1Mi"
    assert not drift.needs_update(desired, live)


def _omit_empty(obj: object) -> object:
    """What the API server stores: optional string fields that are empty are left out."""
    if isinstance(obj, dict):
        return {k: _omit_empty(v) for k, v in obj.items() if v != ""}
    if isinstance(obj, list):
        return [_omit_empty(v) for v in obj]
    return obj


def test_empty_strings_in_env_and_tolerations_are_no_drift() -> None:
    """`value: ""` (an empty variable), `effect: ""` (every effect): the API server stores these
    optional fields as absent; the live object is in sync, not patched on every reconcile."""
    desired = deployment({
        "model": "/w",
        "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": ""},
                {"name": "POD", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": ""}],
    })  # fmt: skip
    live = served(desired)
    pod = live["spec"]["template"]["spec"]
    pod["containers"][0]["env"] = _omit_empty(pod["containers"][0]["env"])
    pod["tolerations"] = _omit_empty(pod["tolerations"])
    assert not drift.needs_update(desired, live)


def test_an_unmounted_tuned_profile_leaves_no_annotation() -> None:
    """The pod template's serving.pagoda.dev/tuned-profile annotation says which profile the pods
    mount; once the profile is no longer mounted (autotune off, another GPU product) it must go
    with the volume and the flags, not claim a profile the pods do not have."""
    from pagoda.operator.autotune.mount import PROFILE_ANNOTATION, TunedMount

    spec = InferenceServiceSpec.from_dict(
        {"model": "pvc://c/m", "resources": {"gpus": 1}}, name="demo", default_image="i"
    )
    tuned = build_children(OWNER, spec, tuned=TunedMount("pagoda-tuned-x", "h1")).get("Deployment")
    live = served(tuned)
    assert PROFILE_ANNOTATION in live["spec"]["template"]["metadata"]["annotations"]
    assert not drift.needs_update(tuned, live)  # in sync: no churn
    desired = build_children(OWNER, spec).get("Deployment")
    repaired = apply_merge_patch(live, drift.merge_patch(desired, live))
    annotations = repaired["spec"]["template"]["metadata"]["annotations"]
    assert PROFILE_ANNOTATION not in annotations
    assert "kubectl.kubernetes.io/restartedAt" in annotations  # others' annotations stay
    assert not drift.needs_update(desired, repaired)
