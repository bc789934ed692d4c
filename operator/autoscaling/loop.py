"""The autoscaler's I/O shell: every interval, Prometheus → policy.decide() → Deployment replicas.

Per InferenceService with `spec.autoscaling`: read the metrics (outside any lock, they may be
slow), then under the per-object lock the reconciler also takes, read the Deployment, decide,
patch `spec.replicas` (with a resourceVersion precondition, so a concurrent writer wins and we
retry next interval), post an Event per scale, and write `status.autoscaling` and the
`MetricsUnavailable` condition only when they changed (the writes: writes.py). Alert-driven steps (alerts.py) go through
the same lock and history. The history, the learned correction, the burst floor's samples and the
last scale up live in memory and go with each status write into `status.autoscaling.state`
(memory.py), which the replica that takes over (or a restarted operator) reads back at its first
evaluation of the service: a failover neither restarts the scale-down window nor the burst floor.
Without a readable state the history is seeded with the current count (a scale down waits a full
window). A service's first traffic is kept in `status.autoscaling.trafficSince`, so a restart does
not make an old service young again (the burst floor's young-service margin, bursts.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagoda.operator.autoscaling import memory
from pagoda.operator.autoscaling.bursts import Bursts
from pagoda.operator.autoscaling.policy import (
    Decision,
    History,
    Metrics,
    Policy,
    alert_step,
    decide,
)
from pagoda.operator.autoscaling.prometheus import (
    MetricsUnavailable,
    PrometheusSource,
    url_allowed,
)
from pagoda.operator.autoscaling.writes import (
    CONDITION,
    Writes,
    autoscaling_status,
    traffic_since,
    wall_iso,
)
from pagoda.operator.autotune.mount import tuned_rates
from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.operator.kube.locks import object_lock
from pagoda.operator.kube.names import API_VERSION, KIND, owned_by, workload_name
from pagoda.operator.spec import status as status_mod
from pagoda.operator.spec import validation
from pagoda.operator.spec.fields import SpecError

if TYPE_CHECKING:
    from pagoda.operator.autoscaling.alerts import ScaleUpRequest
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.spec.inference_service import InferenceServiceSpec
    from pagoda.operator.web.metrics import OperatorMetrics

log = logging.getLogger(__name__)


@dataclass
class _State:
    """Per InferenceService, in memory: recommendations and the last scale up (monotonic s)."""

    history: History
    correction: float = 1.0  # the demand floor's learned capacity correction
    bursts: Bursts = field(default_factory=Bursts)  # the burst floor's memory
    last_scale_up: float | None = None
    last_reason: str | None = None
    raised: tuple[float, float] | None = None  # the correction's last rise (memory.last_rise)
    where: tuple[str, str] = ("", "")  # (namespace, name): its gauge goes when the service does

    def saved(self) -> memory.Memory:
        return memory.Memory(
            self.history, self.correction, self.bursts, self.last_scale_up, self.raised
        )


def next_tick(wall_s: float, interval_s: float, after: float | None = None) -> float:
    """The evaluations' grid, the same for every replica: the first multiple of `interval_s`
    since the epoch at or after `wall_s` (wall-clock s) and later than `after` (the last one
    evaluated)."""
    if interval_s <= 0:
        return wall_s
    tick = math.ceil(wall_s / interval_s - 1e-9) * interval_s
    while after is not None and tick <= after + 1e-3:
        tick += interval_s
    return tick


class Autoscaler:
    def __init__(
        self,
        api: KubeApi,
        config: OperatorConfig,
        metrics: OperatorMetrics,
        *,
        source: PrometheusSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.config = config
        self.metrics = metrics
        self.source = source or PrometheusSource(
            timeout_s=config.prometheus_timeout_s, ttft_window=config.ttft_window
        )
        self.clock, self.wall = clock, wall
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._offset = wall() - clock()  # monotonic → wall seconds (_wall_offset)
        self._states: dict[str, _State] = {}
        self.writes = Writes(api, config, metrics)

    async def close(self) -> None:
        await self.source.close()

    def _wall_offset(self) -> float:
        """Wall-clock minus monotonic seconds, for the saved state's times: kept while the two
        clocks agree within a second (the saved times stay put, no write for jitter), renewed
        when the wall clock was stepped."""
        offset = self.wall() - self.clock()
        if abs(offset - self._offset) > 1.0:
            self._offset = offset
        return self._offset

    def forget_all(self) -> None:
        """Start afresh, as after a restart (a replica that becomes the active one again): each
        service's state is read back from its status at its next evaluation."""
        self._states.clear()

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, logger: logging.Logger = log) -> None:
        """Evaluate every InferenceService each `autoscale_interval_s` until cancelled, at the
        wall clock's multiples of the interval (`next_tick`): every replica evaluates on the same
        grid, so one that takes over evaluates when the one it replaces would have, and the saved
        evaluation is the one an interval before (memory.load)."""
        last: float | None = None
        while True:
            wall = self.wall()
            last = next_tick(wall, self.config.autoscale_interval_s, last)
            tick = self.clock() + (last - wall)  # the tick on the loop's clock
            if last > wall:
                await self.sleep(last - wall)
            try:
                await self.evaluate_all(logger, now=tick)
            except Exception:  # never let one bad pass end autoscaling for every service
                logger.exception("Autoscaler pass failed (next pass in one interval)")

    async def evaluate_all(self, logger: logging.Logger = log, now: float | None = None) -> None:
        """One pass; `now`: the pass's tick on `clock` (None: the time of each decision)."""
        try:
            bodies = await self.api.list_all(KIND, self.config.namespaces)
        except ApiError as e:
            logger.warning("Autoscaler could not list %s objects: %s", KIND, e)
            return
        metas = [b.get("metadata") or {} for b in bodies]
        live = {m.get("uid") for m in metas}
        names = {(m.get("namespace"), m.get("name")) for m in metas}
        for uid in set(self._states) - live:  # deleted (or re-created under a new uid)
            gone = self._states.pop(uid)
            if gone.where not in names:
                self.metrics.forget(*gone.where)
        limit = asyncio.Semaphore(8)

        async def one(body: dict[str, Any]) -> None:
            meta = body.get("metadata") or {}
            async with limit:
                started = time.perf_counter()
                try:
                    await self.evaluate(body, logger, now)
                except ApiError as e:
                    logger.warning(
                        "Autoscaling %s/%s: API call failed (next interval retries): %s",
                        meta.get("namespace"), meta.get("name"), e,
                    )  # fmt: skip
                except Exception:  # a bug or an answer nobody foresaw: this service only
                    logger.exception(
                        "Autoscaling %s/%s failed (replicas unchanged; next interval retries)",
                        meta.get("namespace"), meta.get("name"),
                    )  # fmt: skip
                finally:
                    self.metrics.autoscale_duration.observe(time.perf_counter() - started)

        await asyncio.gather(*(one(b) for b in bodies))

    # --- one evaluation ---------------------------------------------------------------------

    def _policy(self, spec: InferenceServiceSpec) -> Policy:
        assert spec.autoscaling is not None
        return Policy.from_spec(spec.autoscaling, max_metric_age_s=self.config.metrics_max_age_s)

    def _parse(self, body: Mapping[str, Any]) -> InferenceServiceSpec | None:
        try:
            return validation.parse(body, self.config)
        except SpecError:
            return None  # the reconciler reports it; keep the replicas as they are

    async def evaluate(
        self, body: Mapping[str, Any], logger: logging.Logger = log, now: float | None = None
    ) -> Decision | None:
        """One evaluation of one InferenceService; returns the decision (None: nothing to do).
        `now`: its time on `clock` (the pass's tick; None: when it decides)."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        spec = self._parse(body)
        if spec is None:
            return None
        if spec.autoscaling is None:
            await self._switch_off(body)
            return None
        v_p, v_d = await tuned_rates(self.api, body, spec)  # the predictive floors' V_P, V_D
        metrics, why = await self._read_metrics(
            spec, ns, name, prompt_len=v_p is not None, demand=None not in (v_p, v_d)
        )
        async with object_lock(uid):
            fresh = await self.api.get(KIND, ns, name)
            if fresh is None or fresh["metadata"].get("uid") != uid:
                return None  # deleted while the metrics were read
            if fresh["metadata"].get("generation") != meta.get("generation"):
                spec = self._parse(fresh)  # edited meanwhile: the bounds of now, not of then
                if spec is None or spec.autoscaling is None:
                    return None  # the next evaluation reports it or switches off
            policy = dataclasses.replace(
                self._policy(spec), prefill_tokens_per_s=v_p, decode_tokens_per_s=v_d
            )
            deploy = await self.api.get(
                spec.workload_kind, ns, workload_name(spec.workload_kind, name)
            )
            if not owned_by(deploy, uid):
                return None  # the reconciler has not created the Deployment yet
            assert deploy is not None
            return await self._decide_and_apply(policy, fresh, deploy, metrics, why, logger, now)

    async def _switch_off(self, body: Mapping[str, Any]) -> None:
        """No `spec.autoscaling` (any more): forget the state, drop what the autoscaler wrote."""
        meta = body["metadata"]
        self._states.pop(meta["uid"], None)
        self.metrics.forget(meta["namespace"], meta["name"])
        st = body.get("status") or {}
        if st.get("autoscaling") is not None or status_mod.condition(body, CONDITION):
            async with object_lock(meta["uid"]):
                await self.writes.clear_status(meta["namespace"], meta["name"], meta["uid"])

    async def _read_metrics(
        self,
        spec: InferenceServiceSpec,
        ns: str,
        name: str,
        *,
        prompt_len: bool = False,
        demand: bool = False,
    ) -> tuple[Metrics | None, tuple[str, str]]:
        """The reading (outside any lock: it may be slow), or None and (reason, message)."""
        assert spec.autoscaling is not None
        url = spec.autoscaling.prometheus_url or self.config.prometheus_url
        why = (
            "NoPrometheusURL",
            "no Prometheus URL (--prometheus-url or spec.autoscaling.prometheusURL)",
        )
        if not url:
            return None, why
        spec_url = spec.autoscaling.prometheus_url
        if spec_url and not url_allowed(spec_url, self.config.prometheus_url_prefixes):
            return None, (
                "PrometheusURLNotAllowed",
                "spec.autoscaling.prometheusURL is not under the operator's allowed Prometheus "
                "URLs (--allowed-prometheus-url; default: its --prometheus-url)",
            )
        try:
            return await self.source.fetch(url, ns, name, prompt_len=prompt_len, demand=demand), why
        except MetricsUnavailable as e:
            return None, (e.reason, e.message)

    async def _decide_and_apply(
        self,
        policy: Policy,
        fresh: Mapping[str, Any],
        deploy: Mapping[str, Any],
        metrics: Metrics | None,
        why: tuple[str, str],
        logger: logging.Logger,
        tick: float | None = None,
    ) -> Decision:
        """Decide, scale, log and write status (the object's lock held). `tick`: the pass's time
        (the decision is recorded at it, so the windows run on the shared grid whatever the
        metrics read took), never before what the history already holds (an alert step)."""
        ns, name = fresh["metadata"]["namespace"], fresh["metadata"]["name"]
        current = int((deploy.get("spec") or {}).get("replicas") or 0)
        ready = int((deploy.get("status") or {}).get("readyReplicas") or 0)
        now = self.clock() if tick is None else tick
        state = self._state(fresh, now, current, policy)
        now = max(now, state.history[-1][0]) if state.history else now
        decision = decide(
            policy, metrics, current=current, ready=ready, history=state.history, now=now,
            unavailable=f"{why[0]}: {why[1]}", correction=state.correction, bursts=state.bursts,
        )  # fmt: skip
        state.raised = memory.last_rise(state.raised, state.correction, decision.correction, now)
        state.history, state.correction = decision.history, decision.correction
        state.bursts = decision.bursts
        unavailable = None
        if decision.reason == "MetricsUnavailable":
            unavailable = why if metrics is None else ("StaleMetrics", decision.message)
            self.metrics.metrics_unavailable.labels(ns, name, unavailable[0]).inc()
        scaled = None
        if decision.replicas != current:
            text = f"{decision.reason}: {decision.message}"
            if not await self.writes.scale(
                fresh, deploy, current, decision.replicas, text, "metrics"
            ):
                return decision
            scaled = (text, "metrics")
            if decision.replicas > current:
                state.last_scale_up = now
        self.metrics.desired_replicas.labels(ns, name).set(decision.replicas)
        level = logging.INFO if scaled or decision.reason != state.last_reason else logging.DEBUG
        state.last_reason = decision.reason
        logger.log(
            level, "Autoscale %s/%s: %d (%d ready) -> %d: %s: %s",
            ns, name, current, ready, decision.replicas, decision.reason, decision.message,
        )  # fmt: skip
        await self._write_status(fresh, decision, metrics, ready, scaled, unavailable, state)
        return decision

    def _state(self, body: Mapping[str, Any], now: float, current: int, policy: Policy) -> _State:
        """This service's state; a new one (first sight: a restart, a failover) is read back from
        `status.autoscaling.state` (memory.py), else starts afresh from the current count; both
        keep the first traffic the status recorded."""
        uid = body["metadata"]["uid"]
        if uid not in self._states:
            auto = (body.get("status") or {}).get("autoscaling") or {}
            since = traffic_since(auto, now, self.wall())
            where = (body["metadata"]["namespace"], body["metadata"]["name"])
            saved = memory.load(
                auto.get("state"), now=now, offset=self._wall_offset(), current=current, policy=policy,
                since=since, interval_s=self.config.autoscale_interval_s,
            )  # fmt: skip
            if saved is None:
                saved = memory.Memory(history=((now, current),), bursts=Bursts(since=since))
            else:
                log.info(
                    "Autoscaling %s/%s: state restored from its status (%d recommendations, "
                    "%d burst samples).", *where, len(saved.history), len(saved.bursts.samples),
                )  # fmt: skip
            self._states[uid] = _State(
                history=saved.history, correction=saved.correction, bursts=saved.bursts,
                last_scale_up=saved.last_scale_up, raised=saved.raised, where=where,
            )  # fmt: skip
        return self._states[uid]

    async def alert_scale_up(self, req: ScaleUpRequest, logger: logging.Logger = log) -> str:
        """One step up for a firing alert; returns the outcome (CamelCase) for the webhook reply."""
        if not self.config.clusterwide and req.namespace not in self.config.namespaces:
            return "NamespaceNotServed"
        first = await self.api.get(KIND, req.namespace, req.name)
        if first is None:
            return "NotFound"
        uid = first["metadata"]["uid"]
        async with object_lock(uid):  # read again under it: the bounds of now (the lock may wait)
            body = await self.api.get(KIND, req.namespace, req.name)
            if body is None or body["metadata"].get("uid") != uid:
                return "NotFound"
            body.setdefault("apiVersion", API_VERSION)
            body.setdefault("kind", KIND)
            spec = self._parse(body)
            if spec is None:
                return "InvalidSpec"
            if spec.autoscaling is None:
                return "AutoscalingDisabled"
            policy = self._policy(spec)
            deploy = await self.api.get(
                spec.workload_kind, req.namespace, workload_name(spec.workload_kind, req.name)
            )
            if not owned_by(deploy, uid):
                return "NoDeployment"
            assert deploy is not None
            current = int((deploy.get("spec") or {}).get("replicas") or 0)
            ready = int((deploy.get("status") or {}).get("readyReplicas") or 0)
            now = self.clock()
            state = self._state(body, now, current, policy)
            if (
                state.last_scale_up is not None
                and now - state.last_scale_up < self.config.alert_cooldown_s
            ):
                return "Cooldown"
            if ready < current:
                return "ReplicasStarting"
            decision = alert_step(policy, current=current, history=state.history, now=now)
            state.history = decision.history
            if decision.replicas <= current:
                return "AtMaxReplicas"
            text = f"AlertFiring: {req.alertname or 'alert'} fired; {decision.message}"
            if not await self.writes.scale(body, deploy, current, decision.replicas, text, "alert"):
                return "Conflict"
            state.last_scale_up = now
            self.metrics.desired_replicas.labels(req.namespace, req.name).set(decision.replicas)
            logger.info("Autoscale %s/%s: %s", req.namespace, req.name, text)
            await self._write_status(body, decision, None, ready, (text, "alert"), None, state)
            return "ScaledUp"

    async def _write_status(
        self,
        fresh: Mapping[str, Any],
        decision: Decision,
        metrics: Metrics | None,
        ready: int,
        scaled: tuple[str, str] | None,
        unavailable: tuple[str, str] | None,
        state: _State,
    ) -> None:
        """status.autoscaling with the state (memory.dump) and the first traffic in wall-clock
        time, and MetricsUnavailable, written where they changed (lock held)."""
        since = state.bursts.since
        since_iso = None if since is None else wall_iso(self.wall() - (self.clock() - since))
        saved = memory.dump(state.saved(), self._wall_offset())
        old = (fresh.get("status") or {}).get("autoscaling")
        new_auto = autoscaling_status(old, decision, metrics, ready, scaled, since_iso, saved)
        await self.writes.status(fresh, new_auto, scaled, unavailable)
