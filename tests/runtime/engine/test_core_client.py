"""The engine core in its own process (`core_proc.py`, `core_client.py`) behind AsyncEngine:
streaming, abort, a refused request, calls, a loop that dies and a process that is killed.

The core is `fake_core.FakeCore` (tests/runtime/fake_core.py; no model): each test spawns one
engine process (about a second, most of it the child's imports).
"""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import signal

import pytest
from fake_core import FakeCore, aborted
from pagoda.runtime.engine.admission import EngineUnavailableError
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core_client import EngineDeadError, EngineProcClient
from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.engine.request_stream import RequestStream
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.sampling.params import SamplingParams


class Observer:
    def __init__(self) -> None:
        self.steps = 0
        self.tokens = 0
        self.stats: EngineStats | None = None

    def record_stats(self, stats) -> None:
        self.steps += 1
        self.stats = stats

    def record_events(self, events) -> None:
        self.tokens += sum(e.output.num_output_tokens for e in events if e.output.finished)

    def record_abort(self, arrival_time, tokens_per_sample) -> None:
        pass


async def started(**kw) -> AsyncEngine:
    factory = functools.partial(FakeCore, **kw.pop("core", {}))
    engine = AsyncEngine(factory, engine_process=True, **kw)
    engine.start()
    await asyncio.wait_for(engine.wait_started(), 60)
    return engine


async def test_streams_abort_and_calls_cross_the_process():
    obs = Observer()
    engine = await started(observer=obs)
    try:
        assert engine.ready and engine.alive and not engine.dead
        assert engine.info.model_name == "fake" and engine.info.vocab_size == 100
        outs = [o async for o in engine.add_request([1, 2], SamplingParams(n=2, max_tokens=3))]
        finals = sorted((o.index, o.num_output_tokens) for o in outs if o.finished)
        assert finals == [(0, 3), (1, 3)]
        assert sum(len(o.new_token_ids) for o in outs) == 6  # coalesced or not, every token
        assert obs.tokens == 6 and obs.stats is not None

        stream = engine.add_request([1], SamplingParams(max_tokens=10_000))
        first = await anext(stream)
        assert first.num_output_tokens >= 1
        engine.abort(stream.request_id)
        rest = [o async for o in stream]
        assert rest[-1].finish_reason == "abort"
        for _ in range(100):  # the abort reaches the core with the next message
            if stream.request_id in await engine.run_in_engine(aborted):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the abort never reached the engine process")
        assert (await engine.check_integrity())["stats"]["num_running"] == 0
        with pytest.raises(TypeError, match="cannot send"):
            await engine.run_in_engine(lambda core: core)  # a lambda does not pickle
    finally:
        engine.stop()
    assert not engine.dead  # asked to stop: not a death


async def test_a_refused_request_fails_alone():
    engine = await started()
    try:
        bad = engine.add_request([99, 1], SamplingParams(max_tokens=3))
        good = engine.add_request([1, 1], SamplingParams(max_tokens=3))
        with pytest.raises(ValueError, match="refused by the core"):
            [o async for o in bad]
        outs = [o async for o in good]
        assert outs[-1].finished and outs[-1].num_output_tokens == 3
        assert engine.alive and engine.num_in_flight == 0
    finally:
        engine.stop()


async def test_a_dying_loop_fails_every_stream():
    engine = await started()
    try:
        long = engine.add_request([1], SamplingParams(max_tokens=10_000))
        await anext(long)
        engine.add_request([98], SamplingParams(max_tokens=3))  # the step raises
        with pytest.raises(EngineUnavailableError, match="boom"):
            [o async for o in long]
        assert engine.dead and isinstance(engine.error, RuntimeError)
        with pytest.raises(EngineUnavailableError):
            engine.add_request([1], SamplingParams(max_tokens=3))
    finally:
        engine.stop()


async def test_a_killed_process_is_seen_at_once():
    engine = await started()
    try:
        stream = engine.add_request([1], SamplingParams(max_tokens=10_000))
        await anext(stream)
        os.kill(engine._client.proc.pid, signal.SIGKILL)
        with pytest.raises(EngineUnavailableError, match="exited with code -9"):
            [o async for o in stream]
        assert engine.dead and isinstance(engine.error, EngineDeadError)
    finally:
        engine.stop()


async def test_a_load_failure_reaches_wait_started():
    engine = AsyncEngine(functools.partial(FakeCore, fail_load=True), engine_process=True)
    engine.start()
    try:
        with pytest.raises(ValueError, match="corrupt"):
            await asyncio.wait_for(engine.wait_started(), 60)
        assert engine.dead and not engine.ready
    finally:
        engine.stop()


async def test_a_factory_sent_early_loads_before_start_and_only_once(tmp_path):
    """`pagoda serve` hands the factory over right after its checks (`load`), so the core
    builds while the API process builds its app; `start` then sends nothing more."""
    mark = tmp_path / "built"
    factory = functools.partial(FakeCore, mark=str(mark))
    client = EngineProcClient().spawn()
    engine = None
    try:
        client.load(factory)
        for _ in range(600):  # built with no AsyncEngine started yet
            if mark.exists():
                break
            await asyncio.sleep(0.05)
        assert mark.read_text() == "built\n"
        sent, send = [], client._tx.send
        client._tx.send = lambda data, *a: (sent.extend(pickle.loads(data)), send(data, *a))
        engine = AsyncEngine(factory, engine_process=True, engine_client=client)
        engine.start()
        await asyncio.wait_for(engine.wait_started(), 60)
        outs = [o async for o in engine.add_request([1], SamplingParams(max_tokens=2))]
        assert outs[-1].finished and outs[-1].num_output_tokens == 2
        assert mark.read_text() == "built\n"
        assert [c[0] for c in sent if c[0] == "load"] == []  # start sent no second factory
    finally:
        if engine is not None:
            engine.stop()
        else:
            client.stop()


