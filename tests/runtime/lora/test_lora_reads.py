"""Adapters read off the engine loop's thread (`LoRASlots.start_read`, `engine/deferred.py`): a
request naming an adapter not in host memory, and `load_lora_adapter`'s call, wait while the
loop keeps stepping the others. Each read is held on a gate here, so the test sees the base
request finish while the read is still pending, then the adapter's request get the offline
engine's tokens once it is let through; on the engine thread (`AsyncEngine`) and in the engine
process's loop (`EngineCoreProc`, run in this process); a bad adapter still fails its request."""

from __future__ import annotations

import asyncio
import functools
import os
import threading

import pytest
from lora_testlib import write_adapter, write_llama
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.engine.core_proc import EngineCoreProc
from pagoda.runtime.lora import slots
from pagoda.runtime.lora_config import LoRAConfig
from pagoda.runtime.server.lora_adapters import _engine_load

PROMPT = [5, 17, 42, 9, 88, 3, 61, 27]
ENGINE = dict(dtype="float32", max_lora_rank=8, max_loras=2, kv_cache_memory=4 << 20,
              max_model_len=64, max_num_seqs=4)  # fmt: skip
P = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-reads")
    write_llama(root / "base")
    write_adapter(root / "a1", 8, 16, ["q_proj", "o_proj", "down_proj"], seed=1)
    write_adapter(root / "a2", 4, 8, ["v_proj", "up_proj"], seed=2)
    llm = LLM(str(root / "base"), enable_lora=True, **ENGINE)
    loras = [None, LoRARequest("a1", 1, str(root / "a1")), LoRARequest("a2", 2, str(root / "a2"))]
    outs = llm.generate([PROMPT] * 3, P, use_tqdm=False, lora_request=loras)
    refs = [o.outputs[0].token_ids for o in outs]
    assert refs[0] != refs[1] != refs[2]
    return root, loras, refs


@pytest.fixture
def gate(monkeypatch):
    """Every adapter read (on the reader thread) waits until the event is set."""
    event, read = threading.Event(), slots.read_adapter

    def held(*args):
        assert threading.current_thread() is not threading.main_thread()  # off the loop
        assert event.wait(60)
        return read(*args)

    monkeypatch.setattr(slots, "read_adapter", held)
    yield event
    event.set()


def _core(root) -> EngineCore:
    return EngineCore(EngineConfig.create(str(root / "base"), lora=LoRAConfig(2, 8), **ENGINE))


def test_engine_thread_steps_while_an_adapter_is_read(ckpt, gate):
    root, (_, a1, a2), refs = ckpt
    core = _core(root)
    bad = LoRARequest("bad", 9, str(root / "missing"))

    async def tokens(stream) -> list[int]:
        return [t for out in [o async for o in stream] for t in out.new_token_ids]

    async def run() -> None:
        engine = AsyncEngine(lambda: core)
        engine.start()
        await asyncio.wait_for(engine.wait_started(), 60)
        try:
            adapter = engine.add_request(PROMPT, P.clone(lora_request=a1))
            load = asyncio.ensure_future(engine.run_in_engine(functools.partial(_engine_load, a2)))
            base = await asyncio.wait_for(tokens(engine.add_request(PROMPT, P)), 60)
            assert base == refs[0] and not adapter.finished and not load.done()
            gate.set()
            assert await asyncio.wait_for(tokens(adapter), 60) == refs[1]
            assert await asyncio.wait_for(load, 60) is None
            loaded = engine.add_request(PROMPT, P.clone(lora_request=a2))
            assert await asyncio.wait_for(tokens(loaded), 60) == refs[2]
            with pytest.raises(ValueError, match="not a LoRA adapter directory"):
                await asyncio.wait_for(
                    tokens(engine.add_request(PROMPT, P.clone(lora_request=bad))), 60
                )
        finally:
            engine.stop()

    asyncio.run(run())
    assert set(core.runner.lora.cpu) == {1, 2} and not core.runner.lora.reads


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def send_multipart(self, parts) -> None:
        self.sent.append(tuple(parts))


def test_engine_process_loop_steps_while_an_adapter_is_read(ckpt, gate):
    import pickle

    root, (_, a1, a2), refs = ckpt
    core, proc = _core(root), EngineCoreProc(None, Outbox(), os.getppid())
    proc.apply(core, ("add", "r1", PROMPT, P.clone(lora_request=a1)))
    proc.apply(core, ("call", 7, functools.partial(_engine_load, a2)))
    proc.apply(core, ("add", "base", PROMPT, P))
    assert set(proc.compiling) == {"r1"} and proc.calls
    out: dict[str, list[int]] = {}
    while core.has_unfinished_requests():  # the base request, alone: the reads wait
        for o in core.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert out == {"base": refs[0]} and not proc.outbox.sent
    gate.set()
    while proc.compiling or proc.calls:
        proc.add_compiled(core)
        proc.finish_calls(core)
    assert proc.outbox.sent == [(b"c", pickle.dumps((7, None, None)))]
    while core.has_unfinished_requests():
        for o in core.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert out["r1"] == refs[1] and set(core.runner.lora.cpu) == {1, 2}
