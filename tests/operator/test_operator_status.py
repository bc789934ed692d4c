"""Status from the Deployment: conditions, counts, transitions (pure)."""

from __future__ import annotations

from typing import Any

from kube_api import merge_patch
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.pod_failure import PodFailure
from pagoda.operator.spec.status import compute_status, condition, merge_diff, status_patch

ISVC = {"metadata": {"name": "demo", "namespace": "default", "generation": 3}}


def deploy(
    replicas: int = 2,
    ready: int = 0,
    updated: int = 0,
    total: int | None = None,
    observed: int = 1,
    **conds: Any,
) -> dict:
    conditions = [
        {"type": t, "status": s[0], "reason": s[1], "message": f"{t} says {s[1]}"}
        for t, s in conds.items()
    ]
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed, "replicas": replicas if total is None else total,
            "readyReplicas": ready, "updatedReplicas": updated, "availableReplicas": ready, "conditions": conditions,
        },
    }  # fmt: skip


def conds(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_rolling_out_then_ready() -> None:
    s = compute_status(ISVC, deploy(ready=0, updated=1), url="http://u")
    assert conds(s) == {
        "Ready": ("False", "Unavailable"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "AsExpected"),
    }
    assert s["url"] == "http://u" and s["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in s["conditions"])
    s = compute_status(
        ISVC, deploy(ready=2, updated=2, Available=("True", "MinimumReplicasAvailable"))
    )
    assert conds(s)["Ready"] == ("True", "Available") and conds(s)["Progressing"] == (
        "False",
        "RolloutComplete",
    )
    assert (s["replicas"], s["readyReplicas"]) == (2, 2)
    assert (
        s["selector"]
        == "app.kubernetes.io/name=pagoda,app.kubernetes.io/instance=demo,app.kubernetes.io/component=inference-server"
    )


def test_ready_while_a_replica_serves_though_the_deployment_is_not_available() -> None:
    """A scale-up that lets no pod down (maxUnavailable 0), or one crashed pod, makes the
    Deployment not Available while its ready replicas still serve: Ready stays True."""
    scaling_up = deploy(
        replicas=3, ready=2, updated=3, Available=("False", "MinimumReplicasUnavailable")
    )
    s = compute_status(ISVC, scaling_up)
    assert conds(s)["Ready"] == ("True", "PartiallyAvailable")
    msg = condition({"status": s}, "Ready")["message"]
    assert msg == (
        "2/3 replicas ready, 3/3 updated; the Deployment is not Available: "
        "Available says MinimumReplicasUnavailable"
    )
    assert conds(s)["Progressing"] == ("True", "RollingOut")
    # a failing pod names Degraded, but a service that serves stays Ready
    failure = PodFailure("EngineDied", "the engine died", "p1", "container server")
    s = compute_status(ISVC, scaling_up, pod_failure=failure)
    assert conds(s)["Ready"] == ("True", "PartiallyAvailable")
    assert conds(s)["Degraded"] == ("True", "EngineDied")
    # no replica ready: not Ready, whatever the Deployment says
    none = deploy(replicas=2, ready=0, updated=2, Available=("True", "MinimumReplicasAvailable"))
    assert conds(compute_status(ISVC, none))["Ready"] == ("False", "Unavailable")


def test_unobserved_generation_is_progressing() -> None:
    d = deploy(ready=2, updated=2, Available=("True", "x"))
    d["metadata"]["generation"] = 2
    assert conds(compute_status(ISVC, d))["Progressing"] == ("True", "RollingOut")


def test_stalled_rollout_and_replica_failure_are_degraded() -> None:
    stalled = deploy(Progressing=("False", "ProgressDeadlineExceeded"))
    assert conds(compute_status(ISVC, stalled))["Degraded"] == ("True", "RolloutStalled")
    failing = deploy(ReplicaFailure=("True", "FailedCreate"))
    s = compute_status(ISVC, failing)
    assert conds(s)["Degraded"] == ("True", "ReplicaFailure")
    assert (
        condition(s and {"status": s}, "Degraded")["message"] == "ReplicaFailure says FailedCreate"
    )


def test_spec_error_is_degraded_but_old_replicas_still_serve() -> None:
    err = SpecError("UnknownModel", "unknown built-in model 'x'")
    s = compute_status(ISVC, None, spec_error=err)
    assert conds(s) == {
        "Ready": ("False", "UnknownModel"),
        "Progressing": ("False", "UnknownModel"),
        "Degraded": ("True", "UnknownModel"),
    }
    s = compute_status(ISVC, deploy(ready=2, updated=2, Available=("True", "x")), spec_error=err)
    assert conds(s)["Ready"] == ("True", "Available") and conds(s)["Degraded"] == (
        "True",
        "UnknownModel",
    )


def test_scaled_to_zero() -> None:
    assert conds(compute_status(ISVC, deploy(replicas=0)))["Ready"] == ("False", "ScaledToZero")


def test_transition_times_survive_unchanged_conditions_and_patch_is_minimal() -> None:
    first = compute_status(ISVC, deploy(ready=1, updated=1, Available=("True", "x")))
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    body = {**ISVC, "status": {**first, "autoscaling": {"desiredReplicas": 2}}}
    again = compute_status(body, deploy(ready=1, updated=1, Available=("True", "x")))
    assert again["conditions"][0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert status_patch(body["status"], again) is None  # nothing to write
    later = compute_status(body, deploy(ready=2, updated=2, Available=("True", "x")))
    patch = status_patch(body["status"], later)
    assert set(patch) == {"conditions", "readyReplicas", "updatedReplicas"}
    assert "autoscaling" not in patch  # the autoscaler's part is never touched


def test_other_writers_conditions_are_kept() -> None:
    mine = compute_status(ISVC, deploy(ready=1, updated=1, Available=("True", "x")))
    foreign = {
        "type": "MetricsUnavailable",
        "status": "True",
        "reason": "PrometheusDown",
        "message": "no data",
    }
    body = {**ISVC, "status": {**mine, "conditions": [*mine["conditions"], foreign]}}
    again = compute_status(body, deploy(ready=1, updated=1, Available=("True", "x")))
    assert foreign in again["conditions"] and status_patch(body["status"], again) is None


def test_condition_messages_fit_the_crd() -> None:
    """The CRD caps a condition message at 32768 characters (a longer status is rejected)."""
    body = {"metadata": {"name": "demo", "generation": 1}}
    st = compute_status(body, None, spec_error=SpecError("InvalidSpec", "x" * 100_000))
    assert max(len(c["message"]) for c in st["conditions"]) == 32768


def test_merge_diff_nulls_what_went() -> None:
    """The autoscaler's status.autoscaling patch: a key the new value no longer has is nulled
    (a merge patch keeps what it omits: an idle service once kept its last TTFT and was written
    every evaluation), nested objects are diffed, lists replaced, nothing when equal."""
    old = {"reason": "A", "metrics": {"ttft": 3.0, "ratio": 6.0}, "state": {"s": [1, 2]}}
    new = {"reason": "A", "metrics": {"ratio": 0.0}, "state": {"s": [2]}, "since": "t"}
    patch = merge_diff(old, new)
    assert patch == {"metrics": {"ttft": None, "ratio": 0.0}, "state": {"s": [2]}, "since": "t"}
    assert merge_patch(old, patch) == new
    assert merge_diff(new, new) == {} and merge_diff(None, new) == new
