"""The pieces of hf:// / s3:// serving the operator renders or reads, without a cluster: the spec
fields, the model-download init container (children/model_cache.py) and a pod's named failure
(spec/pod_failure.py + reconcile/pods.py)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from pagoda.operator.children.deployment import build_deployment
from pagoda.operator.children.owner import Owner
from pagoda.operator.reconcile.pods import PodFailures
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.operator.spec.pod_failure import pod_failure
from pagoda.operator.spec.status import compute_status
from pagoda.runtime.server.cli import build_parser

MOUNT = "/var/cache/pagoda/models"


def spec(**fields: Any) -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(fields, name="svc", default_image="img:1")


def pod_spec(s: InferenceServiceSpec) -> dict[str, Any]:
    d = build_deployment(Owner("svc", "default", "uid-1"), s, config_hash_value="h")
    return d["spec"]["template"]["spec"]


def test_remote_model_gets_the_init_container_the_cache_and_an_offline_server() -> None:
    ps = pod_spec(spec(model="hf://org/m@v2", modelSecretRef={"name": "hf"},
                       env=[{"name": "HF_ENDPOINT", "value": "http://mirror"}]))  # fmt: skip
    (init,) = ps["initContainers"]
    assert init["command"] == ["pagoda", "download"]
    assert init["args"] == ["--model", "hf://org/m@v2", "--download-dir", MOUNT]
    assert init["envFrom"] == [{"secretRef": {"name": "hf"}}]
    assert {"name": "HF_ENDPOINT", "value": "http://mirror"} in init["env"]
    assert {"name": "model-cache", "mountPath": MOUNT} in init["volumeMounts"]
    assert {"name": "model-cache", "emptyDir": {}} in ps["volumes"]
    (server,) = ps["containers"]
    assert "envFrom" not in server  # the credentials stay in the init container
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"]
    assert {"name": "model-cache", "mountPath": MOUNT, "readOnly": True} in server["volumeMounts"]
    args = build_parser().parse_args(server["args"])  # the real `pagoda serve` parser
    assert (args.model, args.download_dir) == ("hf://org/m@v2", MOUNT)


def test_model_cache_shapes() -> None:
    ps = pod_spec(spec(model="s3://models/llama", modelCache={"claimName": "models"}))
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}} in ps[
        "volumes"
    ]
    ps = pod_spec(spec(model="s3://models/llama", modelCache={"sizeLimit": "2Gi"}))
    assert {"name": "model-cache", "emptyDir": {"sizeLimit": "2Gi"}} in ps["volumes"]
    assert ps["initContainers"][0]["args"][-2:] == ["--download-size-limit", str(2 << 30)]
    assert "initContainers" not in pod_spec(spec(model="smollm2-135m"))
    ps = pod_spec(spec(model="hf://o/m", modelCache={"claimName": "models", "prune": True}))
    init_args = ps["initContainers"][0]["args"]
    assert init_args[-1] == "--prune"
    from pagoda.runtime.model.sources.cli import add_arguments  # the real `pagoda download`

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(init_args).prune is True


def deadline(s: InferenceServiceSpec) -> int:
    d = build_deployment(Owner("svc", "default", "uid-1"), s, config_hash_value="h")
    return d["spec"]["progressDeadlineSeconds"]


def test_a_download_counts_into_the_progress_deadline() -> None:
    """A remote model's download runs before the startup probe: a long one (a 400 GB model over
    a slow link) must not show as a stalled rollout (Degraded=RolloutStalled)."""
    assert deadline(spec(model="smollm2-135m", startupTimeoutSeconds=600)) == 600 + 300
    assert deadline(spec(model="hf://o/m", startupTimeoutSeconds=600)) == 600 + 3600 + 300
    long = spec(
        model="s3://models/m",
        startupTimeoutSeconds=600,
        modelCache={"downloadDeadlineSeconds": 7200},
    )
    assert deadline(long) == 600 + 7200 + 300
    cached = spec(model="hf://o/m", modelCache={"claimName": "c", "downloadDeadlineSeconds": 0})
    assert deadline(cached) == 1800 + 300


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"model": "smollm2-135m", "modelCache": {"claimName": "x"}}, "hf:// and s3:// models only"),
        ({"model": "pvc://c/m", "modelSecretRef": {"name": "s"}}, "hf:// and s3:// models only"),
        ({"model": "hf://o/m", "modelCache": {"claimName": "x", "sizeLimit": "1Gi"}}, "set one"),
        ({"model": "hf://o/m", "modelCache": {"claimName": "Bad_Name"}}, "not a valid PVC name"),
        ({"model": "hf://o/m", "modelSecretRef": {}}, "must be a Secret's name"),
        ({"model": "hf://o/m", "modelCache": {"prune": True}}, "set claimName too"),
        ({"model": "pvc://c/m", "modelCache": {"downloadDeadlineSeconds": 60}}, "hf:// and s3:// models only"),
        ({"model": "hf://o/m", "modelCache": {"downloadDeadlineSeconds": -1}}, "between 0 and 86400"),
    ],
)  # fmt: skip
def test_invalid_combinations(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as e:
        spec(**fields)
    assert words in e.value.message


def pod(name: str, init: dict | None = None, server: dict | None = None, **meta: Any) -> dict:
    labels = {"app.kubernetes.io/instance": "svc"}
    status: dict[str, Any] = {}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "model-download", **init}]
    if server is not None:
        status["containerStatuses"] = [{"name": "server", **server}]
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels, **meta},
        "status": status,
    }


CRASH = {"state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 2, "message": "ModelDownloadFailed/NotFound: hf://o/m: gone\n"}}}  # fmt: skip


def test_which_container_states_are_failures() -> None:
    f = pod_failure(pod("p1", init=CRASH))
    assert (f.reason, f.message, f.container) == (
        "ModelDownloadFailed",
        "NotFound: hf://o/m: gone",
        "init container model-download",
    )
    assert pod_failure(pod("p1", init={**CRASH, "state": {"running": {}}})) is None
    ok = {"state": {"terminated": {"exitCode": 0}}, "lastState": CRASH["lastState"]}
    assert pod_failure(pod("p1", init=ok)) is None  # it ran again and succeeded
    logs = {"state": {"terminated": {"exitCode": 1, "message": "Traceback (most recent..."}}}
    assert pod_failure(pod("p1", server=logs)) is None  # the kubelet's log fallback: no reason
    for tail in ("INFO:     Waiting for application startup.\nKilled", "ValueError: bad input"):
        logs = {"state": {"terminated": {"exitCode": 1, "message": tail}}}
        assert pod_failure(pod("p1", server=logs)) is None, tail  # a log line is no reason
    named = {"state": {"terminated": {"exitCode": 2, "message": "InvalidArguments: bad flag"}}}
    assert pod_failure(pod("p1", server=named)).reason == "InvalidArguments"  # any container
    assert pod_failure(pod("p1", init=CRASH, deletionTimestamp="2026-01-01T00:00:00Z")) is None


def test_registry_and_status() -> None:
    reg = PodFailures()
    assert reg.observe("ADDED", pod("b", init=CRASH)) == (True, reg.failure("ns", "svc"))
    assert reg.observe("MODIFIED", pod("b", init=CRASH)) == (False, None)  # same failure again
    changed, new = reg.observe("ADDED", pod("a", init=CRASH))
    assert changed and new is not None and reg.failure("ns", "svc").pod == "a"  # stable pick
    assert reg.observe("DELETED", pod("a", init=CRASH))[0]
    assert reg.observe("MODIFIED", pod("b", init={"state": {"running": {}}}))[0]
    assert reg.failure("ns", "svc") is None

    deployment = {"spec": {"replicas": 1}, "status": {"replicas": 1}}
    failure = pod_failure(pod("b", init=CRASH))
    conditions = compute_status({"metadata": {"name": "svc"}}, deployment, pod_failure=failure)[
        "conditions"
    ]
    by_type = {c["type"]: c for c in conditions}
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == (
        "False",
        "ModelDownloadFailed",
    )
    assert by_type["Degraded"]["status"] == "True"
    assert (
        by_type["Degraded"]["message"]
        == "NotFound: hf://o/m: gone (pod b, init container model-download)"
    )


def test_a_group_pods_failure_outlives_its_recreation() -> None:
    """LWS's RecreateGroupOnPodRestart deletes a group as soon as one rank's container restarts
    and recreates it under the same pod names: the failure stays through the recreation and the
    reload (one Event, not one per cycle) until that pod is Ready again, or a new spec is
    reconciled. A Deployment's deleted pod takes its failure with it, as before."""
    role = {"labels": {"app.kubernetes.io/instance": "svc", "serving.pagoda.dev/role": "worker"}}
    fit = {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {
        "exitCode": 2, "message": "ModelDoesNotFit: weights 70.6 GiB exceed the 44.2 GiB free"}}}  # fmt: skip
    reg = PodFailures()
    changed, new = reg.observe("MODIFIED", pod("svc-lws-0-1", server=fit, **role))
    assert changed and new is not None and new.reason == "ModelDoesNotFit"
    deleting = pod("svc-lws-0-1", server=fit, deletionTimestamp="2026-01-01T00:00:00Z", **role)
    assert reg.observe("MODIFIED", deleting) == (False, None)
    assert reg.observe("DELETED", deleting) == (False, None)
    loading = pod("svc-lws-0-1", server={"state": {"running": {}}}, **role)
    assert reg.observe("ADDED", loading) == (False, None)  # recreated, loading the model
    assert reg.failure("ns", "svc").reason == "ModelDoesNotFit"
    assert reg.observe("MODIFIED", pod("svc-lws-0-1", server=fit, **role)) == (False, None)
    assert reg.observe("DELETED", deleting) == (False, None)  # the next cycle: still shown
    ready = {**loading, "status": {**loading["status"], "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    assert reg.observe("MODIFIED", ready) == (True, None) and reg.failure("ns", "svc") is None

    reg.observe("MODIFIED", pod("svc-lws-0-1", server=fit, **role))
    reg.observe("DELETED", deleting)
    assert reg.forget_departed("ns", "svc") and reg.failure("ns", "svc") is None
    reg.observe("MODIFIED", pod("d1", server=fit))  # a Deployment's pod
    assert reg.observe("DELETED", pod("d1", server=fit))[0] and reg.failure("ns", "svc") is None


def test_a_container_that_cannot_start_is_named() -> None:
    """A spec.modelSecretRef naming a Secret that is not there: the kubelet never starts the
    download container; its waiting reason becomes the condition, not an endless Progressing."""
    stuck = {"state": {"waiting": {"reason": "CreateContainerConfigError",
                                   "message": 'secret "hf-token" not found'}}}  # fmt: skip
    f = pod_failure(pod("p1", init=stuck))
    assert (f.reason, f.message, f.container) == (
        "CreateContainerConfigError",
        'secret "hf-token" not found',
        "init container model-download",
    )
    pull = {
        "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}
        }
    }
    assert pod_failure(pod("p1", server=pull)).reason == "ImagePullBackOff"
    starting = {"state": {"waiting": {"reason": "PodInitializing"}}}
    assert pod_failure(pod("p1", init=starting, server=starting)) is None  # passes by itself
    deployment = {"spec": {"replicas": 1}, "status": {"replicas": 1}}
    conditions = compute_status({"metadata": {"name": "svc"}}, deployment, pod_failure=f)
    ready = {c["type"]: c for c in conditions["conditions"]}["Ready"]
    assert ready["reason"] == "CreateContainerConfigError" and "hf-token" in ready["message"]


async def test_claims_no_pod_of_the_service_could_use_are_refused(kube: Any) -> None:
    """Against the emulator's PVCs: a ReadWriteOncePod claim admits one pod cluster-wide (a
    group's other ranks, a second replica or a rollout's surge pod would stay Pending forever); a
    ReadOnlyMany cache cannot be downloaded into. One pod that never surges (a GPU pod), or a
    ReadWriteMany claim, passes."""
    import logging

    from pagoda.operator.spec.validation import check_cluster

    for name, modes in (("once", ["ReadWriteOncePod"]), ("ro", ["ReadOnlyMany"]),
                        ("rwx", ["ReadWriteMany"])):  # fmt: skip
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"accessModes": modes, "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
        await kube.create(pvc)
    await kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node"}})
    gpus = {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}  # as the device plugin reports
    await kube.patch("Node", None, "gpu-node", gpus, subresource="status")
    log = logging.getLogger("test")
    refused = (
        ({"model": "pvc://once/m", "parallelism": {"nodes": 2}}, "groups of 2 pods"),
        ({"model": "pvc://once/m", "replicas": 2, "resources": {"gpus": 1}}, "up to 2 replicas"),
        ({"model": "pvc://once/m"}, "a second pod during each rollout"),
        ({"model": "hf://o/m", "modelCache": {"claimName": "ro"}}, "is ReadOnlyMany"),
    )
    for fields, words in refused:
        with pytest.raises(SpecError, match=words) as e:
            await check_cluster(kube, spec(**fields), "default", log)
        assert e.value.reason == "PVCAccessMode"
    for fields in (
        {"model": "pvc://once/m", "resources": {"gpus": 1}},
        {"model": "pvc://ro/m", "replicas": 3},  # read only: ReadOnlyMany is fine
        {"model": "hf://o/m", "modelCache": {"claimName": "rwx"}, "replicas": 3},
    ):
        await check_cluster(kube, spec(**fields), "default", log)


async def test_pods_sharing_a_read_write_once_claim_are_pinned_to_one_node(
    emulator: Any, kube: Any, start_operator: Any
) -> None:
    """A ReadWriteOnce claim attaches to one node at a time and the scheduler does not know: a
    second replica (or a CPU pod's rollout surge) placed on another node hangs in
    ContainerCreating (Multi-Attach error). The operator pins such a Deployment's pods to one
    node (required pod affinity to themselves by hostname) and says so once in an Event; a
    multi-node group, which must span nodes, is refused; one GPU pod is left as it was."""
    import logging

    from operator_harness import DEPLOY, ISVC, wait_for
    from operator_helpers import condition, create_isvc, mark_available
    from pagoda.operator.spec.validation import check_cluster

    rwo = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "rwo", "namespace": "default"},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    await kube.create(rwo)
    log = logging.getLogger("test")
    for fields, words in (
        ({"model": "pvc://rwo/m", "replicas": 2}, "up to 2 replicas"),
        ({"model": "hf://o/m", "modelCache": {"claimName": "rwo"},
          "autoscaling": {"maxReplicas": 3, "targetQueueDepth": 2}}, "up to 3 replicas"),
        ({"model": "pvc://rwo/m"}, "a second pod during each rollout"),
    ):  # fmt: skip
        why = await check_cluster(kube, spec(**fields), "default", log)
        assert why is not None and "is ReadWriteOnce" in why and words in why, why
    await kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node"}})
    gpus = {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    await kube.patch("Node", None, "gpu-node", gpus, subresource="status")
    assert await check_cluster(kube, spec(model="pvc://rwo/m", resources={"gpus": 1}), "default", log) is None  # fmt: skip
    group = spec(model="pvc://rwo/m", parallelism={"nodes": 2}, resources={"gpus": 1})
    with pytest.raises(SpecError, match="ReadWriteOnce: its volume attaches to one node") as e:
        await check_cluster(kube, group, "default", log)
    assert e.value.reason == "PVCAccessMode"

    await start_operator()
    await create_isvc(kube, "chat", {"model": "pvc://rwo/m", "replicas": 2})
    deployment = await wait_for(lambda: emulator.live(DEPLOY, "default", "chat"))
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    pinned = lambda: [  # noqa: E731
        e for e in emulator.live_all("v1/events") if e["reason"] == "PinnedToOneNode"
    ]
    (event,) = await wait_for(pinned)
    assert "PersistentVolumeClaim 'rwo'" in event["message"], event["message"]
    # a later reconcile (a spec change) keeps the affinity and does not repeat the Event
    await kube.patch("InferenceService", "default", "chat", {"spec": {"replicas": 3}})
    await wait_for(lambda: emulator.live(DEPLOY, "default", "chat")["spec"]["replicas"] == 3)
    assert (
        "podAffinity"
        in emulator.live(DEPLOY, "default", "chat")["spec"]["template"]["spec"]["affinity"]
    )
    assert len(pinned()) == 1
    assert emulator.live(ISVC, "default", "chat") is not None
    # a Deployment event restores the child from the spec: it keeps the pin (only the full
    # reconcile, which reads the claim, decides it)
    await mark_available(kube, "chat")
    await wait_for(lambda: condition(emulator, "chat", "Ready").get("status") == "True")
    uid = emulator.live(DEPLOY, "default", "chat")["metadata"]["uid"]
    assert "podAffinity" in emulator.live(DEPLOY, "default", "chat")["spec"]["template"][
        "spec"
    ].get("affinity", {})
    # a Deployment deleted by hand comes back pinned (not spread until the next resync)
    await kube.delete("Deployment", "default", "chat")
    restored = await wait_for(
        lambda: (
            (d := emulator.live(DEPLOY, "default", "chat")) and d["metadata"]["uid"] != uid and d
        )
    )
    assert "podAffinity" in restored["spec"]["template"]["spec"].get("affinity", {})
    # one GPU pod that never surges no longer shares the claim: the pin goes, the pods may spread
    await kube.patch(
        "InferenceService", "default", "chat", {"spec": {"replicas": 1, "resources": {"gpus": 1}}}
    )
    await wait_for(
        lambda: (
            "podAffinity"
            not in (
                emulator.live(DEPLOY, "default", "chat")["spec"]["template"]["spec"].get("affinity")
                or {}
            )
        )
    )
