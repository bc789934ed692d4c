"""Autoscaling end to end with real processes on loopback: two `pagoda serve` replicas with the
embedded model, Prometheus and Alertmanager from Debian's packages (1 s scrape and evaluation),
a load generator, and the real operator against the API-server emulator.

Two InferenceServices share the two replicas' metrics (scraped once per service, with the
labels a cluster's relabeling adds): `chat` is scaled by the evaluation loop on p95 TTFT; `burst`
has a long scale-up window, so only an alert (its operator-rendered PrometheusRule, with
`for: 0s`) can add a replica, through Alertmanager and the chart's example route to POST /alerts.
The test plays the Deployment controller; the real processes stay at two, so the operator's
decisions (Deployment `spec.replicas`) follow the metrics while the load lasts.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
import yaml
from autoscale_helpers import autoscaling, deployment_controller, events, replicas, require_tool
from e2e_processes import (
    Processes,
    alertmanager_cmd,
    alertmanager_config,
    free_port,
    prometheus_cmd,
    prometheus_config,
    serve_cmd,
    wait_http,
)
from kube_emulator import Emulator
from operator_harness import ROOT, wait_for
from operator_helpers import condition, create_isvc, patch_isvc
from pagoda.operator.autoscaling import rules
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.spec.inference_service import InferenceServiceSpec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240), pytest.mark.slow]
TOKEN = "e2e-webhook-token"
TARGET_TTFT = 0.1  # a single idle request takes ~0.09 s here; LOAD_CLIENTS push p95 well above
# The burst alert fires at p95 > 2 x target. Replicas have 4 slots each (`serve_cmd`), so 48
# clients keep ~40 requests queued and p95 TTFT seconds over it however fast the engine is (with
# all slots open, a faster engine left p95 near 0.2 s and the alert fired in only some runs).
LOAD_CLIENTS = 48
DOWN_WINDOW = 4  # s; as good a check as 6 was (down no sooner, and soon after), 2 s less
TTFT_WINDOW_S = 5
CHAT = {
    "model": "smollm2-135m",
    "autoscaling": {
        "minReplicas": 2, "maxReplicas": 6, "targetTTFTSeconds": TARGET_TTFT,
        "scaleDownStabilizationSeconds": DOWN_WINDOW,
    },
}  # fmt: skip
BURST = {
    "model": "smollm2-135m",
    "autoscaling": {
        "minReplicas": 1, "maxReplicas": 3, "targetTTFTSeconds": TARGET_TTFT,
        "scaleUpStabilizationSeconds": 600, "scaleDownStabilizationSeconds": 600,
    },
}  # fmt: skip


def _ts(rfc3339: str) -> float:
    """Prometheus' activeAt (nanoseconds, Z) as a Unix time."""
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    base = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.timezone.utc)
    return base.timestamp() + (float(f"0.{frac}") if frac else 0.0)


async def _get_json(url: str, **params: Any) -> Any:
    async with httpx.AsyncClient(timeout=2) as client:
        r = await client.get(url, params=params)
        r.raise_for_status()
        return r.json()


