"""The engine process's loop and the grammars it compiles (`core_proc.EngineCoreProc`): a request
with a structured-output spec waits for its grammar off the step loop, and a compile that runs
past the time bound gives its slot up, so that it holds up no other request's grammar.

The compiler is the real one (xgrammar, the embedded model's tokenizer); the core only records
what is added to it."""

from __future__ import annotations

import os
import time
import types

import structured_testlib
from pagoda.runtime.engine.core_proc import EngineCoreProc
from pagoda.runtime.model_config import FamilyConfig
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.structured.compiler import compiler_for
from pagoda.runtime.structured.params import StructuredOutputsParams


class Core:
    """What the loop reads of an EngineCore when it adds requests."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.model_config = types.SimpleNamespace(
            vocab_size=tokenizer.model_vocab_size, family=FamilyConfig()
        )
        self.added: dict[str, float] = {}

    def add_request(self, rid, ids, params, checked=False, bulk=False) -> None:
        assert params.structured_outputs.compiled is not None  # never compiled on the loop
        self.added[rid] = time.monotonic()


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def send_multipart(self, parts) -> None:
        self.sent.append(tuple(parts))


def constrained(regex: str) -> SamplingParams:
    return SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex=regex))


def test_a_grammar_past_the_time_bound_holds_up_no_other_grammar():
    """One compile slot, a regex of seconds in it and a quick one behind: the quick one is
    added soon after the slow one's time bound, long before the slow one is done (before, the
    engine process never gave the slot up: the quick request waited the slow compile out)."""
    tok = structured_testlib.smol_tokenizer()
    comp = compiler_for(tok, tok.model_vocab_size)
    threads, timeout = comp.threads, comp.timeout_s
    comp.threads, comp.timeout_s = 1, 0.05
    try:
        core, proc = Core(tok), EngineCoreProc(None, Outbox(), os.getppid())
        tag = time.time_ns()
        start = time.monotonic()
        proc.apply(core, ("add", "slow", [1], constrained(f"s{tag}[a-z]{{1,6000}}")))
        proc.apply(core, ("add", "quick", [1], constrained(f"q{tag}(yes|no)")))
        assert set(proc.compiling) == {"slow", "quick"}  # neither compiled on the loop
        while "quick" not in core.added and time.monotonic() - start < 120:
            proc.add_compiled(core)
            time.sleep(0.01)
        quick = core.added["quick"] - start
        while proc.compiling and time.monotonic() - start < 120:
            proc.add_compiled(core)
            time.sleep(0.01)
        slow = core.added["slow"] - start
    finally:
        comp.threads, comp.timeout_s = threads, timeout
    assert not proc.outbox.sent, proc.outbox.sent  # no request failed
    # 0.5-0.8 s on a quiet 2-core Xeon: six times the bound at least
    assert slow > 0.3, f"the slow regex compiled too fast ({slow:.2f} s) to show anything"
    assert quick < 0.5 * slow, (quick, slow)


def test_an_aborted_request_waiting_for_its_grammar_is_never_added():
    tok = structured_testlib.smol_tokenizer()
    core, proc = Core(tok), EngineCoreProc(None, Outbox(), os.getppid())
    proc.apply(core, ("add", "gone", [1], constrained(f"a{time.time_ns()}[a-z]{{1,2000}}")))
    assert "gone" in proc.compiling
    fut = proc.compiling["gone"][2]
    proc.apply(core, ("abort", "gone"))
    assert not proc.compiling
    fut.result(timeout=120)  # compiled (and cached) all the same
    proc.add_compiled(core)
    assert core.added == {} and not proc.outbox.sent
