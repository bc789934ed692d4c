"""The autoscaler keeps each service's decision state between evaluations (loop.py's _State): the
history, the learned correction and the burst floor's samples go back into the next decide(), so
a service whose bursts recur is held at their need in the quiet between them. A fake Kubernetes
API stands in for the cluster (the loop against the emulator is test_autoscale_loop.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from typing import Any

from kube_api import merge_patch
from pagoda.operator.autoscaling import writes
from pagoda.operator.autoscaling.loop import Autoscaler
from pagoda.operator.autoscaling.policy import Metrics, Policy
from pagoda.operator.spec.config import OperatorConfig
from pagoda.operator.web.metrics import OperatorMetrics

POLICY = Policy(
    min_replicas=1, max_replicas=40, target_ttft_s=5.0, down_window_s=10,
    prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0, lead_s=0.0, target_utilization=0.95,
    young_margin=1.0,  # the recurring bursts' floor alone
)  # fmt: skip


class Api:
    """Patches land on the in-memory Deployment; everything is ready at once."""

    def __init__(self) -> None:
        self.replicas = 2

    async def patch(self, kind: str, ns: str, name: str, body: dict, **kw: Any) -> dict:
        if kind == "Deployment":
            self.replicas = body["spec"]["replicas"]
        return {}

    async def try_post_event(self, *a: Any, **kw: Any) -> None:
        return None

    def deployment(self) -> dict[str, Any]:
        meta = {"namespace": "default", "name": "chat"}
        return {"metadata": meta, "spec": {"replicas": self.replicas},
                "status": {"readyReplicas": self.replicas}}  # fmt: skip


def reading(fast: float, slow: float) -> Metrics:
    return Metrics(
        ttft_p95_s=0.1, waiting=0.0, mean_prompt_tokens=100.0, mean_output_tokens=50.0,
        arrival_rate=fast, arrival_rate_slow=slow, arrival_rate_fast=fast,
    )  # fmt: skip


def test_the_burst_samples_carry_over_between_evaluations() -> None:
    api, clock = Api(), [0.0]
    scaler = Autoscaler(api, OperatorConfig(), OperatorMetrics(), clock=lambda: clock[0])  # type: ignore[arg-type]
    fresh = {"metadata": {"namespace": "default", "name": "chat", "uid": "u1"}}
    quiet, burst = reading(1.0, 1.0), reading(40.0, 4.0)

    async def run() -> list[tuple[int, str]]:
        out = []
        for m in [quiet] * 3 + [burst] * 2 + [quiet] * 4 + [burst] * 2 + [quiet] * 6:
            clock[0] += 5.0
            d = await scaler._decide_and_apply(
                POLICY, fresh, api.deployment(), m, ("", ""), logging.getLogger("test")
            )
            out.append((d.replicas, d.reason))
        return out

    out = asyncio.run(run())
    need = math.ceil(40 * 0.2 / POLICY.target_utilization)  # 8 replicas busy in a burst
    assert out[-1] == (need, "BurstFloor"), out  # the quiet after the second burst stays up
    assert len(scaler._states["u1"].bursts.samples) == len(out)


class StatusApi(Api):
    """Api that also applies the status merge patches, as the status subresource would."""

    def __init__(self) -> None:
        super().__init__()
        self.status: dict[str, Any] = {}

    async def patch(self, kind: str, ns: str, name: str, body: dict, **kw: Any) -> dict:
        if kw.get("subresource") == "status":
            self.status = merge_patch(self.status, body["status"])
        return await super().patch(kind, ns, name, body, **kw)


def test_a_take_over_between_bursts_keeps_the_burst_floor() -> None:
    """Two bursts on one operator, then another one (its own monotonic clock) takes over from
    status.autoscaling.state in the quiet after them: it holds the burst floor as the first one
    would have; without the saved state it lets the fleet go down to the quiet's need."""
    api, wall0 = StatusApi(), 1_800_000_000.0
    clock_a, clock_b = [0.0], [50_000.0]
    first = Autoscaler(api, OperatorConfig(), OperatorMetrics(), clock=lambda: clock_a[0],
                       wall=lambda: wall0 + clock_a[0])  # type: ignore[arg-type]  # fmt: skip
    quiet, burst = reading(1.0, 1.0), reading(40.0, 4.0)

    async def run(scaler: Autoscaler, clock: list[float], loads: list[Metrics], status: bool):
        out = []
        for m in loads:
            clock[0] += 5.0
            fresh = {"metadata": {"namespace": "default", "name": "chat", "uid": "u1"}}
            if status:
                fresh["status"] = json.loads(json.dumps(api.status))  # as read from the API
            d = await scaler._decide_and_apply(
                POLICY, fresh, api.deployment(), m, ("", ""), logging.getLogger("test")
            )
            out.append((d.replicas, d.reason))
        return out

    asyncio.run(run(first, clock_a, [quiet] * 3 + [burst] * 2 + [quiet] * 4 + [burst] * 2, True))
    need = math.ceil(40 * 0.2 / POLICY.target_utilization)
    assert api.replicas == need and api.status["autoscaling"]["state"]["version"] == 1
    for saved, want in ((True, (need, "BurstFloor")), (False, (1, "BelowTarget"))):
        replicas = api.replicas
        clock_b[0] = 50_000.0 + clock_a[0]  # the same instant: B's clock reads 50,000 s more
        second = Autoscaler(api, OperatorConfig(), OperatorMetrics(), clock=lambda: clock_b[0],
                            wall=lambda: wall0 + clock_b[0] - 50_000.0)  # type: ignore[arg-type]  # fmt: skip
        out = asyncio.run(run(second, clock_b, [quiet] * 6, saved))
        assert out[-1] == want, (saved, out)
        api.replicas = replicas


