"""AsyncEngine and the HTTP layer around a fake engine core: fast, no model.

The fake produces one token per running sample per step, so streaming, abort, backpressure,
drain and a dying engine loop can be checked deterministically in milliseconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from pagoda.runtime.engine.async_engine import AsyncEngine, EngineUnavailableError, QueueFullError
from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.options import parse_size
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics
from prometheus_client import generate_latest


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 100 for c in text] or [1]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)

    def token_to_str(self, i: int) -> str:
        return chr(97 + i % 26)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages)


class FakeCore:
    """EngineCore's interface; `gate` (when set) must be open for a step to run."""

    max_model_len = 20_000
    model_config = SimpleNamespace(vocab_size=100)

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake"
        self.reqs: dict[str, dict] = {}
        self.aborted: list[str] = []
        self.gate: threading.Event | None = None
        self.crash_on_step = False
        self.fail_add = False

    def validate(self, ids, params) -> None:
        if not ids:
            raise ValueError("prompt must not be empty")
        if len(ids) >= self.max_model_len:
            raise ValueError("prompt is too long")

    def add_request(self, rid, ids, params) -> None:
        if self.fail_add:
            raise ValueError("add failed")
        for i in range(params.n):
            self.reqs[f"{rid}#{i}"] = {"rid": rid, "i": i, "left": params.max_tokens, "out": 0}

    def abort_request(self, rid) -> None:
        self.aborted.append(rid)
        for key in [k for k, r in self.reqs.items() if r["rid"] == rid]:
            del self.reqs[key]

    def has_unfinished_requests(self) -> bool:
        return bool(self.reqs)

    def step(self) -> list[StepOutput]:
        if self.gate is not None:
            self.gate.wait(5)
        if self.crash_on_step:
            raise RuntimeError("boom")
        now, outs = time.monotonic(), []
        for key, r in list(self.reqs.items()):
            r["left"] -= 1
            r["out"] += 1
            done = r["left"] == 0
            outs.append(self._output(r, done, now))
            if done:
                del self.reqs[key]
        time.sleep(0.002)
        return outs

    @staticmethod
    def _output(r: dict, done: bool, now: float) -> StepOutput:
        return StepOutput(
            r["rid"],
            r["i"],
            [r["out"]],
            "x",
            [],
            done,
            "length" if done else None,
            num_prompt_tokens=3,
            num_output_tokens=r["out"],
            arrival_time=now,
            first_scheduled_time=now,
            first_token_time=now,
        )

    def stats(self) -> EngineStats:
        return EngineStats(len(self.reqs), 0, 0.0, 10, 10, 0, 0, 0)

    def check_integrity(self) -> None:
        pass


async def started(core: FakeCore, **kw) -> AsyncEngine:
    engine = AsyncEngine(lambda: core, **kw)
    engine.start()
    await asyncio.wait_for(engine.wait_started(), 5)
    return engine


async def test_stream_n2_and_abort():
    core = FakeCore()
    engine = await started(core)
    try:
        outs = [o async for o in engine.add_request([1, 2], SamplingParams(n=2, max_tokens=3))]
        assert sorted((o.index, o.num_output_tokens) for o in outs if o.finished) == [
            (0, 3),
            (1, 3),
        ]
        core.gate = threading.Event()
        stream = engine.add_request([1], SamplingParams(max_tokens=50))
        core.gate.set()
        first = await anext(stream)
        assert first.num_output_tokens == 1
        engine.abort(stream.request_id)
        rest = [o async for o in stream]
        assert rest[-1].finish_reason == "abort"
        await asyncio.sleep(0.05)
        assert stream.request_id in core.aborted and not core.reqs
    finally:
        engine.stop()


async def test_queue_full_and_bad_input():
    core = FakeCore()
    engine = await started(core, max_queue_len=2)
    core.gate = threading.Event()
    try:
        a = engine.add_request([1], SamplingParams(max_tokens=2))
        engine.add_request([1], SamplingParams(max_tokens=2))
        with pytest.raises(QueueFullError):
            engine.add_request([1], SamplingParams(max_tokens=2))
        with pytest.raises(ParamError, match="maximum context length is 20000") as e:
            engine.add_request([1] * 20_000, SamplingParams())
        assert e.value.field == "prompt"
        core.gate.set()
        assert [o async for o in a][-1].finished
    finally:
        engine.stop()


