"""What the autoscaler writes to the cluster, each under the InferenceService's lock (loop.py
takes it): the workload's `spec.replicas` (with a resourceVersion precondition: a concurrent
writer wins, the next interval retries) and an Event per scale; `status.autoscaling` (built
whole by `autoscaling_status`, pure, and patched only where it changed) with the
`MetricsUnavailable` condition and its Warning Event; and, once autoscaling is switched off, the
removal of both. `status.autoscaling.trafficSince` is written and read back in the wall clock's
Kubernetes timestamps (`wall_iso`, `traffic_since`).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.operator.kube.names import KIND, now_iso
from pagoda.operator.spec import status as status_mod

if TYPE_CHECKING:
    from pagoda.operator.autoscaling.policy import Decision, Metrics
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.web.metrics import OperatorMetrics

CONDITION = "MetricsUnavailable"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # Kubernetes' timestamps (names.now_iso)


def wall_iso(wall_s: float) -> str:
    return datetime.datetime.fromtimestamp(wall_s, datetime.timezone.utc).strftime(TIME_FORMAT)


def traffic_since(auto: Mapping[str, Any] | None, now: float, wall: float) -> float | None:
    """`status.autoscaling.trafficSince` on the loop's clock (`now`, when the wall clock reads
    `wall`); None when absent or unreadable (the service is then young from its next traffic)."""
    raw = (auto or {}).get("trafficSince")
    try:
        then = datetime.datetime.strptime(str(raw), TIME_FORMAT)
    except ValueError:
        return None
    age = wall - then.replace(tzinfo=datetime.timezone.utc).timestamp()
    return now - max(0.0, age)


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def autoscaling_status(
    old: Mapping[str, Any] | None,
    decision: Decision,
    metrics: Metrics | None,
    ready: int,
    scaled: tuple[str, str] | None = None,
    since_iso: str | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole `status.autoscaling` after a decision (pure). `scaled`: (reason, source);
    `since_iso`: the first traffic, written once (a restart reads it back); `state`: the
    autoscaler's memory (memory.dump)."""
    new = dict(old or {})
    if state is not None:
        new["state"] = state
    if since_iso is not None and not new.get("trafficSince"):
        new["trafficSince"] = since_iso
    new["desiredReplicas"] = decision.replicas
    new["reason"] = decision.reason
    if decision.recommendation is not None:
        new["recommendation"] = decision.recommendation
    if metrics is not None:  # metrics seen last; kept while unavailable (the condition says so)
        seen = {
            "ttftP95Seconds": _r(metrics.ttft_p95_s, 3),
            "queuePerReplica": _r(decision.queue_per_replica, 2),
            "kvCacheUsage": _r(metrics.kv_cache_usage, 3),
            "ratio": _r(decision.ratio, 2),
            "readyReplicas": ready,
        }
        new["metrics"] = {k: v for k, v in seen.items() if v is not None}
    if scaled is not None:
        new["lastScaleTime"] = now_iso()
        new["lastScaleReason"] = scaled[0][:1024]
        new["lastScaleSource"] = scaled[1]
    return new


class Writes:
    """The autoscaler's writes through `api`, counted in `metrics` (the caller holds the lock)."""

    def __init__(self, api: KubeApi, config: OperatorConfig, metrics: OperatorMetrics) -> None:
        self.api, self.config, self.metrics = api, config, metrics

    async def scale(
        self,
        body: Mapping[str, Any],
        deploy: Mapping[str, Any],
        current: int,
        replicas: int,
        reason: str,
        source: str,
    ) -> bool:
        """Patch the Deployment's replicas; False if it changed under us (409)."""
        meta = deploy["metadata"]
        patch: dict[str, Any] = {"spec": {"replicas": replicas}}
        if meta.get("resourceVersion"):
            patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        try:
            await self.api.patch(
                deploy.get("kind") or "Deployment", meta["namespace"], meta["name"], patch
            )
        except ApiError as e:
            if e.status == 409:
                return False
            raise
        direction = "up" if replicas > current else "down"
        self.metrics.scale_events.labels(meta["namespace"], meta["name"], direction, source).inc()
        message = f"Scaled {direction} from {current} to {replicas} replicas ({source}): {reason}"
        await self.api.try_post_event(
            body, type_="Normal", reason=f"Scaled{direction.capitalize()}", message=message,
            component=self.config.component_name,
        )  # fmt: skip
        return True

    async def status(
        self,
        fresh: Mapping[str, Any],
        new_auto: dict[str, Any],
        scaled: tuple[str, str] | None,
        unavailable: tuple[str, str] | None,
    ) -> None:
        """Patch status.autoscaling to `new_auto` (`autoscaling_status`'s) and MetricsUnavailable
        where they changed."""
        meta = fresh["metadata"]
        old = fresh.get("status") or {}
        patch: dict[str, Any] = {}
        if new_auto != old.get("autoscaling"):  # what changed, and null what went
            patch["autoscaling"] = status_mod.merge_diff(old.get("autoscaling"), new_auto)
        if scaled is None or scaled[1] == "metrics":  # alerts say nothing about availability
            was = status_mod.condition(fresh, CONDITION)
            conditions = status_mod.with_condition(
                old.get("conditions"), CONDITION, unavailable is not None,
                *(unavailable or ("MetricsAvailable", "")), meta.get("generation"),
            )  # fmt: skip
            if conditions != old.get("conditions"):
                patch["conditions"] = conditions
            if unavailable is not None and was.get("status") != "True":
                await self.api.try_post_event(
                    fresh, type_="Warning", reason=CONDITION,
                    message=f"{unavailable[0]}: {unavailable[1]}; holding the replicas",
                    component=self.config.component_name,
                )  # fmt: skip
        if patch:
            await self.api.patch(
                KIND, meta["namespace"], meta["name"], {"status": patch}, subresource="status"
            )

    async def clear_status(self, ns: str, name: str, uid: str) -> None:
        """Autoscaling was switched off: drop what the autoscaler wrote."""
        fresh = await self.api.get(KIND, ns, name)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            return
        st = fresh.get("status") or {}
        patch: dict[str, Any] = {}
        if st.get("autoscaling") is not None:
            patch["autoscaling"] = None
        if status_mod.condition(fresh, CONDITION):
            patch["conditions"] = status_mod.without_condition(st.get("conditions"), CONDITION)
        if patch:
            await self.api.patch(KIND, ns, name, {"status": patch}, subresource="status")
