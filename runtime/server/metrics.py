"""Prometheus metrics named like vLLM's (`pagoda:` instead of `vllm:`) so dashboards carry over.

Cost model: the engine thread calls `record_step` once per step with host timestamps only (no
torch, no device sync). Per output it does a couple of comparisons; histogram observations happen
once per request (first token, finish), never per token. Inter-token latency is therefore
recorded per finished sample as its mean gap, weighted by its number of gaps: `_count` and
`_sum` are exact (token gaps and total decode time), the bucket split uses each request's mean.
Gauges and the engine's cumulative counters are read from one `EngineStats` snapshot per step.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Sequence

from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.options import (
    METRIC_E2E_LATENCY,
    METRIC_GENERATION_TOKENS,
    METRIC_INTER_TOKEN_LATENCY,
    METRIC_KV_CACHE_USAGE,
    METRIC_MODEL_LABEL,
    METRIC_NUM_PREEMPTIONS,
    METRIC_NUM_REQUESTS_RUNNING,
    METRIC_NUM_REQUESTS_WAITING,
    METRIC_PREFIX_CACHE_HITS,
    METRIC_PREFIX_CACHE_QUERIES,
    METRIC_PROMPT_TOKENS,
    METRIC_QUEUE_TIME,
    METRIC_REQUEST_SUCCESS,
    METRIC_TTFT,
    METRIC_TUNED_PROFILE_INFO,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

# 1 ms … 10 min: decode steps on a GPU are milliseconds, queueing under overload is minutes.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class WeightedHistogram:
    """A histogram whose `observe(value, count)` records `count` equal observations in O(log b)."""

    def __init__(self, name: str, doc: str, label: str, value: str, buckets: Sequence[float]):
        self.name, self.doc, self.label, self.value = name, doc, label, value
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self.counts[i] += count
            self.sum += value * count

    def family(self) -> HistogramMetricFamily:
        with self._lock:
            counts, total = list(self.counts), self.sum
        cumulative, acc = [], 0
        for bound, c in zip([*self.bounds, float("inf")], counts):
            acc += c
            cumulative.append((repr(bound) if bound != float("inf") else "+Inf", acc))
        fam = HistogramMetricFamily(self.name, self.doc, labels=[self.label])
        fam.add_metric([self.value], cumulative, total)
        return fam


class _EngineCollector(Collector):
    """Gauges and cumulative engine counters, read from the latest stats snapshot at scrape."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterable:
        m, s, name = self.m, self.m.last_stats, [self.m.model_name]
        gauges = {
            METRIC_NUM_REQUESTS_RUNNING: (
                "Requests in the running batch.",
                s.num_running if s else 0,
            ),
            METRIC_NUM_REQUESTS_WAITING: (
                "Requests waiting to be scheduled.",
                s.num_waiting if s else 0,
            ),
            METRIC_KV_CACHE_USAGE: ("KV-cache usage; 1 means 100 percent.", s.kv_usage if s else 0),
        }
        for key, (doc, value) in gauges.items():
            g = GaugeMetricFamily(key, doc, labels=[METRIC_MODEL_LABEL])
            g.add_metric(name, float(value))
            yield g
        counters = {
            METRIC_PREFIX_CACHE_QUERIES: (
                "Prompt tokens looked up in the prefix cache.",
                "prefix_queries",
            ),
            METRIC_PREFIX_CACHE_HITS: ("Prompt tokens found in the prefix cache.", "prefix_hits"),
            METRIC_NUM_PREEMPTIONS: (
                "Preemptions (requests evicted to recompute).",
                "num_preemptions",
            ),
        }
        for key, (doc, attr) in counters.items():
            c = CounterMetricFamily(key, doc, labels=[METRIC_MODEL_LABEL])
            c.add_metric(name, float(getattr(s, attr) if s else 0))
            yield c
        yield m.itl.family()


class ServerMetrics:
    """All metrics of one server, in their own registry (tests can run several in a process)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.model_name = model_name
        self.registry = registry or CollectorRegistry()
        self.last_stats: EngineStats | None = None
        r, lab = self.registry, [METRIC_MODEL_LABEL]

        def hist(key: str, doc: str) -> Histogram:
            h = Histogram(key, doc, lab, registry=r, buckets=LATENCY_BUCKETS)
            return h.labels(model_name)

        self.ttft = hist(METRIC_TTFT, "Time from arrival to the first token.")
        self.e2e = hist(METRIC_E2E_LATENCY, "Time from arrival to the last token.")
        self.queue = hist(METRIC_QUEUE_TIME, "Time from arrival to first scheduling.")
        self.itl = WeightedHistogram(
            METRIC_INTER_TOKEN_LATENCY,
            "Time between output tokens (per-sample mean, weighted by its gaps).",
            METRIC_MODEL_LABEL,
            model_name,
            LATENCY_BUCKETS,
        )
        self.prompt_tokens = Counter(
            METRIC_PROMPT_TOKENS, "Prompt tokens processed.", lab, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            METRIC_GENERATION_TOKENS, "Tokens generated.", lab, registry=r
        ).labels(model_name)
        success = Counter(
            METRIC_REQUEST_SUCCESS,
            "Finished requests by finish reason.",
            [*lab, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(model_name, reason) for reason in FINISH_REASONS}
        r.register(_EngineCollector(self))

    def set_tuned_profile(self, device: str, model: str, created: str) -> None:
        """Expose the tuned profile in use: an info gauge (absent when serving on defaults)."""
        info = Gauge(
            METRIC_TUNED_PROFILE_INFO,
            "Tuned profile in use (from `pagoda tune`), by device, model and creation time.",
            ["device", "model", "created"],
            registry=self.registry,
        )
        info.labels(device, model, created).set(1)

    def record_step(self, outputs: Sequence[StepOutput], stats: EngineStats | None) -> None:
        """Engine thread, once per step: request-level events only (first token, finish)."""
        if stats is not None:
            self.last_stats = stats
        now = time.monotonic()
        for o in outputs:
            if o.num_output_tokens == 1 and o.index == 0:
                first = o.first_token_time or now
                self.ttft.observe(first - o.arrival_time)
                self.queue.observe((o.first_scheduled_time or first) - o.arrival_time)
                self.prompt_tokens.inc(o.num_prompt_tokens)
            if o.finished:
                self._finish_sample(o, now)

    def _finish_sample(self, o: StepOutput, now: float) -> None:
        n = o.num_output_tokens
        self.generation_tokens.inc(n)
        if n > 1 and o.first_token_time is not None:
            self.itl.observe((now - o.first_token_time) / (n - 1), n - 1)
        if o.index == 0:
            self.e2e.observe(now - o.arrival_time)
            self.success[o.finish_reason or "abort"].inc()

    def record_abort(self, arrival_time: float, tokens_per_sample: Sequence[int]) -> None:
        """A request aborted by its client (or by drain): count what it had generated."""
        self.generation_tokens.inc(sum(tokens_per_sample))
        self.e2e.observe(time.monotonic() - arrival_time)
        self.success["abort"].inc()