async def test_a_tokenizer_loaded_here_is_not_sent_back_by_the_engine():
    """`load(factory, tokenizer=...)` (what `pagoda serve` does): this process builds its own
    tokenizer while the engine loads, and the engine's ready message leaves its own out (it
    could not even pickle here); without `tokenizer=` that same core cannot report ready."""
    from fake_core import FakeTokenizer

    factory = functools.partial(FakeCore, local_tokenizer=True)
    mine = FakeTokenizer()
    client = EngineProcClient().spawn()
    client.load(factory, tokenizer=lambda: mine)
    engine = AsyncEngine(factory, engine_process=True, engine_client=client)
    engine.start()
    try:
        await asyncio.wait_for(engine.wait_started(), 60)
        assert engine.info.tokenizer is mine and engine.info.vocab_size == 100
        outs = [o async for o in engine.add_request([1], SamplingParams(max_tokens=2))]
        assert outs[-1].finished
    finally:
        engine.stop()
    engine = AsyncEngine(factory, engine_process=True)  # the engine's tokenizer must cross
    engine.start()
    try:
        with pytest.raises(TypeError, match="does not leave its process"):
            await asyncio.wait_for(engine.wait_started(), 60)
    finally:
        engine.stop()


async def test_a_tokenizer_that_failed_here_makes_the_engine_dead_at_ready():
    """Same file, same code: the engine's load would fail too. Should it not, ready without a
    tokenizer on this side is a dead engine with the reason, never a server that cannot
    tokenize."""

    def broken():
        raise OSError("tokenizer.json: read error")

    factory = functools.partial(FakeCore)
    client = EngineProcClient().spawn()
    client.load(factory, tokenizer=broken)
    engine = AsyncEngine(factory, engine_process=True, engine_client=client)
    engine.start()
    try:
        with pytest.raises(RuntimeError, match=r"no tokenizer: tokenizer\.json: read error"):
            await asyncio.wait_for(engine.wait_started(), 60)
        assert engine.dead and not engine.ready
    finally:
        engine.stop()


async def test_a_slow_reader_gets_pending_tokens_as_one_delta():
    stream = RequestStream("r", 1)
    for k in range(1, 4):
        stream._put(StepOutput("r", 0, [k], f"t{k}", [], k == 3, "length" if k == 3 else None,
                               num_output_tokens=k, first_token_time=1.0))  # fmt: skip
    outs = [o async for o in stream]
    assert len(outs) == 1
    o = outs[0]
    assert o.new_token_ids == [1, 2, 3] and o.new_text == "t1t2t3"
    assert o.finished and o.finish_reason == "length" and o.num_output_tokens == 3


async def test_a_reader_of_the_whole_result_wakes_once_with_every_delta_merged():
    stream = RequestStream("r", 1)
    stream.wake_at_end = True
    got: list[StepOutput] = []

    async def read():
        got.extend([o async for o in stream])

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0)  # the reader waits for its first delta
    lp = TokenLogprob(2, -0.5, [])
    for k in range(1, 4):
        stream._put(StepOutput("r", 0, [k], f"t{k}", [lp] if k == 2 else [], False,
                               num_prompt_tokens=7 if k == 1 else 0, num_output_tokens=k,
                               first_token_time=None if k == 1 else float(k)))  # fmt: skip
        await asyncio.sleep(0)
        assert not got and not reader.done()  # not woken per step
    stream._put(StepOutput("r", 0, [4], "t4", [], True, "stop", num_output_tokens=4))
    await asyncio.wait_for(reader, 5)
    assert len(got) == 1
    o = got[0]
    assert o.new_token_ids == [1, 2, 3, 4] and o.new_text == "t1t2t3t4" and o.new_logprobs == [lp]
    assert o.finished and o.finish_reason == "stop" and o.num_output_tokens == 4
    assert o.num_prompt_tokens == 7 and o.first_token_time == 2.0


def test_step_outputs_pickle_and_the_tokenizer_too(tmp_path):
    from pagoda.runtime.model.tokenizer import Tokenizer
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    out = StepOutput("r", 1, [5], "a", [], True, "stop", num_output_tokens=2)
    assert pickle.loads(pickle.dumps(out)) == out
    hf = HFTokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    tok = Tokenizer(hf, chat_template="{{ messages[0]['content'] }}!", bos_token_id=None,
                    eos_token_ids=[1])  # fmt: skip
    back = pickle.loads(pickle.dumps(tok))
    assert back.encode("a") == tok.encode("a") == [0] and back.eos_token_ids == (1,)
    assert back.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"


def test_a_process_never_given_a_model_stops_at_once_and_quietly(caplog):
    """A start-up check that fails (`pagoda serve`'s preflight) stops the engine process spawned
    beside it, maybe still importing torch: it is terminated at once, with no "did not stop"
    warning on the one-line error (a graceful stop waited for the imports to read it)."""
    client = EngineProcClient().spawn()
    with caplog.at_level("WARNING", logger="pagoda.runtime.engine.core_client"):
        client.stop(timeout=0.2)
    assert not client.proc.is_alive()
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
