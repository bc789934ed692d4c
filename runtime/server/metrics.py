"""Prometheus metrics named like vLLM's (`pagoda:` instead of `vllm:`) so dashboards carry over.

What counts once per request (a prompt; its `n` samples together): the time to first token, the
queue time, the prompt tokens and `request_params_n` (its `n`) at its first output, of any sample; the end-to-end latency and
`request_success{finished_reason}` when its last sample ends (the reason of that sample), or when
it is aborted (`abort`). Times count from when the server had parsed and tokenized the request
(`Job.arrival_time`, as vLLM's), so its grammar compile and a bulk request's prompts held back
for their turn at the batch (`admission.py`) are in them. Generation
tokens and inter-token gaps count per sample when it ends, or at the abort for what it had made.
An output that reaches the server after its request was aborted is not counted again.

Cost model: `AsyncEngine` hands over, once per step on the event loop, only the outputs that mean
something to a request (its first, a sample's last), with host timestamps only (no torch, no
device sync); histogram observations happen once per request, never per token. Inter-token
latency is therefore recorded per finished sample as its mean gap, weighted by its number of
gaps: `_count` and `_sum` are exact (token gaps and total decode time), the bucket split uses
each sample's mean. The gauges `num_requests_running`/`num_requests_waiting` count the engine's
sequences (a request with `n` samples is `n` of them, as vLLM's children are): the mean of
`request_params_n` converts them to requests (the operator's demand floor does). Gauges and the engine's cumulative counters are read from the latest
`EngineStats` snapshot (one per step) at scrape time.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from pagoda.runtime.engine.outputs import EngineStats
from pagoda.runtime.options import (
    METRIC_E2E_LATENCY,
    METRIC_GENERATION_TOKENS,
    METRIC_INTER_TOKEN_LATENCY,
    METRIC_KV_CACHE_USAGE,
    METRIC_LORA_REQUESTS_INFO,
    METRIC_MM_ENCODER_CACHE_HITS,
    METRIC_MM_ENCODER_CACHE_QUERIES,
    METRIC_MODEL_LABEL,
    METRIC_NUM_PREEMPTIONS,
    METRIC_NUM_REQUESTS_RUNNING,
    METRIC_NUM_REQUESTS_WAITING,
    METRIC_PREFIX_CACHE_HITS,
    METRIC_PREFIX_CACHE_QUERIES,
    METRIC_PROMPT_TOKENS,
    METRIC_QUEUE_TIME,
    METRIC_REQUEST_PARAMS_N,
    METRIC_REQUEST_SUCCESS,
    METRIC_SPEC_ACCEPTED_PER_POS,
    METRIC_SPEC_NUM_ACCEPTED_TOKENS,
    METRIC_SPEC_NUM_DRAFT_TOKENS,
    METRIC_SPEC_NUM_DRAFTS,
    METRIC_TTFT,
    METRIC_TUNED_PROFILE_INFO,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pagoda.runtime.engine.admission import Admission
    from pagoda.runtime.engine.async_engine import RequestEvent

# 1 ms … 10 min: decode steps on a GPU are milliseconds, queueing under overload is minutes.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")  # error: non-finite logits
N_BUCKETS = (1, 2, 5, 10, 20)  # vLLM's for request_params_n


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


SPEC_COUNTERS = {
    METRIC_SPEC_NUM_DRAFTS: ("Decode steps of a sequence that carried drafts.", "spec_num_drafts"),
    METRIC_SPEC_NUM_DRAFT_TOKENS: ("Draft tokens proposed.", "spec_num_draft_tokens"),
    METRIC_SPEC_NUM_ACCEPTED_TOKENS: ("Draft tokens accepted.", "spec_num_accepted_tokens"),
}

MM_ENCODER_COUNTERS = {
    METRIC_MM_ENCODER_CACHE_QUERIES: (
        "Images a step reached, looked up in the encoder cache.",
        "mm_encoder_cache_queries",
    ),
    METRIC_MM_ENCODER_CACHE_HITS: (
        "Images found in the encoder cache (encoded for another request, or earlier).",
        "mm_encoder_cache_hits",
    ),
}


class _EngineCollector(Collector):
    """Gauges and cumulative engine counters, read from the latest stats snapshot at scrape."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterable:
        m, s, name = self.m, self.m.last_stats, [self.m.model_name]
        gauges = {
            METRIC_NUM_REQUESTS_RUNNING: (
                "Sequences in the running batch (a request with n samples counts n).",
                s.num_running if s else 0,
            ),
            METRIC_NUM_REQUESTS_WAITING: (
                "Sequences waiting to be scheduled (with those held back for their turn).",
                (s.num_waiting if s else 0) + m.held_back(),
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
        if s is not None and s.spec_accepted_per_pos:  # speculative decoding is on
            counters.update(SPEC_COUNTERS)
        if s is not None and s.mm_encoder_cache:  # a vision model
            counters.update(MM_ENCODER_COUNTERS)
        for key, (doc, attr) in counters.items():
            c = CounterMetricFamily(key, doc, labels=[METRIC_MODEL_LABEL])
            c.add_metric(name, float(getattr(s, attr) if s else 0))
            yield c
        if s is not None and s.spec_accepted_per_pos:
            c = CounterMetricFamily(
                METRIC_SPEC_ACCEPTED_PER_POS,
                "Draft tokens accepted, by their position in the step's drafts.",
                labels=[METRIC_MODEL_LABEL, "position"],
            )
            for pos, n in enumerate(s.spec_accepted_per_pos):
                c.add_metric([*name, str(pos)], float(n))
            yield c
        if s is not None and s.max_lora:  # --enable-lora: vLLM's lora_requests_info
            g = GaugeMetricFamily(
                METRIC_LORA_REQUESTS_INFO,
                "LoRA adapters of the running and waiting requests (comma-separated names); "
                "the value is the time of the scrape, as vLLM's.",
                labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
            )
            labels = [",".join(s.lora_running), ",".join(s.lora_waiting), str(s.max_lora)]
            g.add_metric(labels, time.time())
            yield g
        yield m.itl.family()


class ServerMetrics:
    """All metrics of one server, in their own registry (tests can run several in a process)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        # no `*_created` series (a creation time per counter and histogram child): noise to
        # most users, and vLLM leaves them out too; prometheus_client's switch is per process
        disable_created_metrics()
        self.model_name = model_name
        self.registry = registry or CollectorRegistry()
        self.last_stats: EngineStats | None = None
        self._admission: Admission | None = None
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
        self.params_n = Histogram(
            METRIC_REQUEST_PARAMS_N,
            "Samples (n) per request, at its first output.",
            lab,
            registry=r,
            buckets=N_BUCKETS,
        ).labels(model_name)
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

    def watch_admission(self, admission: Admission) -> None:
        """Count the sequences `admission` holds back for their turn as waiting (read at scrape,
        on the event loop, which owns `admission`)."""
        self._admission = admission

    def held_back(self) -> int:
        return 0 if self._admission is None else self._admission.num_waiting_seqs

    def record_stats(self, stats: EngineStats) -> None:
        """Once per step (engine thread, or the event loop): the gauges' latest snapshot."""
        self.last_stats = stats

    def record_events(self, events: Sequence[RequestEvent]) -> None:
        """Event loop, once per step: requests' first outputs, finished samples and requests."""
        now = time.monotonic()
        for e in events:
            o = e.output
            if e.first:
                first = o.first_token_time or now  # the engine's clock: `time.monotonic` too
                self.ttft.observe(max(first - e.arrival_time, 0.0))
                scheduled = o.first_scheduled_time or first
                self.queue.observe(max(scheduled - e.arrival_time, 0.0))
                self.prompt_tokens.inc(o.num_prompt_tokens)
                self.params_n.observe(e.n)
            if o.finished:
                n = o.num_output_tokens
                self.generation_tokens.inc(n)
                if n > 1 and o.first_token_time is not None:
                    self.itl.observe((now - o.first_token_time) / (n - 1), n - 1)
            if e.ended:
                self.e2e.observe(now - e.arrival_time)
                self.success[o.finish_reason or "abort"].inc()

    def record_abort(self, arrival_time: float, tokens_per_sample: Sequence[int]) -> None:
        """A request aborted by its client (or by drain): count what its unfinished samples had
        generated (its finished ones were counted as they finished), and its end."""
        self.generation_tokens.inc(sum(tokens_per_sample))
        self.e2e.observe(time.monotonic() - arrival_time)
        self.success["abort"].inc()
