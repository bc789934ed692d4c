"""Several operator replicas (operator/kube/peering.py): kopf's pause rule read back, and two
real operators with kopf peering against the emulator — one acts (its loops, POST /alerts, its
pod labelled active), the other stands by, and takes over when the first one stops."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kopf
import pytest
import yaml
from autoscale_helpers import autoscaling, deployment_controller, replicas
from fake_prometheus import FakePrometheus
from kube_emulator import Emulator
from operator_harness import wait_for
from operator_helpers import EXAMPLE_SPEC, assert_permitted, create_isvc, sample
from pagoda.operator import flags, main
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.kube.peering import (
    PEERING_LABEL,
    PeeringGate,
    auto_priority,
    is_active,
    live_peers,
)
from pagoda.operator.reconcile import retry
from pagoda.operator.web.metrics import OperatorMetrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
PEERING = "pagoda"


def record(priority: int, seconds_ago: float = 0, lifetime: int = 30) -> dict[str, Any]:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def test_kopf_pause_rule() -> None:
    """Paused while a live peer has a higher or the same priority (kopf pauses both then);
    expired records, lifetime 0 (kopf's goodbye) and our own record do not count."""
    assert is_active({}, "a", 5, NOW) and is_active(None, "a", 5, NOW)
    assert is_active({"a": record(5), "b": record(4)}, "a", 5, NOW)
    assert not is_active({"a": record(5), "b": record(6)}, "a", 5, NOW)
    assert not is_active({"a": record(5), "b": record(5)}, "a", 5, NOW)  # same: both pause
    assert is_active({"b": record(9, seconds_ago=31)}, "a", 5, NOW)  # b's record expired
    assert not is_active({"b": record(9, seconds_ago=29)}, "a", 5, NOW)
    assert is_active({"b": record(9, lifetime=0)}, "a", 5, NOW)  # b said goodbye
    assert not is_active({"b": {"priority": 9}}, "a", 5, NOW)  # no lastseen: kopf says now
    assert live_peers({"b": record(9), "c": "junk", "d": {"priority": "x"}}, "a", NOW) == {"b": 9}


def test_an_earlier_start_is_a_higher_priority() -> None:
    first, later = auto_priority(1_800_000_000.0, 999), auto_priority(1_800_000_000.001, 0)
    assert first > later
    assert auto_priority(1_800_000_000.0, 1) != auto_priority(1_800_000_000.0, 2)
    assert abs(auto_priority()) < 2**53  # exact as a JSON number everywhere


def test_peering_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    monkeypatch.setenv("POD_NAME", "pagoda-operator-7d9f-abcde")
    args = ["--peering", "pagoda-operator", "--peering-priority", "7", "--peering-lifetime", "15"]
    config = flags.config_from_args(parser.parse_args(args))
    assert (config.peering, config.peering_priority, config.pod_name) == (
        "pagoda-operator",
        7,
        "pagoda-operator-7d9f-abcde",
    )
    settings = main.kopf_settings(config)
    assert settings.peering.lifetime == 15 and not settings.peering.standalone
    assert flags.config_from_args(parser.parse_args([])).peering is None
    for bad in (["--peering", "Not_A_Name"], ["--peering", "x", "--peering-lifetime", "1"]):
        with pytest.raises(ValueError):
            flags.config_from_args(parser.parse_args(bad))


def peering_crds() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "crds/kopf-peering.yaml").read_text()) if d]


async def alerts_status(port: int) -> tuple[int, dict[str, Any], str | None]:
    body = {"version": "4", "status": "firing", "alerts": []}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}/alerts", json=body) as r,
    ):
        return r.status, await r.json(), r.headers.get("Connection")