def _replay(scaler: Autoscaler, api: Api, clock: list[float], status: dict | None) -> list[str]:
    """A burst, then quiet, every 5 s; the decisions' messages."""
    young = dataclasses.replace(POLICY, young_margin=4.0)
    fresh: dict[str, Any] = {"metadata": {"namespace": "default", "name": "chat", "uid": "u1"}}
    if status is not None:
        fresh["status"] = status

    async def run() -> list[str]:
        out = []
        for m in [reading(40.0, 4.0)] * 2 + [reading(0.0, 1.0)] * 4:
            clock[0] += 5.0
            d = await scaler._decide_and_apply(
                young, fresh, api.deployment(), m, ("", ""), logging.getLogger("test")
            )
            out.append(d.message)
        return out

    return asyncio.run(run())


def test_an_operator_restart_keeps_a_services_age() -> None:
    """The first traffic goes into status.autoscaling.trafficSince; a restarted operator (a new
    Autoscaler, another monotonic clock) reads it back, so a service older than the burst window
    gets no young-service margin again, while one without the field does."""
    api, clock, wall0 = StatusApi(), [100.0], 1_800_000_000.0
    first = Autoscaler(
        api, OperatorConfig(), OperatorMetrics(), clock=lambda: clock[0],
        wall=lambda: wall0 + clock[0],
    )  # type: ignore[arg-type]  # fmt: skip
    assert any("young service" in m for m in _replay(first, api, clock, None))
    since = api.status["autoscaling"]["trafficSince"]
    assert since == writes.wall_iso(wall0 + 105.0)  # the first evaluation with traffic

    restarted_at = 2 * POLICY.burst_window_s  # two windows later, on a fresh monotonic clock
    for status, young in ((dict(api.status), False), (None, True)):
        clock2 = [5.0]
        api2 = StatusApi()
        api2.status = json.loads(json.dumps(status or {}))  # the object the restart reads
        scaler = Autoscaler(
            api2, OperatorConfig(), OperatorMetrics(), clock=lambda c=clock2: c[0],
            wall=lambda c=clock2: wall0 + restarted_at + c[0],
        )  # type: ignore[arg-type]  # fmt: skip
        msgs = _replay(scaler, api2, clock2, status)
        assert any("young service" in m for m in msgs) is young, msgs
        assert api2.status["autoscaling"]["trafficSince"] == (since if status else
            writes.wall_iso(wall0 + restarted_at + 10.0))  # fmt: skip


def test_traffic_since_reads_the_status_on_the_loops_clock() -> None:
    wall = 1_800_000_000.0
    auto = {"trafficSince": writes.wall_iso(wall - 60.0)}
    assert writes.traffic_since(auto, now=500.0, wall=wall) == 440.0
    assert writes.traffic_since({"trafficSince": writes.wall_iso(wall + 30)}, 500.0, wall) == 500.0
    for bad in (None, {}, {"trafficSince": "yesterday"}, {"trafficSince": 12}):
        assert writes.traffic_since(bad, 500.0, wall) is None


class ListApi:
    """Lists the given InferenceServices; nothing else is called (evaluate is replaced)."""

    def __init__(self, *names: str) -> None:
        self.bodies = [
            {"metadata": {"namespace": "default", "name": n, "uid": f"uid-{n}"}} for n in names
        ]

    async def list_all(self, kind: str, namespaces: Any) -> list[dict[str, Any]]:
        return list(self.bodies)


