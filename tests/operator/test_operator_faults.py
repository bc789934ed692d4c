"""Regression tests of the operator's behaviour under API-server faults (issue 14, defects 1-6).

The real kopf operator runs against the emulator behind `FaultyEmulator`, which fails chosen
requests of the operator (never the test's own).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import aiohttp
import pytest
from faulty_emulator import FaultyEmulator
from operator_harness import DEPLOY, ISVC, wait_for
from operator_helpers import (
    CM,
    EXAMPLE_SPEC,
    children,
    condition,
    create_isvc,
    mark_available,
    operator_requests,
    patch_isvc,
    sample,
)
from pagoda.operator.kube import client as k8s
from pagoda.operator.kube.client import ApiError, KubeApi


async def get(port: int | None, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


def ready(emulator: FaultyEmulator, name: str) -> bool:
    body = emulator.live(ISVC, "default", name) or {}
    generation = body.get("metadata", {}).get("generation")
    cond = condition(emulator, name, "Ready")
    return cond.get("status") == "True" and cond.get("observedGeneration") == generation


async def test_error_responses_keep_their_status(emulator: FaultyEmulator, kube: KubeApi) -> None:
    """Defect 3: a plain-text 413 and an HTML 502 (a proxy's answers) keep their status."""
    api = KubeApi(user_agent=k8s.USER_AGENT, request_timeout_s=5)  # an operator agent: faulted
    try:
        emulator.fail_next("GET", "configmaps", 413, text="Request Entity Too Large")
        emulator.fail_next("GET", "configmaps", 502, text="<html><h1>502 Bad Gateway</h1></html>")
        emulator.fail_next("GET", "configmaps", 429)
        errors = []
        for _ in range(3):
            with pytest.raises(ApiError) as e:
                await api.get("ConfigMap", "default", "x")
            errors.append(e.value)
        assert [e.status for e in errors] == [413, 502, 429]
        assert "Request Entity Too Large" in errors[0].message and "502 Bad Gateway" in str(
            errors[1]
        )
        assert [e.transient for e in errors] == [False, True, True]
        assert api.unreachable_for() == 0.0  # the last answer (429) came from a live server
    finally:
        await api.close()


async def test_failed_restore_of_a_deleted_child_is_retried(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """Defect 1: one 500 on the Deployment POST that restores a deleted Deployment."""
    await start_operator()
    await create_isvc(kube, "heal", EXAMPLE_SPEC)
    await wait_for(lambda: all(children(emulator, "heal").values()), what="children")
    fault = emulator.fail_next("POST", "deployments", 500)
    t0 = time.monotonic()
    await kube.delete("Deployment", "default", "heal")
    await wait_for(lambda: emulator.live(DEPLOY, "default", "heal"), timeout=10, what="restored")
    assert fault.times == 0 and time.monotonic() - t0 < 10  # not the 300 s resync


async def test_failed_status_write_on_a_child_event_is_retried(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """Defect 1: one 500 on the status PATCH after the Deployment became available."""
    op = await start_operator()
    await create_isvc(kube, "status", EXAMPLE_SPEC)
    await wait_for(lambda: condition(emulator, "status", "Ready"), what="status")
    fault = emulator.fail_next("PATCH", "inferenceservices", 500, subresource="status")
    await mark_available(kube, "status")
    await wait_for(lambda: ready(emulator, "status"), timeout=10, what="Ready after a retry")
    assert fault.times == 0
    _, text = await get(op.http_port, "/metrics")
    assert sample(text, "pagoda_operator_api_errors_total", status="500", verb="PATCH") == 1
    errors = sample(
        text, "pagoda_operator_reconcile_errors_total", trigger="child_event", kind="transient"
    )
    assert errors == 1  # the failed child-event reconcile was counted as transient ...
    # ... and followed up: by the retry (counted), unless another event's reconcile got there
    # first (then the retry stands down, see reconcile/retry.py): Ready was reached either way, above.
    retries = sample(text, "pagoda_operator_reconcile_retries_total", trigger="child_event")
    assert retries in (None, 1.0)


async def test_409_on_kopfs_progress_annotation_does_not_stall_the_create(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """Defect 2: a failed child create, then a 409 on kopf's own progress-annotation PATCH."""
    await start_operator()
    created = emulator.fail_next("POST", "configmaps", 500)
    annotated = emulator.fail_next("PATCH", "inferenceservices", 409)
    await create_isvc(kube, "stall", EXAMPLE_SPEC)
    await wait_for(
        lambda: all(children(emulator, "stall").values()) and condition(emulator, "stall", "Ready"),
        timeout=12,
        what="children and status despite the 409",
    )
    assert created.times == 0 and annotated.times == 0


def kopf_progress(emulator: FaultyEmulator, name: str) -> dict[str, dict[str, Any]]:
    """kopf's progress records of the reconcile handler, by annotation key."""
    annotations = (emulator.live(ISVC, "default", name) or {}).get("metadata", {}).get(
        "annotations"
    ) or {}
    return {k: json.loads(v) for k, v in annotations.items() if k.endswith("/reconcile_isvc")}


async def test_a_retry_left_pending_by_a_stopped_operator_is_not_stalled_by_a_409(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """The chaos test's stall: the first process's handler failed and kopf stored its retry as
    delayed; the next process's kopf sleeps out the delay, then its "touch" PATCH (which wakes it)
    gets a 409, and kopf waits for an event that never comes. The operator's first sweep after
    start-up reconciles what it has not reconciled yet."""
    first = await start_operator()
    failing = emulator.fail_next("POST", "configmaps", 500, times=10_000)
    await create_isvc(kube, "resumed", EXAMPLE_SPEC)
    await wait_for(
        lambda: any(r.get("delayed") for r in kopf_progress(emulator, "resumed").values()),
        what="kopf's pending retry",
    )
    await first.shutdown()
    failing.times = 0
    assert not any(children(emulator, "resumed").values())
    later = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)).isoformat()
    pending = {
        k: json.dumps({**r, "delayed": later})
        for k, r in kopf_progress(emulator, "resumed").items()
    }
    await patch_isvc(kube, "resumed", {"metadata": {"annotations": pending}})  # a 4 s backoff
    touch = emulator.fail_next(
        "PATCH", "inferenceservices", 409, when=lambda data: "touch-dummy" in json.dumps(data)
    )
    t0 = time.monotonic()
    await start_operator()
    await wait_for(
        lambda: all(children(emulator, "resumed").values()), timeout=30, what="the children"
    )
    assert touch.times == 0, "kopf's touch PATCH was never tried: the stall was not exercised"
    assert time.monotonic() - t0 < 30  # not the 300 s resync


async def test_a_refused_child_becomes_a_condition_without_a_retry_storm(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """Defect 3: an HTML 413 on every ConfigMap POST → Degraded ChildRejected, no retry loop."""
    await start_operator()
    emulator.fail_next("POST", "configmaps", 413, times=100, text="<html>413 Too Large</html>")
    await create_isvc(kube, "big", EXAMPLE_SPEC)
    await wait_for(
        lambda: condition(emulator, "big", "Degraded").get("reason") == "ChildRejected",
        timeout=10,
        what="ChildRejected",
    )
    assert "HTTP 413" in condition(emulator, "big", "Degraded")["message"]
    start = len(emulator._requests)
    await asyncio.sleep(2.0)
    posts = [r for r in operator_requests(emulator, start) if r.url.path.endswith("/configmaps")]
    assert len(posts) <= 1, f"{len(posts)} ConfigMap POSTs in 2 s after a permanent refusal"
    assert emulator.live(CM, "default", "big-config") is None


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"model": "m" * 1_000_000}, "spec.model must be at most 1024 characters"),
        ({"model": 42}, "spec.model must be a string, got 42"),
        ({**EXAMPLE_SPEC, "autoscaling": "yes"}, "spec.autoscaling must be an object"),
        ({**EXAMPLE_SPEC, "image": "i" * 600}, "spec.image must be at most 512 characters"),
        ({**EXAMPLE_SPEC, "servedModelName": "-bad"}, "spec.servedModelName must match"),
    ],
    ids=["huge-model", "model-int", "autoscaling-str", "long-image", "served-pattern"],
)
async def test_invalid_fields_get_a_clear_short_reason(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any, spec: dict, words: str
) -> None:
    """Defects 4 and 5: the CRD's limits hold without the schema; echoed values are cut."""
    await start_operator()
    await create_isvc(kube, "bad", spec)
    await wait_for(
        lambda: condition(emulator, "bad", "Degraded").get("status") == "True",
        timeout=10,
        what="Degraded",
    )
    cond = condition(emulator, "bad", "Degraded")
    assert cond["reason"] == "InvalidSpec" and words in cond["message"], cond
    assert len(cond["message"]) < 1000
    assert not any(children(emulator, "bad").values())