async def test_autoscaling_end_to_end(
    emulator: Emulator, kube: KubeApi, start_operator: Any, tmp_path: Any
) -> None:
    prometheus = require_tool("prometheus")
    alertmanager = require_tool("prometheus-alertmanager", "alertmanager")
    procs = Processes(tmp_path)
    loadgen: subprocess.Popen[str] | None = None
    timings: dict[str, Any] = {}
    try:
        ports = [free_port(), free_port()]
        servers = [
            procs.start(f"serve-{p}", serve_cmd(p), env={"OMP_NUM_THREADS": "1"}) for p in ports
        ]
        prom_port, am_port = free_port(), free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        op = await start_operator(
            prometheus_url=prom_url, webhook_token=TOKEN, autoscale_interval_s=1.0,
            ttft_window=f"{TTFT_WINDOW_S}s", metrics_max_age_s=5.0, prometheus_timeout_s=1.0,
            alert_cooldown_s=300.0,
        )  # fmt: skip
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        (tmp_path / "am.yml").write_text(
            yaml.safe_dump(alertmanager_config(op.http_port, token_file))
        )
        burst_spec = InferenceServiceSpec.from_dict(BURST, name="burst", default_image="img")
        burst_rules = rules.service_rules("default", "burst", burst_spec, for_="0s")
        (tmp_path / "rules.yml").write_text(yaml.safe_dump(burst_rules))
        prom_cfg = prometheus_config(ports, ["chat", "burst"], am_port, tmp_path / "rules.yml")
        (tmp_path / "prom.yml").write_text(yaml.safe_dump(prom_cfg))
        am = procs.start(
            "alertmanager",
            alertmanager_cmd(alertmanager, tmp_path / "am.yml", tmp_path / "am-data", am_port),
        )
        prom_args = prometheus_cmd(
            prometheus, tmp_path / "prom.yml", tmp_path / "prom-data", prom_port
        )
        await asyncio.to_thread(wait_http, am, f"http://127.0.0.1:{am_port}/-/ready", 30)
        t0 = time.monotonic()
        for s, p in zip(servers, ports):
            await asyncio.to_thread(wait_http, s, f"http://127.0.0.1:{p}/ready", 150)
        timings["replicas_ready_s"] = round(time.monotonic() - t0, 1)
        async with httpx.AsyncClient(timeout=30) as client:  # warm up both replicas
            for p in ports:
                r = await client.post(
                    f"http://127.0.0.1:{p}/v1/completions",
                    json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 4},
                )
                assert r.status_code == 200, r.text
        # Scraped from here on: the warm-up (a first request's TTFT, which on a loaded machine
        # can pass the alert's 2 × TARGET_TTFT) is setup, not load the alerts should see.
        prom = procs.start("prometheus", prom_args)
        await asyncio.to_thread(wait_http, prom, f"{prom_url}/-/ready", 30)

        await create_isvc(kube, "chat", CHAT)
        await create_isvc(kube, "burst", BURST)
        async with deployment_controller(kube, "chat", "burst"):
            await wait_for(
                lambda: condition(emulator, "chat", "MetricsUnavailable").get("status") == "False"
                and condition(emulator, "burst", "MetricsUnavailable").get("status") == "False",
                timeout=20, what="fresh metrics for both services",
            )  # fmt: skip
            assert (replicas(emulator, "chat"), replicas(emulator, "burst")) == (2, 1)

            # --- load: TTFT over target raises chat's replicas; the alert adds one to burst
            urls = [f"http://127.0.0.1:{p}" for p in ports]
            loadgen = subprocess.Popen(
                [sys.executable, str(ROOT / "tests/operator/loadgen.py"), "--concurrency", str(LOAD_CLIENTS), *urls],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            t_load = time.monotonic()
            await wait_for(lambda: replicas(emulator, "chat") > 2, timeout=20, interval=0.05,
                           what="chat scaled up under load")  # fmt: skip
            timings["scale_up_after_load_s"] = round(time.monotonic() - t_load, 2)
            chat_status = await wait_for(
                lambda: (
                    autoscaling(emulator, "chat").get("lastScaleSource")
                    and autoscaling(emulator, "chat")
                )
            )
            await wait_for(lambda: replicas(emulator, "burst") == 2, timeout=30, interval=0.05,
                           what="burst scaled by the alert")  # fmt: skip
            t_burst = time.time()
            timings["burst_scaled_after_load_s"] = round(time.monotonic() - t_load, 2)
            firing = await _get_json(f"{prom_url}/api/v1/alerts")
            active = [
                _ts(a["activeAt"]) for a in firing["data"]["alerts"]
                if a["labels"].get("inferenceservice") == "burst" and a["state"] == "firing"
            ]  # fmt: skip
            assert active, firing
            timings["alert_active_to_scale_s"] = round(t_burst - min(active), 2)
            await wait_for(lambda: replicas(emulator, "chat") == 6, timeout=15, what="chat at max")
            timings["chat_at_max_after_load_s"] = round(time.monotonic() - t_load, 2)

            # --- load stops: chat comes down, but only after the down-stabilization window
            loadgen.send_signal(signal.SIGTERM)
            t_stop = time.monotonic()
            out, _ = await asyncio.to_thread(loadgen.communicate, timeout=30)
            t_drained = time.monotonic()  # the requests in flight at SIGTERM have finished
            timings["load"] = json.loads(out.strip().splitlines()[-1])
            loadgen = None
            await wait_for(lambda: replicas(emulator, "chat") < 6, timeout=DOWN_WINDOW + 20,
                           interval=0.05, what="chat scaled down")  # fmt: skip
            timings["scale_down_after_load_stop_s"] = round(time.monotonic() - t_stop, 2)
            timings["scale_down_after_last_request_s"] = round(time.monotonic() - t_drained, 2)
            await wait_for(lambda: replicas(emulator, "chat") == 2, timeout=10, what="chat at min")
            assert replicas(emulator, "burst") == 2  # its 600 s down window holds the alert's step

            # --- Prometheus stops: hold, and say so
            prom.stop()
            t_prom_stop = time.monotonic()
            await patch_isvc(
                kube, "burst", {"spec": {"autoscaling": {"scaleDownStabilizationSeconds": 0}}}
            )
            for name in ("chat", "burst"):
                await wait_for(
                    lambda n=name: condition(emulator, n, "MetricsUnavailable").get("reason")
                    == "PrometheusUnreachable", timeout=10, what=f"{name} MetricsUnavailable",
                )  # fmt: skip
            timings["condition_after_prometheus_stop_s"] = round(time.monotonic() - t_prom_stop, 2)
            for _ in range(20):  # 2 s = 2 evaluations; without metrics burst would drop to 1
                assert (replicas(emulator, "chat"), replicas(emulator, "burst")) == (2, 2)
                await asyncio.sleep(0.1)
            timings["held_s"] = round(time.monotonic() - t_prom_stop, 1)
            assert autoscaling(emulator, "burst")["reason"] == "MetricsUnavailable"
            assert events(emulator, "chat", "MetricsUnavailable")[0]["type"] == "Warning"

            # --- Prometheus is back: fresh idle metrics, burst goes to 1 (window now 0 s)
            prom = procs.start("prometheus-again", prom_args)
            await asyncio.to_thread(wait_http, prom, f"{prom_url}/-/ready", 30)
            t_back = time.monotonic()
            await wait_for(lambda: replicas(emulator, "burst") == 1, timeout=20, what="burst down")
            timings["scale_down_after_prometheus_back_s"] = round(time.monotonic() - t_back, 2)
            await wait_for(
                lambda: condition(emulator, "burst", "MetricsUnavailable")["status"] == "False"
            )

        print(f"\nautoscaling e2e timings: {json.dumps(timings)}")
        # the numbers the issue asks for
        assert timings["scale_up_after_load_s"] < 10, timings
        assert timings["alert_active_to_scale_s"] < 3.0, timings
        # not before the window from the last new request; within window + TTFT window + slack
        # of the last request's end (on a slow CPU the in-flight ones take ~10 s to finish)
        assert timings["scale_down_after_load_stop_s"] >= DOWN_WINDOW, timings
        limit = DOWN_WINDOW + TTFT_WINDOW_S + 8
        assert timings["scale_down_after_last_request_s"] < limit, timings
        assert chat_status["lastScaleSource"] == "metrics"
        assert chat_status["lastScaleReason"].startswith("TTFTAboveTarget")
        assert chat_status["metrics"]["ttftP95Seconds"] > TARGET_TTFT * 1.1
        burst = autoscaling(emulator, "burst")
        ups = events(emulator, "burst", "ScaledUp")
        assert len(ups) == 1 and "(alert)" in ups[0]["message"], ups
        assert "AlertFiring: Pagoda" in ups[0]["message"]
        assert burst["lastScaleSource"] == "metrics"  # the later scale down came from the loop
        assert timings["load"]["requests"] >= 24 and timings["load"]["errors"] == 0, timings
    finally:
        if loadgen is not None:
            loadgen.kill()
            loadgen.wait(10)
        procs.stop_all()
