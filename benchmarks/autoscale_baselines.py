"""The autoscalers Pagoda is compared with, each with the knobs its users set.

All four run kube-controller-manager's HPA algorithm (pkg/controller/podautoscaler): the replica
calculator with its 10 % tolerance, the `behavior` stabilization windows (up: the lowest
recommendation of the window, down: the highest) and the scale-up/down rate policies over their
periods. They differ in the metric:

* **HPA/KEDA on p95 TTFT** (llm-d, production-stack): KEDA's Prometheus trigger on
  `histogram_quantile(0.95, sum by (le) (rate(pagoda:time_to_first_token_seconds_bucket[1m])))`
  with `metricType: Value`: desired = ⌈current × p95 / threshold⌉;
* **HPA on KV-cache usage** (AIBrix): a Pods metric, `pagoda:kv_cache_usage_perc` averaged over
  the pods (`AverageValue`);
* **HPA on queue depth**: a Pods metric, `pagoda:num_requests_waiting` per pod;
* **KEDA's Prometheus trigger, scale to zero**: `sum(pagoda:num_requests_running +
  pagoda:num_requests_waiting)` (requests in flight, the gateway's queue included) per replica
  (`AverageValue`), with KEDA's activation: `minReplicaCount` 0 or 1, `activationThreshold`,
  polled every `pollingInterval`; idle for `cooldownPeriod` → `minReplicaCount`; from 0 → 1 at the
  first poll above the activation threshold, the HPA taking over from 1.

Pods metrics follow the HPA's rule for pods without metrics (starting replicas): counted as 0
when scaling up and as on target when scaling down.
"""

from __future__ import annotations

import abc
import math
from collections import deque
from dataclasses import dataclass, replace

from autoscale_engine import Observation


@dataclass(frozen=True)
class Behavior:
    """An HPA's `behavior` (defaults: Kubernetes' own)."""

    up_window_s: float = 0.0
    up_percent: float = 100.0  # per up_period_s
    up_pods: int = 4  # per up_period_s; selectPolicy Max of the two
    up_period_s: float = 15.0
    down_window_s: float = 300.0
    down_percent: float = 100.0  # per down_period_s
    down_period_s: float = 15.0
    tolerance: float = 0.1

    def label(self) -> str:
        up = f"up {self.up_percent:g}%/{self.up_pods} pods per {self.up_period_s:g}s"
        if self.up_window_s:
            up += f", window {self.up_window_s:g}s"
        down = (
            f"down {self.down_percent:g}%/{self.down_period_s:g}s, window {self.down_window_s:g}s"
        )
        return f"{up}; {down}"


UP = {"default": Behavior(), "fast": Behavior(up_percent=900.0, up_pods=10)}
DOWN = {
    "default": {},
    "slow": {"down_percent": 10.0, "down_period_s": 60.0},
}


def behaviors(down_windows=(60.0, 300.0, 600.0)) -> list[Behavior]:
    """The behaviour grid: default or fast scale up × scale-down windows × down policies."""
    return [
        replace(up, down_window_s=w, **down)
        for up in UP.values()
        for w in down_windows
        for down in DOWN.values()
    ]


