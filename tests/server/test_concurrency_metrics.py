"""64 concurrent streaming clients (a quarter hang up midway), then the block pool must be intact
with no leaked block; /metrics must expose every series with values that match the traffic."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
NUM_CLIENTS, NUM_DISCONNECT = 64, 16
HISTOGRAMS = [
    "pagoda:time_to_first_token_seconds",
    "pagoda:inter_token_latency_seconds",
    "pagoda:e2e_request_latency_seconds",
    "pagoda:request_queue_time_seconds",
]
GAUGES = [
    "pagoda:num_requests_running",
    "pagoda:num_requests_waiting",
    "pagoda:kv_cache_usage_perc",
]
COUNTERS = [
    "pagoda:prefix_cache_queries_total",
    "pagoda:prefix_cache_hits_total",
    "pagoda:num_preemptions_total",
    "pagoda:prompt_tokens_total",
    "pagoda:generation_tokens_total",
    "pagoda:request_success_total",
]


def scrape(base: str) -> dict[str, float]:
    """Flat sample map: 'name{label=value,...}' → value (model_name label dropped)."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def idle_engine(client: httpx.AsyncClient, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = await client.get("/debug/engine")
        assert r.status_code == 200, r.text
        d = r.json()
        s = d["stats"]
        if d["in_flight"] == 0 and s["num_running"] == 0 and s["num_waiting"] == 0:
            return d
        assert time.monotonic() < deadline, f"engine never went idle: {d}"
        await asyncio.sleep(0.1)


async def one_client(client: httpx.AsyncClient, i: int) -> dict | None:
    chat = i % 2 == 0
    hang_up = i < NUM_DISCONNECT
    body = {"model": MODEL, "max_tokens": 400 if hang_up else 6, "ignore_eos": True,
            "temperature": 0.8, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if chat:
        body["messages"] = [
            {"role": "user", "content": f"Client {i}: " + "tell me more " * (i % 5)}
        ]
    else:
        body["prompt"] = f"Client {i} writes: " + "and then " * (i % 7)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    events = []
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            events.append(line[6:])
            if hang_up and len(events) >= 3:
                return None  # leaving the block closes the connection midway
    return {"chat": chat, "events": events}


def check_stream(result: dict) -> None:
    events = result["events"]
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [json.loads(e) for e in events[:-1]]
    kind = "chat.completion.chunk" if result["chat"] else "text_completion"
    assert {c["object"] for c in chunks} == {kind} and len({c["id"] for c in chunks}) == 1
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 6
    body = chunks[:-1]
    assert all(c["usage"] is None for c in body)
    finishes = [c["choices"][0]["finish_reason"] for c in body]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    if result["chat"]:
        assert body[0]["choices"][0]["delta"]["role"] == "assistant"


async def test_64_streaming_clients_some_disconnecting(server):
    before = scrape(server.base)
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 8)
    async with httpx.AsyncClient(base_url=server.base, timeout=180, limits=limits) as client:
        results = await asyncio.gather(*(one_client(client, i) for i in range(NUM_CLIENTS)))
        done = [r for r in results if r is not None]
        assert len(done) == NUM_CLIENTS - NUM_DISCONNECT
        for r in done:
            check_stream(r)
        state = await idle_engine(client, timeout=10)  # hung-up requests were aborted, not run
    assert state["integrity"] == "ok"
    assert state["stats"]["num_free_blocks"] == state["stats"]["num_blocks"], state
    after = scrape(server.base)
    aborted = "pagoda:request_success_total{finished_reason=abort}"
    assert after[aborted] - before.get(aborted, 0) == NUM_DISCONNECT


def test_metrics_after_traffic(server):
    before = scrape(server.base)
    prompt = "Serving large language models borrowed the same idea from virtual memory pages. " * 2
    usage = []
    with httpx.Client(base_url=server.base, timeout=60) as c:
        for stop in (None, None, ["\n"]):
            r = c.post("/v1/completions",
                       json={"prompt": prompt, "max_tokens": 5, "temperature": 0, "stop": stop})  # fmt: skip
            assert r.status_code == 200
            usage.append(r.json()["usage"])
    after = scrape(server.base)
    for name in HISTOGRAMS:
        for suffix in ("_count", "_sum"):
            assert name + suffix in after, name
        assert f"{name}_bucket{{le=+Inf}}" in after
    for name in GAUGES + COUNTERS[:-1]:
        assert name in after, name

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta("pagoda:time_to_first_token_seconds_count") == 3
    assert delta("pagoda:request_queue_time_seconds_count") == 3
    assert delta("pagoda:e2e_request_latency_seconds_count") == 3
    assert 0 < delta("pagoda:time_to_first_token_seconds_sum") < 60
    assert delta("pagoda:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage)
    assert delta("pagoda:generation_tokens_total") == sum(u["completion_tokens"] for u in usage)
    gaps = sum(u["completion_tokens"] - 1 for u in usage)
    assert delta("pagoda:inter_token_latency_seconds_count") == gaps
    finished = sum(delta(f"pagoda:request_success_total{{finished_reason={r}}}")
                   for r in ("stop", "length"))  # fmt: skip
    assert finished == 3
    assert delta("pagoda:prefix_cache_hits_total") > 0  # the same prompt, three times
    assert delta("pagoda:prefix_cache_queries_total") >= delta("pagoda:prefix_cache_hits_total")
    assert after["pagoda:num_requests_running"] == 0 and after["pagoda:num_requests_waiting"] == 0
    assert 0 <= after["pagoda:kv_cache_usage_perc"] <= 1
    assert after["pagoda:num_preemptions_total"] >= 0


async def test_non_streaming_client_that_hangs_up_is_aborted(server):
    before = scrape(server.base)
    body = {"model": MODEL, "prompt": "A long story:", "max_tokens": 400, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.base, timeout=1.0) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post("/v1/completions", json=body)
    async with httpx.AsyncClient(base_url=server.base, timeout=30) as client:
        state = await idle_engine(client, timeout=5)  # 400 tokens would take far longer
    assert state["stats"]["num_free_blocks"] == state["stats"]["num_blocks"]
    aborted = "pagoda:request_success_total{finished_reason=abort}"
    assert scrape(server.base)[aborted] - before.get(aborted, 0) == 1