async def test_one_validation_path_with_the_field_as_data():
    core = FakeCore()
    engine = await started(core, max_queue_len=3)
    core.gate = threading.Event()
    try:
        info = engine.info
        assert (info.max_model_len, info.vocab_size, info.model_name) == (20_000, 100, "fake")
        cases = [
            ([[1] * 60], SamplingParams(max_tokens=19_941), "max_tokens"),  # > 20000: no capping
            ([[]], SamplingParams(), "prompt"),
            ([[1, 100]], SamplingParams(), "prompt"),  # outside the vocabulary
            ([[1]] * 4, SamplingParams(), "prompt"),  # a batch that can never be queued
        ]
        for prompts, params, field in cases:
            with pytest.raises(ParamError) as e:
                engine.add_requests(prompts, params, "x")
            assert e.value.field == field, e.value
        assert engine.num_in_flight == 0  # all-or-nothing
        engine.add_requests([[1] * 60], SamplingParams(max_tokens=19_940), "fits")  # exactly fits
        engine.add_requests([[1]], SamplingParams(max_tokens=7), "short")
        with pytest.raises(QueueFullError):
            engine.add_requests([[1], [2]], SamplingParams(max_tokens=1), "busy")
        assert engine.num_in_flight == 2
        core.gate.set()
    finally:
        engine.stop()


async def test_failed_add_fails_only_that_request():
    core = FakeCore()
    engine = await started(core)
    try:
        core.fail_add = True
        bad = engine.add_request([1], SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match="add failed"):
            [o async for o in bad]
        core.fail_add = False
        good = [o async for o in engine.add_request([1], SamplingParams(max_tokens=2))]
        assert good[-1].finished and engine.alive
    finally:
        engine.stop()


async def test_drain_finishes_then_aborts_at_deadline():
    core = FakeCore()
    engine = await started(core)
    try:
        short = engine.add_request([1], SamplingParams(max_tokens=3))
        core.gate = threading.Event()
        long = engine.add_request([1], SamplingParams(max_tokens=10_000))
        drain = asyncio.ensure_future(engine.drain(0.3))
        await asyncio.sleep(0)
        with pytest.raises(EngineUnavailableError):
            engine.add_request([1], SamplingParams())
        core.gate.set()
        assert [o async for o in short][-1].finish_reason == "length"
        assert await drain == 1
        assert [o async for o in long][-1].finish_reason == "abort"
    finally:
        engine.stop()


async def test_dead_loop_fails_streams_and_health():
    core = FakeCore()
    metrics = ServerMetrics("fake")
    engine = await started(core, observer=metrics)
    app = create_app(ServerConfig(model="fake"), engine, metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        r = await client.post("/v1/completions", json={"prompt": "hey", "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2
        core.crash_on_step = True
        stream = engine.add_request([1], SamplingParams(max_tokens=5))
        with pytest.raises(EngineUnavailableError):
            [o async for o in stream]
        assert engine.dead
        assert (await client.get("/health")).status_code == 503
        assert (await client.get("/ready")).status_code == 503
        r = await client.post("/v1/completions", json={"prompt": "hey"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
    text = generate_latest(metrics.registry).decode()
    assert 'pagoda:time_to_first_token_seconds_count{model_name="fake"} 1.0' in text
    assert 'pagoda:generation_tokens_total{model_name="fake"} 2.0' in text


def test_metrics_weighted_itl():
    m = ServerMetrics("m")
    now = time.monotonic()
    out = StepOutput("r", 0, [1], "", [], True, "stop", num_prompt_tokens=4,
                     num_output_tokens=5, arrival_time=now - 1.0, first_token_time=now - 0.4)  # fmt: skip
    m.record_step([out], None)
    text = generate_latest(m.registry).decode()
    assert 'pagoda:inter_token_latency_seconds_count{model_name="m"} 4.0' in text
    assert 'pagoda:request_success_total{finished_reason="stop",model_name="m"} 1.0' in text
    assert 'pagoda:generation_tokens_total{model_name="m"} 5.0' in text


def test_server_config_validation():
    assert parse_size("96MiB") == 96 << 20 and parse_size("2G") == 2 << 30
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError, match="kv_cache_memory"):
        parse_size("lots")
    with pytest.raises(ValueError, match="max_queue_len"):
        ServerConfig(max_queue_len=0)
    with pytest.raises(ValueError, match="port"):
        ServerConfig(port=70000)
    assert ServerConfig(model="m").served_model_name == "m"