def test_an_unforeseen_error_ends_neither_the_pass_nor_the_loop() -> None:
    """A bug or an answer nobody foresaw in one service's evaluation leaves the other services
    evaluated, and a failed pass is followed by the next: the loop task never dies (it once did,
    and with it autoscaling for every service until a restart)."""
    config = OperatorConfig(autoscale_interval_s=0.01)
    scaler = Autoscaler(ListApi("bad", "good"), config, OperatorMetrics())  # type: ignore[arg-type]
    seen: list[str] = []

    async def evaluate(body: dict[str, Any], logger: Any = None, now: Any = None) -> None:
        seen.append(body["metadata"]["name"])
        if body["metadata"]["name"] == "bad":
            raise OverflowError("cannot convert float infinity to integer")

    scaler.evaluate = evaluate  # type: ignore[method-assign]

    async def run() -> None:
        await scaler.evaluate_all()  # does not raise
        assert sorted(seen) == ["bad", "good"]
        passes = [0]
        real = scaler.evaluate_all

        async def failing_pass(logger: Any = None, now: Any = None) -> None:
            passes[0] += 1
            if passes[0] == 1:
                raise RuntimeError("boom")
            await real()

        scaler.evaluate_all = failing_pass  # type: ignore[method-assign]
        task = asyncio.create_task(scaler.run())
        for _ in range(200):
            await asyncio.sleep(0.01)
            if passes[0] >= 3:
                break
        assert not task.done() and passes[0] >= 3
        task.cancel()

    asyncio.run(run())


def test_a_deleted_services_gauge_goes_with_it() -> None:
    """pagoda_operator_desired_replicas of a deleted InferenceService is no longer exported (a
    re-created one of the same name keeps its gauge)."""
    api, metrics = ListApi("a", "b"), OperatorMetrics()
    scaler = Autoscaler(api, OperatorConfig(), metrics)  # type: ignore[arg-type]

    async def evaluate(body: dict[str, Any], logger: Any = None, now: Any = None) -> None:
        meta = body["metadata"]
        scaler._state(body, 0.0, 1, POLICY)
        metrics.desired_replicas.labels(meta["namespace"], meta["name"]).set(1)

    scaler.evaluate = evaluate  # type: ignore[method-assign]

    async def run() -> str:
        await scaler.evaluate_all()
        api.bodies = [api.bodies[1]]  # a deleted
        api.bodies.append({"metadata": {"namespace": "default", "name": "b", "uid": "uid-b2"}})
        api.bodies.pop(0)  # b re-created under a new uid
        await scaler.evaluate_all()
        return metrics.render().decode()

    text = asyncio.run(run())
    assert 'inferenceservice="a"' not in text
    assert 'pagoda_operator_desired_replicas{inferenceservice="b",namespace="default"} 1.0' in text


class EditedMeanwhileApi:
    """maxReplicas is lowered to 1 between the webhook's first read of the InferenceService and
    the step (which waits for the object's lock: a reconcile may hold it for a while)."""

    def __init__(self) -> None:
        self.reads = 0
        self.replicas = 1
        self.patches: list[tuple[str, dict]] = []

    def isvc(self, max_replicas: int) -> dict[str, Any]:
        meta = {"namespace": "default", "name": "chat", "uid": "u1", "generation": 1}
        auto = {"minReplicas": 1, "maxReplicas": max_replicas, "targetTTFTSeconds": 0.5}
        return {"metadata": meta, "spec": {"model": "smollm2-135m", "autoscaling": auto}}

    async def get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        if kind == "InferenceService":
            self.reads += 1
            return self.isvc(4 if self.reads == 1 else 1)
        owner = {"uid": "u1", "controller": True}
        meta = {"namespace": ns, "name": name, "ownerReferences": [owner]}
        return {"kind": "Deployment", "metadata": meta, "spec": {"replicas": self.replicas},
                "status": {"readyReplicas": self.replicas}}  # fmt: skip

    async def patch(self, kind: str, ns: str, name: str, body: dict, **kw: Any) -> dict:
        self.patches.append((kind, body))
        return {}

    async def try_post_event(self, *a: Any, **kw: Any) -> None:
        return None


def test_an_alert_step_uses_the_bounds_of_the_moment_it_is_taken() -> None:
    """An edit between the webhook's lookup and the step applies to the step: maxReplicas
    lowered to 1 meanwhile is not exceeded (the step once used the first read's bounds)."""
    from pagoda.operator.autoscaling.alerts import ScaleUpRequest

    api = EditedMeanwhileApi()
    scaler = Autoscaler(api, OperatorConfig(), OperatorMetrics())  # type: ignore[arg-type]
    outcome = asyncio.run(scaler.alert_scale_up(ScaleUpRequest("default", "chat", "A")))
    assert outcome == "AtMaxReplicas"
    assert not [p for p in api.patches if p[0] == "Deployment"]