class Hpa(abc.ABC):
    """The HPA's replica calculator and behaviour; subclasses give the metric."""

    kind = "HPA"

    def __init__(self, target: float, behavior: Behavior, lo: int, hi: int) -> None:
        self.target, self.b, self.lo, self.hi = target, behavior, lo, hi
        self.recs: deque[tuple[float, int]] = deque()
        self.events: deque[tuple[float, int]] = deque()  # (time, replica change)

    def label(self) -> str:
        return f"target {self.target:g}; {self.b.label()}"

    # --- the metric: (raw recommendation) ---------------------------------------------------

    @abc.abstractmethod
    def recommend(self, o: Observation) -> int:
        """The calculator's raw recommendation from this baseline's metric."""

    def _pods_metric(self, o: Observation, total: float) -> int:
        """Pods metric, AverageValue `target`: `total` is the sum over the ready pods."""
        current, ready = o.current, o.ready
        if ready == 0:
            return current
        missing = current - ready
        ratio = total / (ready * self.target) if self.target > 0 else math.inf
        if not missing:
            if abs(ratio - 1.0) <= self.b.tolerance:
                return current
            return math.ceil(ratio * ready - 1e-9)
        fill = self.target if ratio < 1.0 else 0.0  # missing pods: on target down, 0 up
        new = (total + missing * fill) / (current * self.target)
        if abs(new - 1.0) <= self.b.tolerance or (new > 1) != (ratio > 1):
            return current
        rec = math.ceil(new * current - 1e-9)
        if (new < 1.0 and rec > current) or (new > 1.0 and rec < current):
            return current
        return rec

    def _external_value(self, current: int, value: float) -> int:
        """External metric, `metricType: Value`: desired = ⌈current × value / target⌉."""
        ratio = value / self.target
        if abs(ratio - 1.0) <= self.b.tolerance:
            return current
        return math.ceil(ratio * current - 1e-9)

    def _external_average(self, current: int, value: float) -> int:
        """External metric, `metricType: AverageValue`: desired = ⌈value / target⌉."""
        ratio = value / (self.target * max(current, 1))
        if abs(ratio - 1.0) <= self.b.tolerance:
            return current
        return math.ceil(value / self.target - 1e-9)

    # --- behaviour ----------------------------------------------------------------------------

    def desired(self, o: Observation, now: float) -> int:
        current = o.current
        rec = max(self.lo, min(self.hi, self.recommend(o)))
        b = self.b
        self.recs.append((now, rec))
        keep = max(b.up_window_s, b.down_window_s)
        while self.recs and now - self.recs[0][0] > keep:
            self.recs.popleft()
        up = min(r for t, r in self.recs if now - t <= b.up_window_s)
        down = max(r for t, r in self.recs if now - t <= b.down_window_s)
        want = up if up > current else down if down < current else current
        if want > current:
            start = current - self._changed(now, b.up_period_s, up=True)
            limit = max(math.ceil(start * (1 + b.up_percent / 100)), start + b.up_pods)
            want = min(want, limit)
        elif want < current:
            start = current - self._changed(now, b.down_period_s, up=False)
            want = max(want, int(start * (1 - b.down_percent / 100)))
        want = max(self.lo, min(self.hi, want))
        if want != current:
            self.events.append((now, want - current))
        return want

    def _changed(self, now: float, period: float, up: bool) -> int:
        while self.events and now - self.events[0][0] > 600:
            self.events.popleft()
        return sum(d for t, d in self.events if now - t < period and (d > 0) == up)


class HpaTtft(Hpa):
    name = "KEDA/HPA on p95 TTFT"

    def recommend(self, o: Observation) -> int:
        value = o.ttft_p95_s if o.ttft_p95_s is not None else 0.0  # KEDA: null → 0
        return self._external_value(o.current, value) if o.current else 1


class HpaKv(Hpa):
    name = "HPA on KV-cache usage (AIBrix)"

    def recommend(self, o: Observation) -> int:
        return self._pods_metric(o, (o.kv_mean or 0.0) * o.ready)


class HpaQueue(Hpa):
    name = "HPA on queue depth"

    def recommend(self, o: Observation) -> int:
        return self._pods_metric(o, float(o.waiting))


class Keda(Hpa):
    """KEDA's Prometheus trigger on requests in flight, scale-to-zero capable."""

    name = "KEDA Prometheus (in flight, scale to zero)"

    def __init__(
        self,
        target: float,
        behavior: Behavior,
        lo: int,
        hi: int,
        *,
        min_replicas: int = 0,
        activation: float = 0.0,
        cooldown_s: float = 300.0,
        polling_s: float = 30.0,
    ) -> None:
        super().__init__(target, behavior, max(1, min_replicas), hi)
        self.min_replicas, self.activation = min_replicas, activation
        self.cooldown_s, self.polling_s = cooldown_s, polling_s
        self.last_active = 0.0
        self.last_poll = -math.inf

    def label(self) -> str:
        return (
            f"threshold {self.target:g}/replica, min {self.min_replicas}, activation "
            f"{self.activation:g}, cooldown {self.cooldown_s:g}s, polling {self.polling_s:g}s; "
            f"{self.b.label()}"
        )

    def recommend(self, o: Observation) -> int:
        return self._external_average(o.current, float(o.waiting + o.running))

    def desired(self, o: Observation, now: float) -> int:
        in_flight = o.waiting + o.running
        if now - self.last_poll >= self.polling_s - 1e-9:  # KEDA's own loop: activation
            self.last_poll = now
            if in_flight > self.activation:
                self.last_active = now
            if o.current == 0:
                return 1 if in_flight > self.activation else 0
            if self.min_replicas == 0 and now - self.last_active >= self.cooldown_s:
                self.recs.clear()
                return 0
        if o.current == 0:
            return 0  # the HPA is paused at zero; only KEDA's poll activates
        return super().desired(o, now)
