"""Request-level metrics against a fake core (fast, deterministic): what /metrics counts per
request must match what its client got, whatever the order of finishes, aborts and late outputs.
(The same against a real server: test_concurrency_metrics.py.)"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import httpx
import prometheus_client
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.outputs import EngineStats
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.server.metrics import ServerMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_async_engine import FakeCore


def scrape(m: ServerMetrics) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def successes(m: dict[str, float]) -> dict[str, float]:
    reasons = ("stop", "length", "abort")
    return {r: m[f"pagoda:request_success_total{{finished_reason={r}}}"] for r in reasons}


class UnevenCore(FakeCore):
    """Sample i of a request makes `lengths[i]` tokens (FakeCore's: all max_tokens)."""

    lengths = (2, 1000)

    def add_request(self, rid, ids, params, checked=False, bulk=False) -> None:
        super().add_request(rid, ids, params, checked)
        for i in range(params.n):
            self.reqs[f"{rid}#{i}"]["left"] = self.lengths[i]


async def started(core: FakeCore, metrics: ServerMetrics, **kw) -> AsyncEngine:
    engine = AsyncEngine(lambda: core, observer=metrics, **kw)
    metrics.watch_admission(engine.admission)
    engine.start()
    await asyncio.wait_for(engine.wait_started(), 5)
    return engine


async def test_a_request_of_n_samples_counts_once_when_its_last_sample_ends():
    """n=2, sample 0 done after 2 tokens, sample 1 aborted later: one request (abort), one
    e2e observation, and the tokens of both samples (sample 1's were lost)."""
    core, m = UnevenCore(), ServerMetrics("fake")
    engine = await started(core, m)
    try:
        stream = engine.add_request([1, 2, 3], SamplingParams(n=2, max_tokens=1000))
        async for out in stream:
            if out.index == 1 and out.num_output_tokens >= 5:
                break
        tokens = list(stream.tokens)
        engine.abort(stream.request_id)
        after = scrape(m)
    finally:
        engine.stop()
    assert tokens[0] == 2 and stream.done[0]
    assert successes(after) == {"stop": 0, "length": 0, "abort": 1}
    assert after["pagoda:e2e_request_latency_seconds_count"] == 1
    assert after["pagoda:time_to_first_token_seconds_count"] == 1
    assert after["pagoda:prompt_tokens_total"] == 3
    assert after["pagoda:request_params_n_count"] == 1  # once per request, its n
    assert after["pagoda:request_params_n_sum"] == 2
    assert after["pagoda:generation_tokens_total"] == sum(tokens)


async def test_outputs_that_arrive_after_an_abort_are_not_counted_again():
    """The engine finished a request; before that output reached its stream, the client went
    away. One request, counted once (as the abort its client saw), not as both."""
    core, m = FakeCore(), ServerMetrics("fake")
    engine = await started(core, m)
    try:
        stream = engine.add_request([1, 2, 3], SamplingParams(max_tokens=1))
        time.sleep(0.3)  # the event loop is blocked: the engine thread steps, the output waits
        assert not core.reqs and not stream.finished
        engine.abort(stream.request_id)
        await asyncio.sleep(0.1)  # the late output is dispatched now (to nobody)
        after = scrape(m)
    finally:
        engine.stop()
    assert successes(after) == {"stop": 0, "length": 0, "abort": 1}
    assert after["pagoda:e2e_request_latency_seconds_count"] == 1
    assert after["pagoda:generation_tokens_total"] == 0  # its client got none


class StatsCore(FakeCore):
    """Waiting sequences as a real core reports them: those added and not stepped yet."""

    def stats(self) -> EngineStats:
        waiting = sum(r["out"] == 0 for r in self.reqs.values())
        return EngineStats(len(self.reqs) - waiting, waiting, 0.0, 10, 10, 0, 0, 0)


async def test_prompts_held_back_for_their_turn_wait_in_the_gauge_and_the_ttft():
    """A bulk request's prompts wait in admission for a share of the batch: they are waiting
    requests (the autoscaler's queue depth) and their time to first token counts from when the
    request arrived, not from when the core got them."""
    core, m = StatsCore(), ServerMetrics("fake")
    engine = await started(core, m, max_num_seqs=2)  # bulk requests share 1 slot of 2
    core.gate = threading.Event()
    try:
        streams = engine.add_requests([[1], [2], [3], [4]], SamplingParams(max_tokens=2), "bulk")
        await asyncio.sleep(0.1)
        during = scrape(m)
        await asyncio.sleep(0.2)
        core.gate.set()
        for s in streams:
            assert [o async for o in s][-1].finished
        await asyncio.sleep(0.05)
        after = scrape(m)
    finally:
        engine.stop()
    assert during["pagoda:num_requests_waiting"] >= 3  # the core has one (running or waiting)
    assert after["pagoda:num_requests_waiting"] == 0
    assert after["pagoda:time_to_first_token_seconds_count"] == 4
    # every prompt waited ≥ 0.3 s for its first token (the gate), held back or not
    assert after["pagoda:time_to_first_token_seconds_sum"] >= 4 * 0.3
    assert after["pagoda:request_queue_time_seconds_sum"] >= 4 * 0.3


def documented_series() -> dict[str, tuple[str, set[str]]]:
    """docs/runtime.md's metrics table and docs/structured-outputs.md's: name → (type, labels)."""
    root = Path(__file__).resolve().parents[2]
    rows = {}
    for doc, section in (("runtime.md", "## Metrics"), ("structured-outputs.md", "## Metrics")):
        text = (root / "docs" / doc).read_text().split(section, 1)[1].split("\n## ", 1)[0]
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            names = re.findall(r"`(pagoda:[a-z0-9_]+)`", cells[0]) if len(cells) >= 3 else []
            types = re.findall(r"\b(counter|gauge|histogram)\b", cells[1]) if names else []
            labels = (
                set(re.findall(r"`([a-z_]+)`", re.split("[:;]", cells[2])[0])) if names else set()
            )
            for name, kind in zip(names, types * len(names) if len(types) == 1 else types):
                rows[name] = (kind, labels)
    return rows


def test_every_documented_series_is_exported_with_its_type_and_labels():
    from pagoda.runtime.server.structured_outputs import StructuredOutputs
    from pagoda.runtime.structured.params import StructuredOutputsParams

    prometheus_client.enable_created_metrics()  # the library's default: ServerMetrics turns it off
    m = ServerMetrics("m")
    m.set_tuned_profile("cpu", "m", "2026-01-01T00:00:00Z")
    # an engine with speculative decoding exports its counters too
    m.last_stats = EngineStats(1, 0, 0.1, 10, 9, 0, 0, 0, 3, 9, 4, [3, 1, 0])
    m.last_stats.lora_running, m.last_stats.max_lora = ["sql"], 2  # and one with --enable-lora
    m.last_stats.mm_encoder_cache = True  # and a vision model's encoder cache
    so = StructuredOutputs("m", m.registry, cache_bytes=1 << 20, timeout_s=1.0)
    so.count(StructuredOutputsParams(regex="a"))
    so.compile_seconds.labels("m", "regex").observe(0.1)
    exported = {}
    text = generate_latest(m.registry).decode()
    assert "_created" not in text  # no creation-time series (noise; vLLM has none either)
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels = {k for s in fam.samples for k in s.labels} - {"model_name", "le"}
        exported[name] = (fam.type, labels)
    documented = documented_series()
    assert len(documented) >= 16
    for name, (kind, labels) in documented.items():
        assert name in exported, f"{name} is documented, not exported"
        assert exported[name][0] == kind, name
        assert exported[name][1] == labels, name
    assert set(exported) <= set(documented), "exported, not documented"


async def test_time_to_first_token_counts_the_grammar_compile(monkeypatch):
    """As vLLM's: the clock starts once the request is parsed and tokenized, so a structured
    request's grammar compile (seconds for a cold schema) is in its time to first token."""
    from pagoda.runtime.server.api import create_app
    from pagoda.runtime.server.config import ServerConfig
    from pagoda.runtime.server.structured_outputs import StructuredOutputs

    async def slow_compile(self, info, spec):
        await asyncio.sleep(0.3)
        return spec

    monkeypatch.setattr(StructuredOutputs, "compile", slow_compile)
    core, m = FakeCore(), ServerMetrics("fake")
    engine = await started(core, m)
    app = create_app(ServerConfig(model="fake"), engine, m)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"prompt": "hey", "max_tokens": 2, "structured_outputs": {"regex": "[ab]+"}}
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
        after = scrape(m)
    finally:
        engine.stop()
    assert after["pagoda:time_to_first_token_seconds_count"] == 1
    assert after["pagoda:time_to_first_token_seconds_sum"] >= 0.3
    assert after["pagoda:e2e_request_latency_seconds_sum"] >= 0.3
