"""AsyncEngine and the HTTP layer around a fake engine core: fast, no model.

The fake produces one token per running sample per step, so streaming, abort, backpressure,
drain and a dying engine loop can be checked deterministically in milliseconds.
"""

from __future__ import annotations

import asyncio
import threading
import time

import fake_core
import httpx
import pytest
from pagoda.runtime.engine.admission import EngineUnavailableError, QueueFullError
from pagoda.runtime.engine.async_engine import AsyncEngine, RequestEvent
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.options import parse_size
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics
from prometheus_client import generate_latest


class FakeTokenizer(fake_core.FakeTokenizer):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 100 for c in text] or [1]  # (ids 98 and 99 mean nothing to this core)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages)


class FakeCore(fake_core.FakeCore):
    """`fake_core.FakeCore` on the engine thread, its prompts plain ids; `gate` (when set) must
    be open for a step to run, `crash_on_step` makes it raise, `fail_add` an add."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = FakeTokenizer()
        self.gate: threading.Event | None = None
        self.crash_on_step = False
        self.fail_add = False
        self.added: list[tuple[SamplingParams, bool]] = []  # (params, checked) as received

    def close(self) -> None:  # EngineCore's: stops a tensor-parallel group's other ranks
        self.closed = True

    def validate(self, ids, params) -> None:
        if not ids:
            raise ValueError("prompt must not be empty")
        if len(ids) >= self.max_model_len:
            raise ValueError("prompt is too long")

    def add_request(self, rid, ids, params, checked=False, bulk=False) -> None:
        self.added.append((params, checked))
        if self.fail_add:
            raise ValueError("add failed")
        self._add(rid, params)

    def step(self) -> list[StepOutput]:
        if self.gate is not None:
            self.gate.wait(5)
        if self.crash_on_step:
            raise RuntimeError("boom")
        return super().step()


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
            ([[1]], SamplingParams(), "top_p"),  # made valid, then changed (params are mutable)
        ]
        cases[-1][1].top_p = 0
        for prompts, params, field in cases:
            with pytest.raises(ParamError) as e:
                engine.add_requests(prompts, params, "x")
            assert e.value.field == field, e.value
        assert engine.num_in_flight == 0  # all-or-nothing
        engine.add_requests([[1] * 60], SamplingParams(max_tokens=19_940), "fits")  # exactly fits
        engine.add_requests([[1]], SamplingParams(max_tokens=7), "short")
        engine.add_requests([[1]], SamplingParams(max_tokens=7), "third")
        with pytest.raises(QueueFullError):
            engine.add_requests([[2]], SamplingParams(max_tokens=1), "busy")
        assert engine.num_in_flight == 3
        core.gate.set()
    finally:
        engine.stop()


async def test_params_are_copied_and_validated_once(monkeypatch):
    """Issue 40: a request's SamplingParams were validated (copied) up to three times, the
    last on the engine loop. The server's own (`check_prompts`, then `checked=True`) run as
    made; a caller's are copied once, by `add_request(s)`; the core checks neither again."""
    core = FakeCore()
    engine = await started(core)
    server, caller = SamplingParams(max_tokens=2), SamplingParams(max_tokens=2)
    made = []
    post_init = SamplingParams.__post_init__
    monkeypatch.setattr(
        SamplingParams, "__post_init__", lambda self: (made.append(self), post_init(self))[1]
    )
    try:
        engine.check_prompts(engine.info, [[1, 2]], server)
        (stream,) = engine.add_requests([[1, 2]], server, "server", checked=True)
        assert [o async for o in stream][-1].finished and made == []
        assert [o async for o in engine.add_request([1], caller)][-1].finished
        assert len(made) == 1 and made[0] is not caller  # the copy that runs
        assert core.added[1:] == [(server, True), (made[0], True)]  # after the warm-up's
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


