"""The operator's own Prometheus metrics, served at GET /metrics on its HTTP port.

A few counters, gauges and histograms in the Prometheus text format (version 0.0.4), written
here rather than with prometheus_client so the operator image stays kopf + aiohttp (the
Dockerfile's OPERATOR_DEPS). One instance per operator: tests run several in a process.
All updates happen on the operator's event loop.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ISVC = ("namespace", "inferenceservice")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Family:
    kind = ""

    def __init__(self, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        self.name, self.doc, self.label_names = name, doc, tuple(labels)
        self._values: dict[tuple[str, ...], list[float]] = {}

    def _key(self, values: Sequence[str]) -> tuple[str, ...]:
        if len(values) != len(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(values)}")
        return tuple(str(v) for v in values)

    def _labels(self, key: tuple[str, ...], extra: str = "") -> str:
        parts = [f'{n}="{_escape(v)}"' for n, v in zip(self.label_names, key)]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""

    def remove(self, *values: str) -> None:
        self._values.pop(self._key(values), None)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} {self.kind}"]
        for key, value in sorted(self._values.items()):
            lines += self._samples(key, value)
        return lines

    def _samples(self, key: tuple[str, ...], value: list[float]) -> list[str]:
        return [f"{self.name}{self._labels(key)} {_fmt(value[0])}"]


class Counter(_Family):
    kind = "counter"

    def inc(self, *values: str, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._values.setdefault(self._key(values), [0.0])[0] += amount

    def value(self, *values: str) -> float:
        return self._values.get(self._key(values), [0.0])[0]

    def _samples(self, key: tuple[str, ...], value: list[float]) -> list[str]:
        return [f"{self.name}_total{self._labels(key)} {_fmt(value[0])}"]


class Gauge(_Family):
    kind = "gauge"

    def set(self, value: float, *values: str) -> None:
        self._values[self._key(values)] = [float(value)]


class Histogram(_Family):
    kind = "histogram"

    def __init__(
        self, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = ()
    ) -> None:
        super().__init__(name, doc, labels)
        self.bounds = sorted(buckets or LATENCY_BUCKETS)

    def observe(self, value: float, *values: str) -> None:
        # per key: one count per bucket (not cumulative), then +Inf, sum, count
        state = self._values.setdefault(self._key(values), [0.0] * (len(self.bounds) + 3))
        state[bisect.bisect_left(self.bounds, value)] += 1
        state[-2] += value
        state[-1] += 1

    def _samples(self, key: tuple[str, ...], value: list[float]) -> list[str]:
        lines, acc = [], 0.0
        for bound, count in zip([*self.bounds, math.inf], value[:-2]):
            acc += count
            le = f'le="{_fmt(bound)}"'
            lines.append(f"{self.name}_bucket{self._labels(key, le)} {_fmt(acc)}")
        lines.append(f"{self.name}_sum{self._labels(key)} {_fmt(value[-2])}")
        lines.append(f"{self.name}_count{self._labels(key)} {_fmt(value[-1])}")
        return lines


class OperatorMetrics:
    def __init__(self) -> None:
        self.scale_events = Counter(
            "pagoda_operator_scale_events",
            "Replica changes the autoscaler made.",
            [*_ISVC, "direction", "source"],
        )
        self.reconcile_duration = Histogram(
            "pagoda_operator_reconcile_duration_seconds",
            "Duration of one reconcile, by what triggered it.",
            ["trigger"],
        )
        self.autoscale_duration = Histogram(
            "pagoda_operator_autoscale_evaluation_duration_seconds",
            "Duration of one autoscaling evaluation (queries, decision, writes).",
        )
        self.desired_replicas = Gauge(
            "pagoda_operator_desired_replicas", "Replicas the autoscaler last decided.", _ISVC
        )
        self.metrics_unavailable = Counter(
            "pagoda_operator_metrics_unavailable",
            "Evaluations that held because metrics were missing or stale.",
            [*_ISVC, "reason"],
        )
        self.alerts = Counter(
            "pagoda_operator_alerts_received",
            "Requests to POST /alerts, by outcome.",
            ["outcome"],
        )
        self.families: tuple[_Family, ...] = (
            self.scale_events,
            self.reconcile_duration,
            self.autoscale_duration,
            self.desired_replicas,
            self.metrics_unavailable,
            self.alerts,
        )

    def forget(self, namespace: str, name: str) -> None:
        """Drop the per-service gauge of a service that is gone or no longer autoscaled."""
        self.desired_replicas.remove(namespace, name)

    def render(self) -> str:
        return "\n".join(line for f in self.families for line in f.render()) + "\n"

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(body=self.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/metrics", self.handle)]
