"""The autoscaler loop in the real operator (main.serve) against the emulator, with a scripted
Prometheus (fake_prometheus.py): scale up and down through the Deployment, status.autoscaling,
Events and operator metrics, holds on missing data, per-CR Prometheus URL, switching off, and
the per-service PrometheusRule. The real Prometheus/Alertmanager run in test_autoscale_e2e.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from autoscale_helpers import autoscaling, deployment_controller, events, replicas
from fake_prometheus import FakePrometheus
from kube_emulator import Emulator
from operator_harness import wait_for
from operator_helpers import (
    ISVC,
    assert_permitted,
    condition,
    create_isvc,
    patch_isvc,
    sample,
    writes_during,
)
from pagoda.operator.kube.client import KubeApi

pytestmark = pytest.mark.e2e
RULES = "monitoring.coreos.com/v1/prometheusrules"
FAST = {"autoscale_interval_s": 0.2, "alert_cooldown_s": 0.0}


def spec(**autoscaling: Any) -> dict[str, Any]:
    auto = {"minReplicas": 1, "maxReplicas": 4, "targetTTFTSeconds": 0.5}
    return {"model": "smollm2-135m", "autoscaling": {**auto, **autoscaling}}


@pytest.fixture
async def prom() -> AsyncIterator[FakePrometheus]:
    p = FakePrometheus()
    await p.start()
    yield p
    await p.stop()


async def _quiet(emulator: Emulator) -> bool:
    return await writes_during(emulator, 1.0) == []


async def metrics_text(port: int | None) -> str:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/metrics") as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await r.text()


async def test_scales_up_on_ttft_then_down_after_the_window(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus
) -> None:
    op = await start_operator(prometheus_url=prom.url, **FAST)
    await create_isvc(kube, "chat", spec(scaleDownStabilizationSeconds=2))
    async with deployment_controller(kube, "chat"):
        await wait_for(lambda: replicas(emulator, "chat") == 1, what="Deployment at minReplicas")
        await wait_for(lambda: autoscaling(emulator, "chat").get("reason") == "BelowTarget")
        assert condition(emulator, "chat", "MetricsUnavailable")["status"] == "False"
        assert 'namespace="default",inferenceservice="chat"' in prom.queries[0]

        prom.ttft = 3.0  # 6x the target: x2 per step up to maxReplicas
        seen = []
        t0 = time.monotonic()
        while replicas(emulator, "chat") != 4:
            seen.append(replicas(emulator, "chat"))
            assert time.monotonic() - t0 < 10, seen
            await asyncio.sleep(0.02)
        assert set(seen) <= {1, 2}  # 1 -> 2 -> 4, never a jump past the rate limit
        status = await wait_for(
            lambda: (
                autoscaling(emulator, "chat").get("desiredReplicas") == 4
                and autoscaling(emulator, "chat")
            )
        )
        assert status["lastScaleSource"] == "metrics"
        assert status["lastScaleReason"].startswith("TTFTAboveTarget")
        assert status["metrics"]["ttftP95Seconds"] == 3.0
        ups = events(emulator, "chat", "ScaledUp")
        assert [e["type"] for e in ups] == ["Normal", "Normal"]
        assert "from 2 to 4" in ups[-1]["message"]

        prom.ttft = None  # idle: no first tokens, nothing waiting
        await wait_for(lambda: replicas(emulator, "chat") == 1, timeout=10, what="scaled down")
        last_high = max(t for t, v in prom.ttft_answers if v is not None)
        assert time.monotonic() - last_high >= 2.0  # the window counts from the last high reading
        await wait_for(lambda: events(emulator, "chat", "ScaledDown"))  # posted after the patch
        await asyncio.sleep(0.6)
        assert replicas(emulator, "chat") == 1  # the reconciler does not fight the autoscaler
        # idle: the TTFT it no longer has leaves the status (a merge patch nulls it), and a
        # service at rest is not written again, its saved state (status.autoscaling.state) too
        assert "ttftP95Seconds" not in autoscaling(emulator, "chat")["metrics"]
        assert autoscaling(emulator, "chat")["state"]["recommending"][0] == 1
        # (the stabilization window's readings age out first: a loaded machine may still be
        # writing those; then nothing, however long)
        await wait_for(lambda: _quiet(emulator), timeout=10, what="no writes for 1 s at rest")

    text = await metrics_text(op.http_port)
    scaled = sample(
        text, "pagoda_operator_scale_events_total",
        namespace="default", inferenceservice="chat", direction="up", source="metrics",
    )  # fmt: skip
    assert scaled == 2
    desired = sample(
        text, "pagoda_operator_desired_replicas", namespace="default", inferenceservice="chat"
    )
    assert desired == 1
    assert sample(text, "pagoda_operator_reconcile_duration_seconds_count", trigger="handler")
    assert sample(text, "pagoda_operator_autoscale_evaluation_duration_seconds_count")
    assert_permitted(emulator)


async def test_missing_metrics_hold_and_set_the_condition(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus
) -> None:
    await start_operator(prometheus_url=prom.url, **FAST)
    await create_isvc(kube, "chat", spec(minReplicas=1, scaleDownStabilizationSeconds=0))
    async with deployment_controller(kube, "chat"):
        prom.ttft = 2.0
        await wait_for(lambda: replicas(emulator, "chat") == 4, what="scaled up")
        prom.ttft, prom.status = None, 503  # idle, but Prometheus fails: hold, never scale down
        cond = await wait_for(
            lambda: (
                condition(emulator, "chat", "MetricsUnavailable").get("status") == "True"
                and condition(emulator, "chat", "MetricsUnavailable")
            ),
            what="MetricsUnavailable",
        )
        assert cond["reason"] == "QueryFailed"
        assert "HTTP 503" in cond["message"]
        assert cond["message"].endswith(" (timeout)")  # why: the errorType, not the body
        assert "query timed out" not in cond["message"]
        assert events(emulator, "chat", "MetricsUnavailable")[0]["type"] == "Warning"
        await prom.stop()  # now unreachable
        await wait_for(
            lambda: (
                condition(emulator, "chat", "MetricsUnavailable").get("reason")
                == "PrometheusUnreachable"
            )
        )
        prom.status = 200
        await prom.start()
        prom.waiting = None  # reachable, but no series for this service
        await wait_for(
            lambda: condition(emulator, "chat", "MetricsUnavailable").get("reason") == "NoSamples"
        )
        prom.waiting, prom.age_s = 0.0, 300.0  # series, but stale
        await wait_for(
            lambda: (
                condition(emulator, "chat", "MetricsUnavailable").get("reason") == "StaleMetrics"
            )
        )
        assert replicas(emulator, "chat") == 4  # held throughout
        assert autoscaling(emulator, "chat")["reason"] == "MetricsUnavailable"
        prom.age_s = 0.0  # fresh and idle again: down with a 0 s window
        await wait_for(lambda: replicas(emulator, "chat") == 1, what="scaled down after recovery")
        await wait_for(
            lambda: condition(emulator, "chat", "MetricsUnavailable")["status"] == "False"
        )  # written after the Deployment


@pytest.mark.parametrize(
    "bad",
    [
        {"kv_cache": float("inf")},  # the scale-down's KV-cache floor once crashed the loop
        {"ttft": -1.0},  # once a ValueError that ended the loop
        {"ttft": float("inf")},  # once written to status as `Infinity` (not JSON)
        {"waiting": float("inf")},  # once read as overload
    ],
)
async def test_a_non_finite_reading_holds_and_the_loop_lives_on(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus, bad: dict
) -> None:
    """A broken exporter or recording rule (±Inf, a negative TTFT) is no load: the replicas
    hold, MetricsUnavailable=InvalidSample says why, and the loop goes on for every service."""
    await start_operator(prometheus_url=prom.url, **FAST)
    await create_isvc(kube, "chat", spec(scaleDownStabilizationSeconds=0))
    async with deployment_controller(kube, "chat"):
        prom.ttft = 1.5
        await wait_for(lambda: replicas(emulator, "chat") == 4, what="scaled up")
        prom.ttft = 0.1  # idle enough to scale down, but one input is broken
        for k, v in bad.items():
            setattr(prom, k, v)
        cond = await wait_for(
            lambda: (
                condition(emulator, "chat", "MetricsUnavailable").get("status") == "True"
                and condition(emulator, "chat", "MetricsUnavailable")
            ),
            what="MetricsUnavailable",
        )
        assert cond["reason"] == "InvalidSample" and "answered" in cond["message"]
        assert replicas(emulator, "chat") == 4  # held: neither down nor up on a broken number
        assert events(emulator, "chat", "MetricsUnavailable")
        prom.ttft, prom.kv_cache, prom.waiting = 0.1, 0.2, 0.0
        await wait_for(lambda: replicas(emulator, "chat") == 1, what="the loop still runs")


async def test_bounds_edited_while_a_slow_read_is_in_flight_apply_to_its_decision(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus
) -> None:
    """The metrics are read outside the lock and may take seconds; a decision taken after the
    read uses the spec of then, not of the read's start: maxReplicas lowered to 1 meanwhile is
    never exceeded (it once scaled to 2 and back)."""
    await start_operator(prometheus_url=prom.url, **FAST)
    await create_isvc(kube, "chat", spec(maxReplicas=8))
    async with deployment_controller(kube, "chat"):
        await wait_for(lambda: autoscaling(emulator, "chat").get("reason"), what="evaluated")
        prom.delay, prom.ttft = 1.5, 4.0  # 8x the target, slowly
        asked = len(prom.queries)
        await wait_for(lambda: len(prom.queries) > asked, what="a read in flight")
        await patch_isvc(kube, "chat", {"spec": {"autoscaling": {"maxReplicas": 1}}})
        seen = set()
        for _ in range(60):  # two slow reads
            seen.add(replicas(emulator, "chat"))
            await asyncio.sleep(0.05)
        assert seen == {1}
        await wait_for(lambda: autoscaling(emulator, "chat").get("reason") == "AtMaxReplicas")


async def test_no_first_token_in_the_window_is_idle_only_if_nothing_runs(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus
) -> None:
    """An empty TTFT answer while requests run (long decodes, or a Prometheus restarted without
    the rate's history) is no evidence of idleness: the replicas stay (they once dropped to
    minReplicas); with nothing running either, the service is idle and scales down."""
    await start_operator(prometheus_url=prom.url, **FAST)
    await create_isvc(kube, "chat", spec(scaleDownStabilizationSeconds=0))
    async with deployment_controller(kube, "chat"):
        prom.ttft = 1.5
        await wait_for(lambda: replicas(emulator, "chat") == 4, what="scaled up")
        prom.ttft, prom.waiting, prom.running = None, 0.0, 12.0  # empty vector, busy replicas
        await wait_for(lambda: autoscaling(emulator, "chat").get("reason") == "WithinTolerance")
        await asyncio.sleep(1.0)  # five evaluations
        assert replicas(emulator, "chat") == 4
        assert autoscaling(emulator, "chat")["reason"] == "WithinTolerance"
        prom.running = 0.0  # now idle
        await wait_for(lambda: replicas(emulator, "chat") == 1, what="idle: scaled down")


class SkewedPrometheus(FakePrometheus):
    """A Prometheus whose clock is `skew` s ahead of the operator's (the operator's stepped back,
    or the two disagree): it evaluates at the `time` it is given, else at its own now. Its TTFT
    was 3 s until 300 s ago (a burst long served), 0.1 s since; it scrapes every 5 s."""

    skew = 0.0

    async def _query(self, request: web.Request) -> web.Response:
        q = request.query["query"]
        self.queries.append(q)
        now = time.time() + self.skew
        at = float(request.query.get("time", now))
        newest = min(at, now) // 5 * 5
        if "histogram_quantile" in q:
            value = 3.0 if at < now - 300 else 0.1
        elif q.startswith("time() - "):
            value = at - newest
        elif "timestamp(" in q:
            value = newest
        elif "kv_cache" in q:
            value = 0.2
        else:
            value = 0.0
        result = [{"metric": {}, "value": [at, repr(value)]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )


@pytest.mark.parametrize("skew", [600.0, -120.0])
async def test_the_operators_clock_plays_no_part_in_the_reading(
    emulator: Emulator, kube: KubeApi, start_operator: Any, skew: float
) -> None:
    """Queries are evaluated at Prometheus' now, and the samples' age is computed there: with the
    operator's clock 10 minutes behind, a burst served long ago does not look current (it once
    scaled up on it); 2 minutes ahead, fresh samples do not look stale (it once held forever)."""
    prom = SkewedPrometheus()
    prom.skew = skew
    await prom.start()
    try:
        await start_operator(prometheus_url=prom.url, **FAST)
        await create_isvc(kube, "chat", spec())
        async with deployment_controller(kube, "chat"):
            await wait_for(lambda: autoscaling(emulator, "chat").get("metrics"), what="evaluated")
            await asyncio.sleep(1.0)  # five evaluations
            assert replicas(emulator, "chat") == 1
            assert condition(emulator, "chat", "MetricsUnavailable")["status"] == "False"
            assert autoscaling(emulator, "chat")["metrics"]["ttftP95Seconds"] == 0.1
    finally:
        await prom.stop()


async def test_per_service_prometheus_url_and_switching_autoscaling_off(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus
) -> None:
    await start_operator(
        prometheus_url="http://127.0.0.1:9",  # nothing listens there
        allowed_prometheus_urls=("http://127.0.0.1:9", prom.url),
        **FAST,
    )
    await create_isvc(kube, "chat", spec(prometheusURL=prom.url))
    await create_isvc(kube, "other", spec())
    await create_isvc(kube, "elsewhere", spec(prometheusURL="http://127.0.0.1:10250/"))
    async with deployment_controller(kube, "chat", "other", "elsewhere"):
        prom.ttft = 1.0
        await wait_for(lambda: replicas(emulator, "chat") == 2, what="scaled on its own URL")
        await wait_for(
            lambda: (
                condition(emulator, "elsewhere", "MetricsUnavailable").get("reason")
                == "PrometheusURLNotAllowed"
            )
        )
        await wait_for(
            lambda: (
                condition(emulator, "other", "MetricsUnavailable").get("reason")
                == "PrometheusUnreachable"
            )
        )
        assert replicas(emulator, "other") == 1
        # autoscaling off: spec.replicas decides, the autoscaler's status and condition go away
        await patch_isvc(kube, "chat", {"spec": {"autoscaling": None, "replicas": 3}})
        await wait_for(lambda: replicas(emulator, "chat") == 3, what="spec.replicas decides")
        await wait_for(lambda: not autoscaling(emulator, "chat"), what="status.autoscaling removed")
        await wait_for(lambda: not condition(emulator, "chat", "MetricsUnavailable"))
        await asyncio.sleep(0.6)
        assert replicas(emulator, "chat") == 3


async def test_without_any_prometheus_url_it_holds(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator(**FAST)
    await create_isvc(kube, "chat", spec(minReplicas=2))
    async with deployment_controller(kube, "chat"):
        cond = await wait_for(lambda: condition(emulator, "chat", "MetricsUnavailable"))
        assert (cond["status"], cond["reason"]) == ("True", "NoPrometheusURL")
        assert replicas(emulator, "chat") == 2


async def test_prometheus_rule_per_autoscaled_service(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    emulator.resources[RULES] = {
        "kind": "PrometheusRule", "namespaced": True, "verbs": {"get", "list", "create", "patch", "delete"},
    }  # fmt: skip
    await start_operator()
    await create_isvc(kube, "chat", spec(targetTTFTSeconds=0.25))
    rule = await wait_for(lambda: emulator.live(RULES, "default", "chat-alerts"))
    (ref,) = rule["metadata"]["ownerReferences"]
    assert ref["name"] == "chat" and ref["controller"] is True
    groups = rule["spec"]["groups"]
    assert groups[0]["rules"][0]["expr"] == "vector(0.5)"  # the threshold, 2 x targetTTFTSeconds
    exprs = {r["alert"]: r["expr"] for g in groups[1:] for r in g["rules"]}
    assert exprs["PagodaTTFTHigh"].endswith("> 0.5")
    assert all('inferenceservice="chat"' in e for e in exprs.values())
    await patch_isvc(kube, "chat", {"spec": {"autoscaling": None}})
    await wait_for(lambda: emulator.live(RULES, "default", "chat-alerts") is None, what="deleted")
    assert emulator.live(ISVC, "default", "chat") is not None
    assert_permitted(emulator)


@pytest.mark.parametrize(
    ("capacity", "model", "want"),
    [
        ({"prefill_tokens_per_s": 1400.0, "decode_tokens_per_s": 460}, None, (1400.0, 460.0)),
        ({"prefill_tokens_per_s": 1400.0}, None, (1400.0, None)),  # older: prefill floor only
        ({"prefill_tokens_per_s": 1400.0, "decode_tokens_per_s": 0}, None, (1400.0, None)),
        # a negative capacity: a profile serving refuses (tuned_profile), so it is not mounted
        ({"prefill_tokens_per_s": 1400.0, "decode_tokens_per_s": -1}, None, (None, None)),
        ({"prefill_tokens_per_s": True, "decode_tokens_per_s": 460}, None, (None, None)),
        # measured for another model: not mounted, so its numbers size nothing either
        ({"prefill_tokens_per_s": 1400.0, "decode_tokens_per_s": 460}, "other", (None, None)),
        (None, None, (None, None)),  # no profile mounted
    ],
)
async def test_the_floors_rates_come_from_the_mounted_profile(
    monkeypatch: pytest.MonkeyPatch, capacity: dict | None, model: str | None, want: tuple
) -> None:
    """V_P and V_D for the predictive floors: from the mounted tuned profile's `capacity`, each
    only when it is a positive number; a profile that is not mounted (invalid, another model)
    gives none."""
    import json

    from pagoda.operator.autotune import mount, profiles
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

    data = {"schema_version": 1, "device": "NVIDIA H200", "model": model or "smollm2-135m",
            "dtype": "bfloat16", "created": "2026-12-05T00:00:00Z", "capacity": capacity}  # fmt: skip

    class Api:
        async def get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
            assert (kind, ns, name) == ("ConfigMap", "default", "tuned-x")
            meta = {"name": name, "namespace": ns, "labels": profiles.profile_labels()}
            return {"metadata": meta, "data": {"profile.json": json.dumps(data)}}

    monkeypatch.setattr(
        mount, "chosen_profile", lambda b, s: None if capacity is None else "tuned-x"
    )
    body = {"metadata": {"namespace": "default", "name": "x"}}
    parsed = InferenceServiceSpec.from_dict({"model": "smollm2-135m"}, name="x", default_image="i")
    assert await mount.tuned_rates(Api(), body, parsed) == want