def test_a_loading_or_draining_engines_503_spreads_its_retries():
    """Retry-After and retry-after-ms (spread over 0.5-1.5 x) as a full queue's 503 has them;
    a dead engine's names no time."""
    from pagoda.runtime.server.serving import unavailable

    err = unavailable(EngineUnavailableError("model is still loading", 2))
    assert (err.status, err.headers["Retry-After"]) == (503, "2")
    assert 1000 <= int(err.headers["retry-after-ms"]) <= 3000
    assert unavailable(EngineUnavailableError("engine loop died: x")).headers == {}


async def test_failure_from_another_thread_fails_streams_and_health_then_closes_the_core():
    """What a tensor-parallel rank's death does (`AsyncEngine.fail` from the executor's watch):
    the engine is dead at once, a stream waiting on a step fails, /health turns 503; the core
    is closed (its other ranks stopped) when the engine thread ends."""
    core = FakeCore()
    metrics = ServerMetrics("fake")
    engine = await started(core, observer=metrics)
    app = create_app(ServerConfig(model="fake"), engine, metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        core.gate = threading.Event()  # the step never runs: as if waiting on a dead rank
        stream = engine.add_request([1], SamplingParams(max_tokens=5))
        threading.Thread(target=engine.fail, args=(RuntimeError("rank 1 exited"),)).start()
        with pytest.raises(EngineUnavailableError, match="rank 1 exited"):
            [o async for o in stream]
        assert engine.dead
        assert (await client.get("/health")).status_code == 503
    core.gate.set()
    engine.stop()
    assert getattr(core, "closed", False)


def test_a_preloaded_engine_builds_before_any_loop_and_steps_on_the_same_thread():
    """`preload` (what `pagoda serve` does on the engine thread): the core is built before an
    event loop exists and stepped on the thread that built it; ready, a failed load, and a
    stop before `start` all behave as without it."""
    threads: dict[str, int] = {}
    built = threading.Event()

    class Recorded(FakeCore):
        def step(self):
            threads.setdefault("step", threading.get_ident())
            return super().step()

    def factory():
        threads["build"] = threading.get_ident()
        built.set()
        return Recorded()

    engine = AsyncEngine(factory)
    engine.preload()
    assert built.wait(5)  # no loop anywhere yet

    async def serve() -> None:
        engine.start()
        await asyncio.wait_for(engine.wait_started(), 5)
        outs = [o async for o in engine.add_request([1], SamplingParams(max_tokens=3))]
        assert outs[-1].finished and outs[-1].num_output_tokens == 3

    try:
        asyncio.run(serve())
    finally:
        engine.stop()
    assert threads["build"] == threads["step"] != threading.get_ident()

    def broken():
        raise ValueError("model file is corrupt")

    failing = AsyncEngine(broken)
    failing.preload()

    async def fails() -> None:
        failing.start()
        with pytest.raises(ValueError, match="corrupt"):
            await asyncio.wait_for(failing.wait_started(), 5)
        assert failing.dead

    asyncio.run(fails())
    unused = AsyncEngine(broken)
    unused.preload()
    unused.stop(timeout=5)  # the load failed with no loop to tell: the thread still ends
    assert not unused._thread.thread.is_alive()


def test_metrics_weighted_itl():
    m = ServerMetrics("m")
    now = time.monotonic()
    out = StepOutput("r", 0, [1], "", [], True, "stop", num_prompt_tokens=4,
                     num_output_tokens=5, arrival_time=now - 1.0, first_token_time=now - 0.4)  # fmt: skip
    m.record_events([RequestEvent(out, now - 1.0, first=False, ended=True)])
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


async def test_sequences_count_against_the_queue_and_the_per_request_cap():
    """prompts × n is what counts: one request may ask for at most half the queue (and
    --max-seqs-per-request), and multi-sequence requests leave room for single ones."""
    core = FakeCore()
    engine = await started(core, max_queue_len=16, max_seqs_per_request=100)
    core.gate = threading.Event()
    try:
        assert engine.admission.max_seqs_per_request == 8  # half the queue, whatever the flag says
        with pytest.raises(ParamError, match=r"3 prompt.* × n=3 = 9 sequences") as e:
            engine.add_requests([[1], [2], [3]], SamplingParams(n=3), "a")
        assert e.value.field == "prompt"
        with pytest.raises(ParamError) as e:
            engine.add_requests([[1]], SamplingParams(n=9), "b")
        assert e.value.field == "n"
        engine.add_requests([[1], [2]], SamplingParams(n=4, max_tokens=2), "c")  # 8
        assert engine.num_queued == 8
        engine.add_requests([[1]], SamplingParams(n=6, max_tokens=2), "d")  # 14 = 16 - reserve
        with pytest.raises(QueueFullError, match="multi-sequence requests may fill 14"):
            engine.add_requests([[1], [2]], SamplingParams(max_tokens=2), "e")
        single = engine.add_request([1], SamplingParams(max_tokens=2))  # the reserved place
        assert engine.num_queued == 15
        core.gate.set()
        assert [o async for o in single][-1].finished
        await asyncio.sleep(0.1)
        assert engine.num_queued == 0 and engine.num_in_flight == 0
    finally:
        engine.stop()


class CountingCore(FakeCore):
    """Records the order requests reach the core and the most sequences it held at once."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []
        self.most = 0

    def add_request(self, rid, ids, params, checked=False, bulk=False) -> None:
        super().add_request(rid, ids, params, checked)
        self.order.append(rid)
        self.most = max(self.most, len(self.reqs))


async def test_bulk_requests_share_the_batch_and_a_short_request_overtakes_them():
    core = CountingCore()
    engine = await started(core, max_queue_len=512, max_num_seqs=16)  # 14 slots for bulk
    try:
        a = engine.add_requests([[1]] * 40, SamplingParams(max_tokens=20), "a")
        b = engine.add_requests([[2]] * 10, SamplingParams(n=2, max_tokens=20), "b")
        await asyncio.sleep(0.01)
        assert core.most <= 14
        t0 = time.monotonic()
        short = [o async for o in engine.add_request([3], SamplingParams(max_tokens=2))]
        took = time.monotonic() - t0
        assert short[-1].finished and took < 1.0, took
        assert any(not s.finished for s in a), "the short request waited for the bulk ones"
        for s in (*a, *b):
            assert [o async for o in s][-1].finished
        assert core.most <= 15  # 14 bulk + the short one
        bulk_order = [r.rsplit("-", 1)[0] for r in core.order if r[0] in "ab"]
        assert bulk_order[:14] == ["a"] * 14  # a came first and filled the bulk slots
        turns = bulk_order[14:30]  # then a and b take turns while both wait
        assert turns.count("b") >= 6 and turns.count("a") >= 6, bulk_order
        assert engine.num_queued == 0 and engine.admission.bulk_in_core == 0
    finally:
        engine.stop()


async def test_aborting_a_waiting_bulk_prompt_never_reaches_the_core():
    core = CountingCore()
    engine = await started(core, max_num_seqs=4)  # 3 bulk slots
    core.gate = threading.Event()
    try:
        core.order.clear()  # the warm-up request
        streams = engine.add_requests([[1]] * 6, SamplingParams(max_tokens=3), "x")
        await asyncio.sleep(0.05)
        assert core.order == ["x-0", "x-1", "x-2"]  # the rest wait their turn here
        for s in streams:
            engine.abort(s.request_id)
        core.gate.set()
        await asyncio.sleep(0.1)
        assert core.order == ["x-0", "x-1", "x-2"] and sorted(core.aborted) == core.order
        assert engine.num_queued == 0 and engine.admission.bulk_in_core == 0
        assert engine.admission.num_waiting == 0
    finally:
        engine.stop()
