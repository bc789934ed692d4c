"""The real kopf operator (main.serve) against the stateful API-server emulator on loopback."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp
import pytest
from kube_emulator import Emulator
from operator_harness import wait_for
from operator_helpers import (
    CM,
    DEPLOY,
    EXAMPLE_SPEC,
    ISVC,
    ISVC_PATH,
    PDB,
    SVC,
    assert_permitted,
    children,
    condition,
    create_isvc,
    mark_available,
    operator_requests,
    patch_isvc,
    writes_during,
)
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.kube.names import CONFIG_HASH_ANNOTATION

pytestmark = pytest.mark.e2e


# --- tests ------------------------------------------------------------------------------------------


async def test_create_then_ready_with_latency(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    latencies = []
    for i in range(5):
        name = f"smol-{i}"
        t0 = time.monotonic()
        isvc = await create_isvc(kube, name, EXAMPLE_SPEC)
        await wait_for(
            lambda n=name: all(children(emulator, n).values()), what=f"children of {name}"
        )
        latencies.append(time.monotonic() - t0)
        for kind, child in children(emulator, name).items():
            (ref,) = child["metadata"]["ownerReferences"]
            assert (ref["uid"], ref["kind"], ref["controller"]) == (
                isvc["metadata"]["uid"],
                "InferenceService",
                True,
            ), kind
    record = {
        "n": len(latencies),
        "p50_s": statistics.median(latencies),
        "max_s": max(latencies),
        "all_s": latencies,
    }
    print(
        f"\nreconcile latency (CR created -> Deployment+Service+ConfigMap present): {json.dumps(record)}"
    )
    assert record["max_s"] < 5.0

    await wait_for(
        lambda: condition(emulator, "smol-0", "Progressing").get("status") == "True",
        what="Progressing",
    )
    assert condition(emulator, "smol-0", "Ready")["status"] == "False"
    assert emulator.live(PDB, "default", "smol-0") is None  # one replica: no PDB
    mark = len(emulator._requests)
    await mark_available(kube, "smol-0")
    await wait_for(
        lambda: condition(emulator, "smol-0", "Ready").get("status") == "True", what="Ready"
    )
    await asyncio.sleep(0.3)
    writes = [
        f"{r.method.value} {r.url.path}"
        for r in operator_requests(emulator, mark)
        if r.method.value != "GET" and r.name in ("smol-0", "smol-0-config")
    ]
    # The Deployment event changed only its status: the operator writes the CR's status, nothing else.
    assert writes == [f"PATCH {ISVC_PATH}/smol-0/status"], writes
    body = emulator.live(ISVC, "default", "smol-0")
    assert body["status"]["url"] == "http://smol-0.default.svc.cluster.local:8000/v1"
    assert body["status"]["readyReplicas"] == 1 and body["status"]["observedGeneration"] == 1
    assert condition(emulator, "smol-0", "Progressing")["reason"] == "RolloutComplete"
    assert not (body["metadata"].get("finalizers") or [])  # deletion never waits for the operator
    # Settled: no writes without a change (a real server would not even see them).
    assert await writes_during(emulator, 1.0) == []
    assert_permitted(emulator)


async def test_spec_update_rolls_the_deployment_and_scales(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    await create_isvc(kube, "roll", {"model": "smollm2-135m", "engine": {"maxNumSeqs": 8}})
    deploy = await wait_for(lambda: emulator.live(DEPLOY, "default", "roll"), what="deployment")
    old_hash = deploy["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]

    await patch_isvc(kube, "roll", {"spec": {"engine": {"maxNumSeqs": 16}}})

    def new_hash() -> str | None:
        d = emulator.live(DEPLOY, "default", "roll")
        value = d["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        return value if value != old_hash else None

    await wait_for(new_hash, what="a new pod-template hash")
    deploy = emulator.live(DEPLOY, "default", "roll")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "16" and deploy["metadata"]["generation"] == 2
    assert '"maxNumSeqs": 16' in emulator.live(CM, "default", "roll-config")["data"]["engine.json"]
    await wait_for(
        lambda: (
            (emulator.live(ISVC, "default", "roll")["status"] or {}).get("observedGeneration") == 2
        )
    )

    await patch_isvc(kube, "roll", {"spec": {"replicas": 3}})
    await wait_for(
        lambda: emulator.live(DEPLOY, "default", "roll")["spec"]["replicas"] == 3, what="3 replicas"
    )
    await wait_for(lambda: emulator.live(PDB, "default", "roll"), what="a PDB")
    await patch_isvc(kube, "roll", {"spec": {"replicas": 1}})
    await wait_for(lambda: emulator.live(PDB, "default", "roll") is None, what="the PDB gone")
    assert_permitted(emulator)


async def test_deleted_or_edited_children_are_restored(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    await create_isvc(kube, "heal", EXAMPLE_SPEC)
    await wait_for(lambda: all(children(emulator, "heal").values()), what="children")
    before = {kind: child["metadata"]["uid"] for kind, child in children(emulator, "heal").items()}
    for kind, name in (("Deployment", "heal"), ("Service", "heal"), ("ConfigMap", "heal-config")):
        assert await kube.delete(kind, "default", name)

    def restored() -> bool:
        now = children(emulator, "heal")
        return all(now[k] and now[k]["metadata"]["uid"] != before[k] for k in before)

    await wait_for(restored, what="children recreated")

    await kube.patch(
        "Deployment",
        "default",
        "heal",
        {"spec": {"template": {"spec": {"containers": [{"name": "server", "image": "evil:1"}]}}}},
    )
    await kube.patch("ConfigMap", "default", "heal-config", {"data": {"engine.json": "{}"}})

    def repaired() -> bool:
        d, cm = (
            emulator.live(DEPLOY, "default", "heal"),
            emulator.live(CM, "default", "heal-config"),
        )
        image = d["spec"]["template"]["spec"]["containers"][0]["image"]
        return image != "evil:1" and cm["data"]["engine.json"] != "{}"

    await wait_for(repaired, what="hand edits reverted")
    assert (
        emulator.live(DEPLOY, "default", "heal")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ][0]
        == "--model"
    )
    assert_permitted(emulator)


async def test_invalid_spec_is_degraded_without_retry_storm(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    await create_isvc(kube, "bad", {"model": "llama-70b"})
    degraded = await wait_for(
        lambda: (
            condition(emulator, "bad", "Degraded").get("status") == "True"
            and condition(emulator, "bad", "Degraded")
        )
    )
    assert (
        degraded["reason"] == "UnknownModel"
        and "unknown built-in model 'llama-70b'" in degraded["message"]
    )
    assert condition(emulator, "bad", "Ready")["status"] == "False"
    events = await wait_for(
        lambda: [e for e in emulator.live_all("v1/events") if e["reason"] == "UnknownModel"],
        what="event",
    )
    assert events[0]["involvedObject"]["name"] == "bad" and events[0]["type"] == "Warning"
    assert not any(children(emulator, "bad").values())
    await asyncio.sleep(0.3)  # let kopf store its bookkeeping annotations
    calls = len(list(operator_requests(emulator)))
    await asyncio.sleep(1.5)  # a TemporaryError would retry within a second or two
    assert len(list(operator_requests(emulator))) - calls <= 1, "the invalid spec is being retried"

    await patch_isvc(kube, "bad", {"spec": {"model": "smollm2-135m"}})
    await wait_for(lambda: all(children(emulator, "bad").values()), what="children after the fix")
    await wait_for(
        lambda: condition(emulator, "bad", "Degraded").get("status") == "False", what="not degraded"
    )
    assert_permitted(emulator)


async def test_cluster_checks_heal_on_resync(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator(resync_interval_s=0.5)
    await kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": "cpu-node"}})
    await create_isvc(kube, "llama", {"model": "pvc://models/llama-3.1-8b"})
    await create_isvc(kube, "gpu", {"model": "smollm2-135m", "resources": {"gpus": 1}})
    await wait_for(
        lambda: condition(emulator, "llama", "Degraded").get("reason") == "PVCNotFound",
        what="PVCNotFound",
    )
    assert "PersistentVolumeClaim 'models'" in condition(emulator, "llama", "Degraded")["message"]
    await wait_for(
        lambda: condition(emulator, "gpu", "Degraded").get("reason") == "InsufficientGPU",
        what="InsufficientGPU",
    )
    assert (
        emulator.live(DEPLOY, "default", "llama") is None
        and emulator.live(DEPLOY, "default", "gpu") is None
    )

    pvc = {
        "metadata": {"name": "models"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "50Gi"}}},
    }
    await kube.request("POST", "/api/v1/namespaces/default/persistentvolumeclaims", body=pvc)
    await kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": "gpu-node"}})
    gpu_status = {
        "status": {"allocatable": {"nvidia.com/gpu": "8"}}
    }  # as the device plugin reports it
    await kube.request(
        "PATCH",
        "/api/v1/nodes/gpu-node/status",
        body=gpu_status,
        content_type="application/merge-patch+json",
    )
    await wait_for(
        lambda: (
            emulator.live(DEPLOY, "default", "llama") and emulator.live(DEPLOY, "default", "gpu")
        ),
        what="healed",
    )
    volumes = emulator.live(DEPLOY, "default", "llama")["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in volumes
    await wait_for(lambda: condition(emulator, "llama", "Degraded").get("status") == "False")
    await wait_for(lambda: condition(emulator, "gpu", "Degraded").get("status") == "False")
    assert (
        await writes_during(emulator, 1.2) == []
    )  # two resyncs: in sync, so no writes (no flapping)
    assert_permitted(emulator)


async def test_api_hiccups_are_retried(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    emulator.fail("POST", "deployments", status=503, times=2)
    t0 = time.monotonic()
    await create_isvc(kube, "flaky", EXAMPLE_SPEC)
    await wait_for(
        lambda: emulator.live(DEPLOY, "default", "flaky"),
        timeout=15,
        what="deployment after retries",
    )
    assert time.monotonic() - t0 >= 1.0  # backed off (1 s, then 2 s) rather than spinning
    assert emulator.faults[0][3] == 0
    assert condition(emulator, "flaky", "Degraded").get("status") != "True"


async def test_deletion_leaves_nothing_behind(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    await create_isvc(kube, "gone", {**EXAMPLE_SPEC, "replicas": 2})
    await wait_for(
        lambda: all(children(emulator, "gone").values()) and emulator.live(PDB, "default", "gone"),
        what="children",
    )
    await kube.delete("InferenceService", "default", "gone")
    await wait_for(lambda: not any(children(emulator, "gone").values()), what="children gone")
    await asyncio.sleep(0.5)  # nothing resurrects them
    assert (
        not any(children(emulator, "gone").values())
        and emulator.live(PDB, "default", "gone") is None
    )
    assert emulator.live(ISVC, "default", "gone") is None


async def test_resume_after_restart_and_autoscaler_owned_replicas(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    spec = {
        "model": "smollm2-135m",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 4},
    }
    await create_isvc(kube, "auto", spec)  # while no operator runs
    await start_operator(autoscale_interval_s=0.5)
    await wait_for(lambda: emulator.live(DEPLOY, "default", "auto"), what="resumed")
    assert emulator.live(DEPLOY, "default", "auto")["spec"]["replicas"] == 1
    await kube.patch(
        "Deployment", "default", "auto", {"spec": {"replicas": 3}}
    )  # the autoscaler scales up
    await mark_available(kube, "auto")
    await wait_for(
        lambda: (
            (emulator.live(ISVC, "default", "auto").get("status") or {}).get("readyReplicas") == 3
        )
    )
    assert emulator.live(DEPLOY, "default", "auto")["spec"]["replicas"] == 3  # not reverted
    await kube.patch("Deployment", "default", "auto", {"spec": {"replicas": 9}})  # out of bounds
    await wait_for(  # by the autoscaler (no metrics: it holds, within the bounds)
        lambda: emulator.live(DEPLOY, "default", "auto")["spec"]["replicas"] == 4,
        what="clamped to max",
    )


async def test_service_monitor_with_prometheus_operator(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    emulator.resources["monitoring.coreos.com/v1/servicemonitors"] = {
        "kind": "ServiceMonitor", "namespaced": True, "verbs": {"get", "list", "create", "patch", "delete"},
    }  # fmt: skip
    op = await start_operator()
    await create_isvc(kube, "watched", EXAMPLE_SPEC)
    sm = await wait_for(
        lambda: emulator.live("monitoring.coreos.com/v1/servicemonitors", "default", "watched")
    )
    assert sm["spec"]["endpoints"][0]["port"] == "http"
    assert "release" not in sm["metadata"]["labels"]
    # --monitoring-label release=...: the restarted operator labels the existing one (so a
    # kube-prometheus-stack Prometheus selects it)
    await op.shutdown()
    op = await start_operator(monitoring_labels=(("release", "kube-prometheus-stack"),))
    await wait_for(
        lambda: (
            emulator.live("monitoring.coreos.com/v1/servicemonitors", "default", "watched")[
                "metadata"
            ]["labels"].get("release")
            == "kube-prometheus-stack"
        ),
        what="the ServiceMonitor labelled",
    )
    # --no-service-monitors (the chart's runtime ServiceMonitor on): the operator's own goes,
    # so no pod is scraped twice
    await op.shutdown()
    await start_operator(service_monitors=False)
    await wait_for(
        lambda: (
            emulator.live("monitoring.coreos.com/v1/servicemonitors", "default", "watched") is None
        ),
        what="the operator's ServiceMonitor deleted",
    )
    assert emulator.live(DEPLOY, "default", "watched") is not None
    assert_permitted(emulator)


async def test_liveness_endpoint(emulator: Emulator, kube: KubeApi, start_operator: Any) -> None:
    op = await start_operator()
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(f"http://127.0.0.1:{op.http_port}{path}") as resp:
                assert resp.status == 200, path


async def test_namespace_scoping(emulator: Emulator, kube: KubeApi, start_operator: Any) -> None:
    await start_operator(namespaces=("default",))
    await create_isvc(kube, "inside", EXAMPLE_SPEC)
    outside = {
        "apiVersion": "serving.pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "outside"},
    }
    await kube.request(
        "POST",
        "/apis/serving.pagoda.dev/v1alpha1/namespaces/other/inferenceservices",
        body={**outside, "spec": EXAMPLE_SPEC},
    )
    await wait_for(
        lambda: all(children(emulator, "inside").values()), what="children in the served namespace"
    )
    await asyncio.sleep(0.5)
    assert emulator.live(DEPLOY, "other", "outside") is None
    assert not (emulator.live(ISVC, "other", "outside").get("status") or {})
    assert_permitted(emulator)


async def test_name_taken_by_a_foreign_object(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator(resync_interval_s=0.5)
    foreign = {"metadata": {"name": "taken"}, "spec": {"ports": [{"port": 80}]}}
    await kube.request("POST", "/api/v1/namespaces/default/services", body=foreign)
    await create_isvc(kube, "taken", EXAMPLE_SPEC)
    await wait_for(
        lambda: condition(emulator, "taken", "Degraded").get("reason") == "ResourceConflict",
        what="conflict",
    )
    assert (
        "Service 'taken' exists and is not controlled by this InferenceService"
        in condition(emulator, "taken", "Degraded")["message"]
    )
    assert emulator.live(SVC, "default", "taken")["spec"]["ports"] == [
        {"port": 80}
    ]  # not overwritten
    await kube.delete("Service", "default", "taken")
    await wait_for(
        lambda: condition(emulator, "taken", "Degraded").get("status") == "False", what="healed"
    )
    assert (
        emulator.live(SVC, "default", "taken")["metadata"]["ownerReferences"][0]["name"] == "taken"
    )


async def test_switching_off_a_remote_model_and_tolerations_removes_them(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """hf:// → built-in: the model-download init container (and its cache volume) go, and so do
    tolerations taken out of the spec; the Deployment's pod template is the new spec's."""
    await start_operator()
    tolerations = [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    ]
    await create_isvc(kube, "sw", {"model": "hf://org/model", "tolerations": tolerations})
    deploy = await wait_for(lambda: emulator.live(DEPLOY, "default", "sw"), what="deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["initContainers"] and pod["tolerations"] == tolerations

    await patch_isvc(kube, "sw", {"spec": {"model": "smollm2-135m", "tolerations": None}})

    def switched() -> dict[str, Any] | None:
        pod = emulator.live(DEPLOY, "default", "sw")["spec"]["template"]["spec"]
        return pod if "initContainers" not in pod and "tolerations" not in pod else None

    pod = await wait_for(switched, what="the init container and tolerations gone")
    mounts = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    assert mounts <= {v["name"] for v in pod["volumes"]}
    assert_permitted(emulator)


async def test_a_label_removed_from_the_service_leaves_its_children(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """The service's labels go onto its children (kopf.adopt); one taken off the service comes off
    them too, a changed one changes, while a label someone else put on a child stays (only what
    the operator applied, recorded on the child, is the operator's to take back)."""
    await start_operator()
    body = {
        "apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "lab", "labels": {"team": "a", "cost-center": "42"}},
        "spec": EXAMPLE_SPEC,
    }  # fmt: skip
    await kube.request("POST", ISVC_PATH, body=body)
    await wait_for(lambda: all(children(emulator, "lab").values()), what="children")
    for kind, child in children(emulator, "lab").items():
        assert child["metadata"]["labels"]["team"] == "a", kind
    await kube.patch("Service", "default", "lab", {"metadata": {"labels": {"mesh": "on"}}})

    await patch_isvc(kube, "lab", {"metadata": {"labels": {"team": None, "cost-center": "43"}}})

    def relabelled() -> dict[str, Any] | None:
        now = {k: c["metadata"]["labels"] for k, c in children(emulator, "lab").items()}
        return now if all("team" not in v for v in now.values()) else None

    labels = await wait_for(relabelled, what="the removed label gone from the children")
    assert all(v["cost-center"] == "43" for v in labels.values()), labels
    assert labels["Service"]["mesh"] == "on"  # not the operator's: left alone
    assert_permitted(emulator)
