"""POST /alerts (operator/alerts.py): payload validation, bearer token, and alert-driven scale-up
steps through the running operator against the emulator; operator settings from env and flags."""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
from typing import Any

import aiohttp
import pytest
from autoscale_helpers import autoscaling, deployment_controller, events, replicas
from kube_emulator import Emulator
from operator_harness import wait_for
from operator_helpers import EXAMPLE_SPEC, create_isvc, operator_requests, sample
from pagoda.operator import flags
from pagoda.operator.autoscaling.alerts import ScaleUpRequest, authorized, parse_payload
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.spec.config import OperatorConfig

TOKEN = "s3cret-token"


def alert(status: str = "firing", **labels: str) -> dict[str, Any]:
    base = {"alertname": "PagodaTTFTHigh", "namespace": "default", "inferenceservice": "chat"}
    base.update(pagoda_action="scale_up")
    return {"status": status, "labels": {**base, **labels}, "annotations": {}}


def payload(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """What Alertmanager 0.25 sends to a webhook receiver."""
    return {
        "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing",
        "receiver": "pagoda-operator", "groupLabels": {}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts), **extra,
    }  # fmt: skip


# --- parsing (pure) ---------------------------------------------------------------------------


def test_parse_firing_scale_up_alerts_one_per_service() -> None:
    got = parse_payload(
        payload(
            alert(),
            alert(alertname="PagodaQueueBacklog"),  # same service: one step
            alert(inferenceservice="other"),
            alert(status="resolved", inferenceservice="gone"),  # resolved: nothing to do
            {"status": "firing", "labels": {"alertname": "DiskFull"}},  # not ours: ignored
        )
    )
    assert got == [
        ScaleUpRequest("default", "chat", "PagodaTTFTHigh"),
        ScaleUpRequest("default", "other", "PagodaTTFTHigh"),
    ]
    assert parse_payload(payload()) == []


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([], "JSON object"),
        ({"alerts": []}, "version"),
        (payload(version="3"), "version"),
        (payload(alerts={}), "alerts must be a list"),
        (payload(alerts=["x"]), "alerts[0] must be an object"),
        (payload({"status": "pending", "labels": {}}), "firing or resolved"),
        (payload({"status": "firing", "labels": {"a": 1}}), "strings"),
        (payload({"status": "firing"}), "strings"),
        (payload(alert(pagoda_action="scale_down")), "unknown pagoda_action"),
        (payload(alert(namespace="")), "needs namespace and inferenceservice"),
        (payload({"status": "firing", "labels": {"pagoda_action": "scale_up"}}), "needs"),
        (payload(alert(), alert(pagoda_action="reboot")), "alerts[1]"),  # all or nothing
        # the labels go into API paths: only names an object can have
        (payload(alert(inferenceservice="chat/status")), "inferenceservice 'chat/status' is not"),
        (payload(alert(namespace="../kube-system")), "namespace '../kube-system' is not"),
        (payload(alert(inferenceservice="c" * 64)), "is not a DNS label"),
        (payload(alert(inferenceservice="Chat", status="resolved")), "is not a DNS label"),
    ],
)
def test_parse_rejects_what_alertmanager_never_sends(body: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("[", r"\[")):
        parse_payload(body)


@pytest.mark.parametrize(
    ("header", "token", "ok"),
    [
        (None, None, True),
        ("Bearer x", None, True),
        (f"Bearer {TOKEN}", TOKEN, True),
        (f"bearer {TOKEN}", TOKEN, True),
        (None, TOKEN, False),
        ("Bearer wrong", TOKEN, False),
        (f"Basic {TOKEN}", TOKEN, False),
        (TOKEN, TOKEN, False),
    ],
)
def test_bearer_token(header: str | None, token: str | None, ok: bool) -> None:
    assert authorized(header, token) is ok


# --- settings ---------------------------------------------------------------------------------


def parse_args(*argv: str) -> OperatorConfig:
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    return flags.config_from_args(parser.parse_args(list(argv)))


def test_settings_from_env_and_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("PAGODA_PROMETHEUS_URL", "http://prom.monitoring:9090")
    monkeypatch.setenv("PAGODA_WEBHOOK_TOKEN", f"{TOKEN}\n")  # as mounted from a Secret
    config = parse_args()
    assert (config.prometheus_url, config.webhook_token) == ("http://prom.monitoring:9090", TOKEN)
    assert TOKEN not in repr(config)
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    config = parse_args(
        "--prometheus-url", "http://other:9090", "--webhook-token-file", str(token_file),
        "--autoscale-interval", "5", "--ttft-window", "30s", "--metrics-max-age", "20",
        "--alert-cooldown", "0", "--prometheus-timeout", "2",
    )  # fmt: skip
    assert config.prometheus_url == "http://other:9090"
    assert config.webhook_token == "from-file"
    assert (config.autoscale_interval_s, config.ttft_window, config.metrics_max_age_s) == (
        5.0, "30s", 20.0,
    )  # fmt: skip
    assert (config.alert_cooldown_s, config.prometheus_timeout_s) == (0.0, 2.0)
    with pytest.raises(ValueError, match="webhook-token-file"):
        parse_args("--webhook-token-file", str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prometheus_url": "prometheus:9090"},
        {"ttft_window": "1 minute"},
        {"autoscale_interval_s": 0},
        {"alert_cooldown_s": -1},
        {"webhook_token": ""},
        {"webhook_token": "two words"},
    ],
)
def test_invalid_autoscaling_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        OperatorConfig(**kwargs)


# --- the webhook in the running operator ------------------------------------------------------