async def metric(port: int, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return sample(await r.text(), name) or 0.0


async def readyz(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/readyz") as r:
        assert r.status == 200  # a standby replica is ready too (rollouts, PDBs, helm --wait)
        return await r.json()


async def role(kube: KubeApi, pod: str) -> str | None:
    body = await kube.get("Pod", "default", pod)
    assert body is not None
    return (body["metadata"].get("labels") or {}).get(PEERING_LABEL)


async def cluster_peering(emulator: Emulator, kube: KubeApi, pods: tuple[str, ...]) -> None:
    """kopf's CRDs, the ClusterKopfPeering and a Pod object per replica (to be labelled)."""
    for crd in peering_crds():
        emulator.declare_crd(crd)
        await kube.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
        )
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": PEERING},
    }
    await kube.request("POST", "/apis/kopf.dev/v1/clusterkopfpeerings", body=peering)
    for pod in pods:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod},
            "spec": {"containers": []},
        }
        await kube.request("POST", "/api/v1/namespaces/default/pods", body=body)


async def _more(value: Any, than: float) -> bool:
    return await value > than


def replica(name: str, priority: int | None) -> dict[str, Any]:
    return {
        "peering": PEERING,
        "peering_priority": priority,
        "peering_interval_s": 0.2,
        "autoscale_interval_s": 0.2,  # the active one's loop runs often; a standby's never
        "pod_name": name,
        "pod_namespace": "default",
    }


