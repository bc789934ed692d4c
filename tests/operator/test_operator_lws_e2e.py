"""Multi-node groups end to end: the real kopf operator against the emulator with the upstream
LeaderWorkerSet CRD installed (the test plays LWS's controller by writing the LWS status).

A multi-node InferenceService becomes a LeaderWorkerSet (valid against the upstream schema as
stored), its Service selects the leaders, its status follows the groups; switching to one node
and back replaces one kind by the other; the autoscaler scales groups; without the LWS CRD the
spec gets a condition that says what to install; a rank whose share of the model does not fit
its GPUs (`ModelDoesNotFit: ...` in its container's termination message) becomes the service's
condition through the pod watch. Every call stays within the chart's RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from autoscale_helpers import events
from fake_prometheus import FakePrometheus
from faulty_emulator import FaultyEmulator
from lws_crd import LWS_RESOURCE, load_lws_crd, lws_errors
from operator_harness import DEPLOY, wait_for
from operator_helpers import (
    SVC,
    assert_permitted,
    condition,
    create_isvc,
    in_background,
    patch_isvc,
)
from pagoda.operator.kube import names
from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.runtime.termination import Termination

pytestmark = pytest.mark.e2e
GROUP_SPEC = {"model": "/opt/models/llama", "parallelism": {"nodes": 2}}


@pytest.fixture
async def lws(emulator: FaultyEmulator, kube: KubeApi) -> FaultyEmulator:
    """The emulator with LeaderWorkerSet installed (before the operator starts)."""
    crd = load_lws_crd()
    emulator.declare_crd(crd)
    await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
    return emulator


def group(emulator: FaultyEmulator, name: str) -> dict[str, Any] | None:
    return emulator.live(LWS_RESOURCE, "default", names.lws_name(name))


async def mark_groups_ready(kube: KubeApi, name: str) -> None:
    """Play LWS's controller: every group of the current generation is ready."""
    obj = await kube.get("LeaderWorkerSet", "default", names.lws_name(name))
    assert obj is not None
    n = obj["spec"].get("replicas", 1)
    status = {
        "observedGeneration": obj["metadata"]["generation"],
        "replicas": n, "readyReplicas": n, "updatedReplicas": n,
        "conditions": [{"type": "Available", "status": "True", "reason": "AllGroupsReady",
                        "message": "All replicas are ready", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
    }  # fmt: skip
    await kube.patch(
        "LeaderWorkerSet", "default", names.lws_name(name), {"status": status}, subresource="status"
    )


@contextlib.asynccontextmanager
async def lws_controller(kube: KubeApi, name: str) -> AsyncIterator[None]:
    """Keep every group ready as `spec.replicas` changes."""

    async def loop() -> None:
        while True:
            with contextlib.suppress(ApiError, AssertionError):
                obj = await kube.get("LeaderWorkerSet", "default", names.lws_name(name))
                if obj and (obj.get("status") or {}).get("readyReplicas") != obj["spec"].get(
                    "replicas"
                ):
                    await mark_groups_ready(kube, name)
            await asyncio.sleep(0.05)

    async with in_background(loop()):
        yield


def selector(emulator: FaultyEmulator, name: str) -> dict[str, str]:
    return (emulator.live(SVC, "default", name) or {}).get("spec", {}).get("selector") or {}


async def test_a_group_runs_as_a_leader_worker_set_and_switches_kinds(
    lws: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    await create_isvc(kube, "grp", GROUP_SPEC)
    stored = await wait_for(lambda: group(lws, "grp"), what="the LeaderWorkerSet")
    assert lws_errors({k: v for k, v in stored.items() if k != "status"}) == []
    assert stored["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws.live(DEPLOY, "default", "grp") is None
    await wait_for(lambda: selector(lws, "grp").get(names.LABEL_ROLE) == "leader", what="leaders")
    ready = await wait_for(lambda: condition(lws, "grp", "Ready"), what="status")
    assert ready["status"] == "False" and "0/1 groups of 2 pods ready" in ready["message"]

    await mark_groups_ready(kube, "grp")  # a change of the LWS refreshes the owner's status
    await wait_for(
        lambda: condition(lws, "grp", "Ready").get("status") == "True", timeout=10, what="Ready"
    )
    status = lws.live("serving.pagoda.dev/v1alpha1/inferenceservices", "default", "grp")["status"]
    assert status["readyReplicas"] == 1 and status["selector"].endswith("role=leader")

    # The autoscaler's number (here written as it would: the reconciler leaves it alone once
    # spec.autoscaling is set) survives a switch of kind, clamped into the new bounds.
    auto = {"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 4}}
    await patch_isvc(kube, "grp", {"spec": auto})
    isvc = "serving.pagoda.dev/v1alpha1/inferenceservices"

    def reconciled() -> bool:  # no reconcile of the spec before autoscaling is still in flight
        obj = lws.live(isvc, "default", "grp") or {}
        return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]

    await wait_for(reconciled, what="the autoscaling spec reconciled")
    await kube.patch("LeaderWorkerSet", "default", names.lws_name("grp"), {"spec": {"replicas": 3}})
    await patch_isvc(kube, "grp", {"spec": {"parallelism": {"nodes": 1}}})  # one pod again
    deploy = await wait_for(
        lambda: group(lws, "grp") is None and lws.live(DEPLOY, "default", "grp"),
        timeout=10,
        what="the Deployment replacing the group",
    )
    assert deploy["spec"].get("replicas") == 3  # not the default 1: 3 replicas kept serving
    await wait_for(lambda: names.LABEL_ROLE not in selector(lws, "grp"), what="all pods again")

    await kube.patch("Deployment", "default", "grp", {"spec": {"replicas": 9}})  # > maxReplicas
    await patch_isvc(kube, "grp", {"spec": {"parallelism": {"nodes": 2}}})  # and back
    stored = await wait_for(
        lambda: lws.live(DEPLOY, "default", "grp") is None and group(lws, "grp"),
        timeout=10,
        what="the group replacing the Deployment",
    )
    assert stored["spec"].get("replicas") == 4
    assert_permitted(lws)


async def test_the_autoscaler_scales_groups(
    lws: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    prom = FakePrometheus()
    await prom.start()
    try:
        await start_operator(
            prometheus_url=prom.url, autoscale_interval_s=0.2, alert_cooldown_s=0.0
        )
        auto = {"minReplicas": 1, "maxReplicas": 4, "targetTTFTSeconds": 0.5}
        await create_isvc(kube, "big", {**GROUP_SPEC, "autoscaling": auto})
        async with lws_controller(kube, "big"):
            await wait_for(lambda: group(lws, "big"), what="the LeaderWorkerSet")
            prom.ttft = 3.0  # 6x the target: x2 per step, groups this time
            await wait_for(
                lambda: (group(lws, "big") or {}).get("spec", {}).get("replicas") == 4,
                timeout=10,
                what="4 groups",
            )
        # The Event is posted after the scale's patch, and events are listed in no promised
        # order: wait for the one that records the second step.
        await wait_for(
            lambda: any("from 2 to 4" in e["message"] for e in events(lws, "big", "ScaledUp")),
            what="the ScaledUp Event of the second step",
        )
        assert lws.live(DEPLOY, "default", "big") is None
    finally:
        await prom.stop()


async def test_without_the_lws_crd_a_group_is_a_condition(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    await create_isvc(kube, "grp", GROUP_SPEC)
    cond = await wait_for(
        lambda: (
            condition(emulator, "grp", "Degraded").get("status") == "True"
            and condition(emulator, "grp", "Degraded")
        ),
        what="Degraded",
    )
    assert cond["reason"] == "LeaderWorkerSetNotInstalled"
    assert "kubernetes-sigs/lws" in cond["message"]
    assert emulator.live(DEPLOY, "default", "grp") is None
    # The Event is a separate write from the status: it may land just after the condition.
    (event, *_) = await wait_for(
        lambda: events(emulator, "grp", "LeaderWorkerSetNotInstalled"), what="the Warning Event"
    )
    assert event["type"] == "Warning"


DOES_NOT_FIT = Termination(
    "ModelDoesNotFit",
    None,
    "weights 70.6 GiB + one 8192-token sequence of KV cache 1.3 GiB per rank exceed the 44.2 GiB "
    "free on NVIDIA L40S (bfloat16, tensor-parallel size 2); would fit: --quantization fp8 "
    "(35.3 GiB per rank), --tensor-parallel-size 4, or fewer GPUs per rank with more nodes",
).line()


async def test_a_rank_that_cannot_fit_the_model_is_a_condition(
    lws: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """ModelDoesNotFit through the generic pod-failure mechanism (reconcile/pods.py): a worker's
    `server` container exits 2 with it, the kubelet keeps it as the termination message, and the
    InferenceService shows it as Degraded/Ready=False with the numbers, and a Warning Event."""
    await start_operator()
    await create_isvc(kube, "fit", GROUP_SPEC)
    stored = await wait_for(lambda: group(lws, "fit"), what="the LeaderWorkerSet")
    worker = stored["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    labels = {**worker["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/worker-index": "1"}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "fit-lws-0-1", "namespace": "default", "labels": labels},
           "spec": worker["spec"]}  # fmt: skip
    await kube.create(pod)
    terminated = {"exitCode": 2, "reason": "Error", "message": DOES_NOT_FIT}
    status = {"phase": "Running", "containerStatuses": [
        {"name": "server", "ready": False, "restartCount": 2,
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": terminated}},
    ]}  # fmt: skip
    await kube.patch("Pod", "default", "fit-lws-0-1", {"status": status}, subresource="status")
    degraded = await wait_for(
        lambda: (c := condition(lws, "fit", "Degraded")).get("reason") == "ModelDoesNotFit" and c,
        timeout=10,
        what="Degraded=ModelDoesNotFit",
    )
    assert degraded["status"] == "True" and "70.6 GiB" in degraded["message"]
    assert (
        "--tensor-parallel-size 4" in degraded["message"]
        and "pod fit-lws-0-1" in degraded["message"]
    )
    ready = condition(lws, "fit", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ModelDoesNotFit")
    (event,) = await wait_for(lambda: events(lws, "fit", "ModelDoesNotFit"), what="the Event")
    assert event["type"] == "Warning" and "44.2 GiB" in event["message"]
    assert_permitted(lws)


async def test_a_group_with_a_draft_model_downloads_it_where_rank_0_runs(
    lws: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """Speculative decoding with a draft over a multi-node group (rank 0 drafts): the operator
    creates the group (no longer refused), stored valid against the upstream schema, its leader
    (rank 0) and its workers (whose start-up checks read the draft's config) fetching the s3://
    draft with the `draft-download` init container, and the same `--speculative-config`."""
    await start_operator()
    spec = {**GROUP_SPEC,
            "engine": {"speculative": {"method": "draftModel", "model": "s3://bucket/draft",
                                       "numSpeculativeTokens": 4}}}  # fmt: skip
    await create_isvc(kube, "spg", spec)
    stored = await wait_for(lambda: group(lws, "spg"), what="the LeaderWorkerSet")
    assert lws_errors({k: v for k, v in stored.items() if k != "status"}) == []
    t = stored["spec"]["leaderWorkerTemplate"]
    configs = set()
    for template in (t["leaderTemplate"], t["workerTemplate"]):
        (init,) = template["spec"]["initContainers"]
        assert init["name"] == "draft-download" and init["args"][-1] == "s3://bucket/draft"
        (server,) = template["spec"]["containers"]
        configs.add(server["args"][server["args"].index("--speculative-config") + 1])
    assert len(configs) == 1 and '"model": "/var/cache/pagoda/draft/model"' in configs.pop()
    await wait_for(lambda: condition(lws, "spg", "Ready"), what="status")  # reconciled
    degraded = condition(lws, "spg", "Degraded")
    assert degraded.get("status") != "True", degraded
    assert_permitted(lws)