async def test_readyz_reports_an_unreachable_api_server(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """Defect 6: /readyz turns 503 once every call failed for api_unready_after_s, then recovers;
    /healthz stays 200 (a restart cannot fix an outage); /metrics counts the errors."""
    op = await start_operator(api_unready_after_s=1.0, autoscale_interval_s=0.3)
    assert (await get(op.http_port, "/readyz"))[0] == 200
    emulator.chaos(rate=1.0, statuses=(503,))
    await wait_for(lambda: _status_is(op.http_port, "/readyz", 503), timeout=8, what="/readyz 503")
    _, text = await get(op.http_port, "/readyz")
    assert "api-unreachable" in text and (await get(op.http_port, "/healthz"))[0] == 200
    emulator.chaos(rate=0.0)
    await wait_for(lambda: _status_is(op.http_port, "/readyz", 200), timeout=8, what="/readyz 200")
    _, metrics = await get(op.http_port, "/metrics")
    assert sample(metrics, "pagoda_operator_api_errors_total", status="503") >= 1


async def _status_is(port: int | None, path: str, want: int) -> bool:
    return (await get(port, path))[0] == want


# --- errors that reach the user (issue 42, items 8 and 9) ------------------------------------


def events(emulator: FaultyEmulator, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in emulator.live_all("v1/events")
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]  # fmt: skip


async def test_a_refused_status_write_is_an_event_and_retried_with_backoff(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """One 422 on the status PATCH: a Warning Event with the code, and the status written by a
    retry within seconds (before: "failed permanently", no Event, status null until the resync)."""
    op = await start_operator()
    fault = emulator.fail_next("PATCH", "inferenceservices", 422, subresource="status")
    t0 = time.monotonic()
    await create_isvc(kube, "st", EXAMPLE_SPEC)
    (event,) = await wait_for(
        lambda: events(emulator, "st", "StatusWriteFailed"), timeout=30, what="an Event"
    )
    assert event["type"] == "Warning" and "HTTP 422 Invalid" in event["message"]
    await wait_for(
        lambda: condition(emulator, "st", "Ready") and ready_or_progressing(emulator, "st"),
        timeout=30,
        what="the status, written by a retry",
    )
    assert fault.times == 0 and time.monotonic() - t0 < 30
    _, text = await get(op.http_port, "/metrics")
    assert sample(text, "pagoda_operator_reconcile_errors_total", kind="status") == 1


def ready_or_progressing(emulator: FaultyEmulator, name: str) -> bool:
    return condition(emulator, name, "Degraded").get("reason") == "AsExpected"


async def test_a_status_refused_for_its_content_is_a_condition_and_turns_readyz(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """A 422 on every full status write (as from a CRD older than the operator): `Degraded`
    says why (the conditions alone are accepted), one Event, /readyz 503 naming the object;
    when the writes are accepted again the status is written and /readyz is 200."""
    op = await start_operator(api_unready_after_s=1.0)

    def full(body: Any) -> bool:
        return isinstance(body, dict) and "replicas" in (body.get("status") or {})

    fault = emulator.fail_next(
        "PATCH", "inferenceservices", 422, times=10**6, subresource="status", when=full
    )
    await create_isvc(kube, "old", EXAMPLE_SPEC)
    cond = await wait_for(
        lambda: (
            condition(emulator, "old", "Degraded").get("reason") == "StatusRejected"
            and condition(emulator, "old", "Degraded")
        ),
        timeout=30,
        what="Degraded StatusRejected",
    )
    assert cond["status"] == "True" and "HTTP 422 Invalid" in cond["message"]
    await wait_for(lambda: _status_is(op.http_port, "/readyz", 503), timeout=10, what="503")
    _, text = await get(op.http_port, "/readyz")
    body = json.loads(text)
    assert body["status"] == "status-unwritable" and body["inferenceService"] == "default/old"
    assert "422" in body["error"] and (await get(op.http_port, "/healthz"))[0] == 200
    await asyncio.sleep(2.5)  # retries meanwhile (1 s, 2 s): one Event per refusal, not per retry
    assert len(events(emulator, "old", "StatusWriteFailed")) == 1
    assert emulator.injected[422] >= 3

    fault.times = 0  # the CRD is fixed
    await wait_for(
        lambda: ready_or_progressing(emulator, "old"), timeout=30, what="the full status"
    )
    await wait_for(lambda: _status_is(op.http_port, "/readyz", 200), timeout=10, what="200")


async def test_a_refused_tuning_job_names_its_cause_for_each_attempt(
    emulator: FaultyEmulator, kube: KubeApi, start_operator: Any
) -> None:
    """A 403 on creating the tuning Job: status.autotune.message and the Event carry the code and
    reason, for each attempt (before: "; attempt 2 in 3 s", stale, without the cause)."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-H200"}
    await kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": "n", "labels": labels}})
    await kube.request(
        "PATCH", "/api/v1/nodes/n/status", body={"status": {"allocatable": {"nvidia.com/gpu": "8"}}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    await start_operator(autotune_interval_s=0.2, autotune_retry_base_s=1.0)
    fault = emulator.fail_next("POST", "jobs", 403, times=2)
    spec = {"model": "smollm2-135m", "resources": {"gpus": 1}, "autotune": {"enabled": True}}
    await create_isvc(kube, "tn", spec)

    def message(attempt: int) -> str | None:
        text = tuning(emulator, "tn").get("message") or ""
        return text if f"; attempt {attempt} at " in text else None

    first = await wait_for(lambda: message(2), timeout=30, what="the first refusal")
    assert tuning(emulator, "tn")["state"] == "TuningFailed"
    assert tuning(emulator, "tn")["reason"] == "JobNotCreated"
    assert "HTTP 403 Forbidden, creating Job default/pagoda-tune-" in first
    await wait_for(
        lambda: [e["message"] for e in events(emulator, "tn", "TuningFailed")] == [first]
    )
    second = await wait_for(lambda: message(3), timeout=30, what="the second attempt's refusal")
    assert "HTTP 403 Forbidden" in second
    await wait_for(
        lambda: [e["message"] for e in events(emulator, "tn", "TuningFailed")] == [first, second],
        what="an Event per attempt",
    )
    await wait_for(lambda: tuning(emulator, "tn").get("state") == "Tuning", timeout=30)
    assert fault.times == 0 and emulator.live("batch/v1/jobs", "default", first.split(
        "creating Job default/")[1].split(":")[0])  # fmt: skip


def tuning(emulator: FaultyEmulator, name: str) -> dict[str, Any]:
    body = emulator.live(ISVC, "default", name) or {}
    return (body.get("status") or {}).get("autotune") or {}