@pytest.mark.slow  # two operators and the emulator share this process: `make test` runs it alone
async def test_one_replica_acts_and_the_other_takes_over(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await cluster_peering(emulator, kube, ("op-a", "op-b"))

    a = await start_operator(**replica("op-a", 20))
    b = await start_operator(**replica("op-b", 10))

    async def settled() -> bool:
        return await role(kube, "op-a") == "active" and await role(kube, "op-b") == "standby"

    async def both_recorded() -> bool:  # each kopf keeps its record there
        body = await kube.get("ClusterKopfPeering", None, PEERING)
        status = (body or {}).get("status") or {}
        return {k: v["priority"] for k, v in status.items()} == {"op-a": 20, "op-b": 10}

    await wait_for(settled, 30, what="op-a active, op-b standby")
    await wait_for(both_recorded, 30, what="both kopfs' peering records")
    assert (await readyz(a.http_port))["peering"] == "active"
    assert (await readyz(b.http_port))["peering"] == "standby"
    # an autoscaled service (no Prometheus: it holds) is evaluated by the active replica only
    auto = {"minReplicas": 1, "maxReplicas": 2, "targetTTFTSeconds": 0.5}
    await create_isvc(kube, "auto", {"model": "smollm2-135m", "autoscaling": auto})
    passes = "pagoda_operator_autoscale_evaluation_duration_seconds_count"
    await wait_for(lambda: _more(metric(a.http_port, passes), 2), 30, what="A's autoscaler")
    assert await metric(b.http_port, passes) == 0  # the standby's autoscaler never ran
    assert await metric(a.http_port, "pagoda_operator_peering_active") == 1
    assert await metric(b.http_port, "pagoda_operator_peering_active") == 0
    code, body, connection = await alerts_status(b.http_port)
    assert (code, body["status"], connection) == (503, "standby", "close")
    assert (await alerts_status(a.http_port))[:2] == (200, {"status": "ignored", "results": []})

    # op-a stops (SIGTERM in a pod): kopf removes its record, op-b takes over — kopf's
    # handlers (a new InferenceService gets its Deployment) and the gate (alerts, label).
    await a.shutdown()

    async def took_over() -> bool:
        return await role(kube, "op-b") == "active"

    await wait_for(took_over, 30, what="op-b active")
    await wait_for(lambda: _more(metric(b.http_port, passes), 2), 30, what="B's autoscaler")
    assert await metric(b.http_port, "pagoda_operator_peering_active") == 1
    assert (await alerts_status(b.http_port))[0] == 200
    await create_isvc(kube, "chat", EXAMPLE_SPEC)

    async def deployed() -> bool:
        return await kube.get("Deployment", "default", "chat") is not None

    await wait_for(deployed, 30, what="op-b's kopf handlers created the Deployment")
    assert_permitted(emulator)


def test_a_replica_that_stands_by_drops_its_desired_replicas() -> None:
    """Every replica is scraped (the chart's headless metrics Service): a standby must not go on
    exporting the desired replicas of its last term beside the active replica's."""
    metrics = OperatorMetrics()
    config = flags.config_from_args(_parser().parse_args(["--peering", PEERING]))
    gate = main._peering_gate(config, None, metrics)  # type: ignore[arg-type]  (no reads here)
    gate._set_active(True)
    metrics.desired_replicas.labels("default", "chat").set(3)
    assert sample(metrics.render().decode(), "pagoda_operator_desired_replicas") == 3
    gate._set_active(False)
    text = metrics.render().decode()
    assert sample(text, "pagoda_operator_desired_replicas") is None
    assert sample(text, "pagoda_operator_peering_active") == 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    return parser


async def test_without_the_peering_object_a_replica_stands_by(
    emulator: Emulator, kube: KubeApi
) -> None:
    """As kopf does: no KopfPeering in a served namespace (or no CRD) → nothing acts; once
    it exists and holds no higher record, the replica acts."""
    for crd in peering_crds():
        emulator.declare_crd(crd)
    changes: list[bool] = []
    clock = [0.0]
    gate = PeeringGate(
        kube, name=PEERING, namespaces=("default",), identity="op-x", priority=1,
        lifetime_s=30, on_change=changes.append, clock=lambda: clock[0],
    )  # fmt: skip
    assert gate.active is False and await gate.check() is False
    body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
    await kube.request("POST", "/apis/kopf.dev/v1/namespaces/default/kopfpeerings", body=body)
    assert await gate.check() is False  # not joined: our own record is not there yet

    def live(priority: int) -> dict[str, Any]:
        seen = datetime.datetime.now(datetime.timezone.utc).isoformat()
        return {"priority": priority, "lifetime": 60, "lastseen": seen}

    await kube.patch("KopfPeering", "default", PEERING, {"status": {"op-x": live(1)}})
    assert await gate.check() is True and changes == [True]
    # API errors: the role holds (the loops and the autoscaler's history with it) until the
    # reads have failed for a lifetime, when the others count this replica as gone
    emulator.fail("GET", "kopfpeerings", 503, times=2)
    assert await gate.check() is True
    clock[0] += 31
    assert await gate.check() is False and changes == [True, False]
    assert await gate.check() is True and changes == [True, False, True]  # reads again
    await kube.patch("KopfPeering", "default", PEERING, {"status": {"op-y": live(2)}})
    assert await gate.check() is False and changes == [True, False, True, False]


@pytest.mark.slow  # three operators and the emulator share this process: run alone
async def test_replicas_that_start_together_elect_one(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """Default priorities (from the start time, a random tie-break), started at once: never
    kopf's same-priority pause of both; exactly one acts, the one with the higher record."""
    pods = ("op-a", "op-b", "op-c")
    await cluster_peering(emulator, kube, pods)
    await asyncio.gather(*(start_operator(**replica(pod, None)) for pod in pods))

    async def elected() -> str | None:
        body = await kube.get("ClusterKopfPeering", None, PEERING)
        status = (body or {}).get("status") or {}
        roles = [await role(kube, pod) for pod in pods]
        if len(status) < len(pods) or sorted(map(str, roles)) != ["active", "standby", "standby"]:
            return None
        assert len({r["priority"] for r in status.values()}) == len(pods)
        return max(status, key=lambda pod: status[pod]["priority"])

    highest = await wait_for(elected, 30, what="one active replica")
    assert await role(kube, highest) == "active"


@pytest.fixture
async def prom() -> AsyncIterator[FakePrometheus]:
    p = FakePrometheus()
    await p.start()
    yield p
    await p.stop()


@pytest.mark.slow  # asserts how soon the standby scales down: `make test` runs it alone
async def test_the_standby_goes_on_from_the_autoscalers_saved_state(
    emulator: Emulator, kube: KubeApi, start_operator: Any, prom: FakePrometheus
) -> None:
    """The active replica scales up, then records lower recommendations while the scale-down
    window runs, and stops; the standby takes over from status.autoscaling.state: it scales down
    when the window of the last high reading ends, not a full window after it took over."""
    window, stop_at = 5, 2.0  # op-a stops 2 s into the window: 3 s for its shutdown
    await cluster_peering(emulator, kube, ("op-a", "op-b"))
    fast = {"prometheus_url": prom.url, "alert_cooldown_s": 0.0}
    a = await start_operator(**replica("op-a", 20), **fast)
    b = await start_operator(**replica("op-b", 10), **fast)
    await wait_for(lambda: _is(kube, "op-a", "active"), 30, what="op-a active")
    auto = {"minReplicas": 1, "maxReplicas": 4, "targetTTFTSeconds": 0.5,
            "scaleDownStabilizationSeconds": window}  # fmt: skip
    await create_isvc(kube, "chat", {"model": "smollm2-135m", "autoscaling": auto})
    async with deployment_controller(kube, "chat"):
        prom.ttft = 3.0
        await wait_for(lambda: replicas(emulator, "chat") == 4, 15, what="op-a scaled up")
        # ... and saw the 4 ready with TTFT high (not a ReplicasStarting hold, which would make
        # the first idle reading's recommendation 4 too)
        await wait_for(lambda: autoscaling(emulator, "chat")["metrics"]["readyReplicas"] == 4, 10)
        prom.ttft = None  # idle: op-a recommends 1 and holds 4 for the window
        await wait_for(lambda: autoscaling(emulator, "chat").get("reason") == "Stabilizing", 10)
        last_high = max(t for t, v in prom.ttft_answers if v is not None)
        saved = autoscaling(emulator, "chat")["state"]
        assert saved["version"] == 1 and saved["recommending"][0] == 1, saved
        await asyncio.sleep(max(0.0, last_high + stop_at - time.monotonic()))
        await a.shutdown()
        await wait_for(lambda: _is(kube, "op-b", "active"), 30, what="op-b active")
        took_over = time.monotonic()
        assert replicas(emulator, "chat") == 4, "op-a scaled down before it stopped"
        await wait_for(lambda: replicas(emulator, "chat") == 1, 15, what="op-b scaled down")
        down = time.monotonic()
    # never before the window of the last high reading ends; and not a whole window after op-b
    # took over, as a fresh start would (the evaluations may lag on a loaded machine: op-a's
    # shutdown and op-b's take-over, at least `stop_at` s of the window, are the margin)
    assert down - last_high >= window, (down - last_high, took_over - last_high)
    assert down - took_over < window - 1.0, (down - took_over, took_over - last_high)
    scaled = "pagoda_operator_scale_events_total"
    assert await metric(b.http_port, scaled) == 1  # op-b's scale down
    assert_permitted(emulator)


async def _is(kube: KubeApi, pod: str, want: str) -> bool:
    return await role(kube, pod) == want


@pytest.mark.slow  # waits out a peering lifetime: `make test` runs it alone
async def test_a_crashed_active_replica_is_replaced_within_a_lifetime(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """The active replica hangs (a crash, a lost node: no goodbye) right after a keep-alive, the
    worst case: its record lives a whole `--peering-lifetime`. The standby's kopf resumes its
    handlers when the record expires, and its gate (polled every `peering_interval_s`) labels
    it active and starts the loops, within the lifetime plus one poll (plus 3 s for a busy
    machine) of the hang. A 4 s lifetime here; `PAGODA_FAILOVER_DEFAULTS=1` (with `-s`: it
    prints the times) measures the defaults, 15 s and 2 s (docs/operator.md)."""
    config = flags.config_from_args(_parser().parse_args(["--peering", PEERING]))
    lifetime, poll = config.peering_lifetime_s, config.peering_interval_s
    if not os.environ.get("PAGODA_FAILOVER_DEFAULTS"):
        lifetime, poll = 4, 0.5
    await cluster_peering(emulator, kube, ("op-a", "op-b"))
    fixed = {"peering": PEERING, "pod_namespace": "default", "peering_lifetime_s": lifetime,
             "peering_interval_s": poll}  # fmt: skip
    a = await start_operator(peering_priority=20, pod_name="op-a", **fixed)
    await start_operator(peering_priority=10, pod_name="op-b", **fixed)
    await wait_for(lambda: _is(kube, "op-a", "active"), 30, what="op-a active")
    await wait_for(lambda: _is(kube, "op-b", "standby"), 30, what="op-b standby")

    async def lastseen() -> str:
        body = await kube.get("ClusterKopfPeering", None, PEERING)
        return (((body or {}).get("status") or {}).get("op-a") or {}).get("lastseen", "")

    before = await lastseen()
    await wait_for(lambda: _newer(lastseen(), before), lifetime, what="op-a's next keep-alive")
    a.freeze()
    hung = time.monotonic()
    await create_isvc(kube, "chat", EXAMPLE_SPEC)  # waits for a replica whose kopf acts

    async def deployed() -> bool:
        return await kube.get("Deployment", "default", "chat") is not None

    await wait_for(lambda: _is(kube, "op-b", "active"), lifetime + poll + 10, what="op-b active")
    labelled = time.monotonic() - hung
    await wait_for(deployed, 10, what="op-b's kopf handlers")
    handled = time.monotonic() - hung
    print(f"crash failover (lifetime {lifetime} s, poll {poll:g} s): kopf's handlers "
          f"{handled:.1f} s, gate {labelled:.1f} s")  # fmt: skip
    assert lifetime - 1 <= labelled <= lifetime + poll + 3, (labelled, handled)
    assert handled <= lifetime + poll + 3, (labelled, handled)


async def _newer(value: Any, than: str) -> bool:
    got = await value
    return bool(got) and got != than


@pytest.mark.parametrize("stands_by", [False, True])
async def test_a_standby_drops_its_follow_up_retries(
    emulator: Emulator, kube: KubeApi, monkeypatch: pytest.MonkeyPatch, stands_by: bool
) -> None:
    """A reconcile that failed on the active replica schedules a follow-up retry; if the replica
    stands by before it wakes, the retry does nothing (the active replica acts: two writers of
    the children otherwise, for up to 7 minutes of retries); still active, it reconciles."""
    monkeypatch.setattr(retry, "backoff", lambda n: 0.05)
    body = await create_isvc(kube, "chat", EXAMPLE_SPEC)
    active = [True]
    api = KubeApi(request_timeout_s=5)
    config = flags.config_from_args(_parser().parse_args(["--peering", PEERING, "--no-pin-models"]))
    reconciler = retry.Reconciler(api, config, active=lambda: active[0])
    emulator.fail("GET", "inferenceservices", 503)  # its fresh read fails: a follow-up
    with pytest.raises(kopf.TemporaryError):
        await reconciler.run(body, logging.getLogger("test"), 0, "resync")
    active[0] = not stands_by
    try:
        await asyncio.sleep(0.5)
        assert (await kube.get("Deployment", "default", "chat") is None) is stands_by
    finally:
        await reconciler.close()
        await api.close()


async def test_a_failed_read_keeps_the_role_only_while_its_record_lives(
    emulator: Emulator, kube: KubeApi
) -> None:
    """The others count this replica as gone `lifetime` after its last keep-alive, which may be
    up to lifetime − 5 s before the gate's last good read: when the reads fail, the gate stands
    by when that record expires, not a lifetime after the read (both would act meanwhile)."""
    for crd in peering_crds():
        emulator.declare_crd(crd)
    body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
    await kube.request("POST", "/apis/kopf.dev/v1/namespaces/default/kopfpeerings", body=body)
    seen = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)
    record = {"priority": 1, "lifetime": 15, "lastseen": seen.isoformat()}
    await kube.patch("KopfPeering", "default", PEERING, {"status": {"op-x": record}})
    clock = [0.0]
    gate = PeeringGate(
        kube, name=PEERING, namespaces=("default",), identity="op-x", priority=1,
        lifetime_s=15, clock=lambda: clock[0],
    )  # fmt: skip
    assert await gate.check() is True  # its record has ~10 s left
    emulator.fail("GET", "kopfpeerings", 503, times=2)
    clock[0] += 4
    assert await gate.check() is True
    clock[0] += 7  # 16 s after the keep-alive, 11 s after the read: the others act now
    assert await gate.check() is False
    # read again: a record of its own that has expired (its keep-alives fail, its reads work)
    # is no record, as the others see it
    assert await gate.check() is True
    old = (seen - datetime.timedelta(seconds=11)).isoformat()
    await kube.patch("KopfPeering", "default", PEERING, {"status": {"op-x": {"lastseen": old}}})
    assert await gate.check() is False