def test_a_dead_background_loop_does_not_stop_the_operator_stopping() -> None:
    """kopf's cleanup awaits each loop after cancelling it; one that had died of an error once
    raised there, and kopf retried the cleanup for 60 s instead of stopping."""
    import types

    from pagoda.operator import handlers

    closed: list[str] = []

    class Closer:
        def __init__(self, name: str) -> None:
            self.name = name

        async def close(self) -> None:
            closed.append(self.name)

    async def dead() -> None:
        raise OverflowError("cannot convert float infinity to integer")

    async def run() -> None:
        task = asyncio.create_task(dead(), name="pagoda-autoscale")
        await asyncio.sleep(0)
        memo = types.SimpleNamespace(tasks=[task], reconciler=Closer("r"), api=Closer("api"))
        await handlers.cleanup(memo=memo)  # type: ignore[arg-type]

    asyncio.run(run())
    assert closed == ["r", "api"]


def test_the_api_client_sends_strict_json() -> None:
    """A NaN or Infinity never goes to the API server as `NaN`/`Infinity` (not JSON: a real API
    server answers 400, the emulator accepted it, so an Inf p95 TTFT once reached the status)."""
    from pagoda.operator.kube.client import KubeApi

    def no_login() -> Any:
        raise AssertionError("refused before any request")

    api = KubeApi(no_login)
    for bad in (float("inf"), float("nan")):
        body = {"status": {"autoscaling": {"metrics": {"ttftP95Seconds": bad}}}}
        try:
            asyncio.run(api.request("PATCH", "/apis/x", body=body))
        except ValueError as e:
            assert "JSON" in str(e)
        else:
            raise AssertionError("sent")


def _first_scale_down(handover: tuple[float, float] | None) -> float:
    """Wall seconds after the start of the first scale down: readings high (TTFT 4 s) until 15 s,
    low after; a 12 s down window, evaluations every 5 s. `handover`: (when A's loop stops,
    when B's starts), B on another monotonic clock, reading A's saved state."""
    plain = Policy(min_replicas=1, max_replicas=40, target_ttft_s=1.0, down_window_s=12)
    api, wall0, t = StatusApi(), 1_800_000_000.0, [1_800_000_000.5]
    api.replicas, downs = 1, []

    def scaler(offset: float, stop: float) -> Autoscaler:
        made = Autoscaler(api, OperatorConfig(autoscale_interval_s=5.0), OperatorMetrics(),
                          clock=lambda: t[0] - offset, wall=lambda: t[0])  # type: ignore[arg-type]  # fmt: skip

        async def sleep(dt: float) -> None:
            if t[0] + dt > stop:
                t[0] = stop
                raise asyncio.CancelledError
            t[0] += dt

        async def evaluate_all(logger: Any = None, now: float | None = None) -> None:
            fresh = {"metadata": {"namespace": "default", "name": "chat", "uid": "u1"},
                     "status": json.loads(json.dumps(api.status))}  # fmt: skip
            ttft, before = 4.0 if t[0] <= wall0 + 15 else 0.1, api.replicas
            m = dataclasses.replace(reading(0.0, 0.0), ttft_p95_s=ttft)
            await made._decide_and_apply(plain, fresh, api.deployment(), m, ("", ""),
                                         logging.getLogger("test"), now)  # fmt: skip
            if api.replicas < before:
                downs.append(t[0] - wall0)

        made.sleep, made.evaluate_all = sleep, evaluate_all  # type: ignore[method-assign]
        return made

    async def run(made: Autoscaler) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await made.run()

    end = wall0 + 40
    if handover is None:
        asyncio.run(run(scaler(1000.0, end)))
    else:
        asyncio.run(run(scaler(1000.0, wall0 + handover[0])))
        t[0] = wall0 + handover[1]
        asyncio.run(run(scaler(77_777.7, end)))
    assert api.replicas == 1 and downs, downs
    return downs[0]


def test_a_clean_handover_quicker_than_an_interval_keeps_the_down_windows_timing() -> None:
    """Every replica evaluates on the wall clock's grid of the interval, and records its
    decisions at the grid's ticks: the replica that takes over 0.2 s after the other stopped
    evaluates when that one would have, and the saved run's last recommendation (the evaluation
    an interval before its first) is the one that was made. The scale down comes when it does
    without the handover (30 s: the last high recommendation at 15 s, a 12 s window). Before,
    the new replica evaluated at once (15.5 s), took the saved run to have ended an interval
    before (10.5 s), and scaled down at 25.5 s, 1.5 s before the window allowed."""
    alone = _first_scale_down(None)
    assert alone == 30.0
    for stop, start in ((15.3, 15.5), (17.0, 19.9), (19.9, 20.0)):
        assert _first_scale_down((stop, start)) == alone, (stop, start)