AUTOSCALED = {
    "model": "smollm2-135m",
    "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetTTFTSeconds": 0.5},
}


async def post(port: int | None, body: Any, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}/alerts", data=data, headers=headers) as r,
    ):
        return r.status, await r.json()


def deployment_patches(emulator: Emulator, since: int) -> list[Any]:
    return [
        r for r in operator_requests(emulator, since)
        if r.method.value == "PATCH" and r.resource and r.resource.plural == "deployments"
    ]  # fmt: skip


@pytest.mark.e2e
async def test_firing_alert_scales_one_step(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    # no Prometheus URL: the loop only holds, so every change below comes from the webhook
    op = await start_operator(webhook_token=TOKEN, alert_cooldown_s=0.0, autoscale_interval_s=0.3)
    await create_isvc(kube, "chat", AUTOSCALED)
    await create_isvc(kube, "fixed", EXAMPLE_SPEC)
    async with deployment_controller(kube, "chat", "fixed"):
        await wait_for(lambda: replicas(emulator, "chat") == 1 and replicas(emulator, "fixed"))
        await wait_for(lambda: autoscaling(emulator, "chat").get("reason"))
        mark = len(emulator._requests)

        # refused: no token, wrong token, malformed or unknown payloads; nothing changes
        assert (await post(op.http_port, payload(alert()), token=None))[0] == 401
        assert (await post(op.http_port, payload(alert()), token="wrong"))[0] == 401
        for bad in (b"{not json", b"\xff\xfe", payload(version="3"), payload(alert(namespace=""))):
            status, body = await post(op.http_port, bad)
            assert status == 400, body
        assert deployment_patches(emulator, mark) == []
        assert replicas(emulator, "chat") == 1

        status, body = await post(op.http_port, payload(alert(), alert(status="resolved")))
        assert status == 200
        assert body["results"] == [
            {"namespace": "default", "inferenceservice": "chat", "outcome": "ScaledUp"}
        ]
        assert replicas(emulator, "chat") == 2  # done before the reply
        st = await wait_for(
            lambda: (
                autoscaling(emulator, "chat").get("lastScaleSource") == "alert"
                and autoscaling(emulator, "chat")
            )
        )
        assert st["lastScaleReason"].startswith("AlertFiring: PagodaTTFTHigh fired")
        (event,) = events(emulator, "chat", "ScaledUp")
        assert "from 1 to 2" in event["message"] and "(alert)" in event["message"]

        await wait_for(
            lambda: (
                (emulator.live("apps/v1/deployments", "default", "chat")["status"] or {}).get(
                    "readyReplicas"
                )
                == 2
            )
        )
        outcomes = []
        for labels in (
            {},  # 2 -> 3
            {},  # at maxReplicas
            {"inferenceservice": "fixed"},  # spec.replicas decides there
            {"inferenceservice": "missing"},
        ):
            status, body = await post(op.http_port, payload(alert(**labels)))
            assert status == 200
            outcomes.append(body["results"][0]["outcome"])
            await wait_for(
                lambda: (
                    (emulator.live("apps/v1/deployments", "default", "chat")["status"] or {}).get(
                        "readyReplicas"
                    )
                    == replicas(emulator, "chat")
                )
            )
        assert outcomes == ["ScaledUp", "AtMaxReplicas", "AutoscalingDisabled", "NotFound"]
        assert replicas(emulator, "chat") == 3
        assert replicas(emulator, "fixed") == 1
        # the loop holds (no Prometheus): the alert's replicas stay
        assert condition_reason(emulator, "chat") == "NoPrometheusURL"

    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{op.http_port}/metrics") as r:
        text = await r.text()
    assert sample(text, "pagoda_operator_alerts_received_total", outcome="unauthorized") == 2
    assert sample(text, "pagoda_operator_alerts_received_total", outcome="rejected") == 4
    scaled = sample(
        text, "pagoda_operator_scale_events_total",
        namespace="default", inferenceservice="chat", direction="up", source="alert",
    )  # fmt: skip
    assert scaled == 2


def condition_reason(emulator: Emulator, name: str) -> str | None:
    body = emulator.live("serving.pagoda.dev/v1alpha1/inferenceservices", "default", name) or {}
    for c in (body.get("status") or {}).get("conditions") or []:
        if c["type"] == "MetricsUnavailable":
            return c["reason"]
    return None


@pytest.mark.e2e
async def test_cooldown_starting_replicas_and_unserved_namespaces(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    op = await start_operator(namespaces=("default",), alert_cooldown_s=60.0)
    await create_isvc(kube, "chat", AUTOSCALED)
    await wait_for(lambda: replicas(emulator, "chat") == 1)
    first = copy.deepcopy(payload(alert()))
    # the Deployment reports no ready replica yet: a starting replica is not overload
    status, body = await post(op.http_port, first, token=None)
    assert (status, body["results"][0]["outcome"]) == (200, "ReplicasStarting")
    async with deployment_controller(kube, "chat"):
        await wait_for(
            lambda: (
                (emulator.live("apps/v1/deployments", "default", "chat").get("status") or {}).get(
                    "readyReplicas"
                )
                == 1
            )
        )
        outcomes = [(await post(op.http_port, first, token=None))[1]["results"][0]["outcome"]]
        outcomes.append((await post(op.http_port, first, token=None))[1]["results"][0]["outcome"])
        _, body = await post(op.http_port, payload(alert(namespace="elsewhere")), token=None)
        outcomes.append(body["results"][0]["outcome"])
    assert outcomes == ["ScaledUp", "Cooldown", "NamespaceNotServed"]
    assert replicas(emulator, "chat") == 2
