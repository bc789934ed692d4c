"""The operator's own Prometheus metrics, served at GET /metrics on its HTTP port.

prometheus_client families in a registry of their own (one per operator: the tests run several
in one process, and the default registry would mix them with the process collector). No
`*_created` series: prometheus_client adds one per counter and histogram child (its creation
time), noise to most users and a series per label set; the runtime's /metrics leaves them out
too (as vLLM's does). The switch is prometheus_client's, for the whole process.
"""

from __future__ import annotations

import contextlib

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

_ISVC = ("namespace", "inferenceservice")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no `*_created` series (see the module's docstring)
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.scale_events = Counter(
            "pagoda_operator_scale_events",
            "Replica changes the autoscaler made.",
            [*_ISVC, "direction", "source"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "pagoda_operator_reconcile_duration_seconds",
            "Duration of one reconcile, by what triggered it.",
            ["trigger"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.autoscale_duration = Histogram(
            "pagoda_operator_autoscale_evaluation_duration_seconds",
            "Duration of one autoscaling evaluation (queries, decision, writes).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.desired_replicas = Gauge(
            "pagoda_operator_desired_replicas",
            "Replicas the autoscaler last decided.",
            _ISVC,
            registry=r,
        )
        self.metrics_unavailable = Counter(
            "pagoda_operator_metrics_unavailable",
            "Evaluations that held because metrics were missing or stale.",
            [*_ISVC, "reason"],
            registry=r,
        )
        self.alerts = Counter(
            "pagoda_operator_alerts_received",
            "Requests to POST /alerts, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.api_errors = Counter(
            "pagoda_operator_api_errors",
            "Failed Kubernetes API calls of the operator (kopf's own excluded), by HTTP status "
            "(0: unreachable) and verb.",
            ["status", "verb"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "pagoda_operator_reconcile_errors",
            "Reconciles that failed, by trigger and kind (transient: retried with backoff; "
            "permanent: a condition says why; status: a refused status write, retried with "
            "backoff and posted as an Event).",
            ["trigger", "kind"],
            registry=r,
        )
        self.reconcile_retries = Counter(
            "pagoda_operator_reconcile_retries",
            "Reconciles retried after a transient failure (kopf's handler retries and the "
            "operator's follow-ups), by what needed them.",
            ["trigger"],
            registry=r,
        )

        self.peering_active = Gauge(
            "pagoda_operator_peering_active",
            "1 on the replica that acts (always, without --peering), 0 on a standby one.",
            registry=r,
        )

    def forget(self, namespace: str, name: str) -> None:
        """Drop the per-service gauge of a service that is gone or no longer autoscaled."""
        with contextlib.suppress(KeyError):
            self.desired_replicas.remove(namespace, name)

    def set_role(self, active: bool) -> None:
        """The peering role: a standby's desired-replicas gauges go (its autoscaler stopped;
        every replica is scraped, so stale ones would add to the active replica's)."""
        self.peering_active.set(int(active))
        if not active:
            self.desired_replicas.clear()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE})

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/metrics", self.handle)]
