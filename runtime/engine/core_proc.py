"""EngineCoreProc: the engine's step loop in a process of its own, beside the API process.

Why: in one process the API's event loop (HTTP parsing, SSE encoding, the asyncio fan-out of
every token) and the step loop's host work (schedule, prepare, sample, detokenize) take turns on
one GIL; whichever holds it stalls the other, and streaming pays most (issue 40 measured 46%
less throughput than without streaming on an H200). vLLM v1 runs its EngineCore in its own
process for the same reason. Here the child owns the `EngineCore`; the API process keeps every
request's bookkeeping (`AsyncEngine`) and talks to it through `core_client.EngineProcClient`.

Wire: two ZeroMQ sockets over `ipc://` paths in a directory of the API process's; each side
binds the socket it reads and connects the one it writes (a connected socket queues messages
before its peer is there).

- API → engine (PUSH → PULL): one pickled list of commands per event-loop iteration:
  `("preflight", job)` (`pagoda serve`: the start-up checks run here, where torch is, and
  the model they checked loads next, its tokenizer sent with `r`) or
  `("load", factory, with_tokenizer)` (first: the process is started before the server knows
  its engine config, and imports the engine's modules meanwhile; `with_tokenizer` False: the
  API process loads its own, so `r` leaves it out), `("add", rid, ids, params, bulk)`,
  `("abort", rid)`, `("call", call_id, fn)`, `("stop",)`. A request with a structured-output
  spec arrives without its grammar (xgrammar's `CompiledGrammar` does not pickle): the grammar
  is compiled here again (cached per spec) on the compiler's threads, and the request joins
  the batch once it is ready, so a grammar that takes seconds to compile never stalls the
  steps of the requests already running.
- engine → API (PUSH → PULL): multipart `[kind, payload]`:
  - `o`: one message per step for every request in it: MessagePack of `(outputs, stats)`,
    decoded straight into `StepOutput`s and `EngineStats` (msgspec Structs), never per token;
  - `p`: pickled `(plan, error)` of `preflight`: the checks' plain-data `ServePlan`, or
    the error that failed them;
  - `s`: stats only (commands applied while nothing runs);
  - `r`: the pickled `EngineInfo`, once the model is loaded and one real step has run (its
    tokenizer None when the API process has its own);
  - `f`: pickled `(rid, error)`: adding that request failed (nothing else is touched);
  - `c`: pickled `(call_id, result, error)` of a `call`;
  - `x`: the pickled error that ended the loop; the process then exits 1.

The child ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the API process
drains and then stops it) and exits on its own when its parent is gone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import msgspec
from pagoda.runtime.engine.deferred import Deferred, Parked, all_done
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from pagoda.runtime.engine.core import EngineCore

log = logging.getLogger(__name__)

# One step's message: (outputs, stats); the decoder builds the Structs directly.
StepMessage = tuple[list[StepOutput], EngineStats | None]
PARENT_CHECK_S = 1.0  # how often a busy loop checks that its parent is still there
GRAMMAR_POLL_S = 0.005  # how often an idle loop looks for a finished grammar compile
# Imported while the API process checks its flags and model (they are what a load needs).
PRELOAD = ("torch", "pagoda.runtime.engine.core", "pagoda.runtime.engine.warmup")


def first_step(core: EngineCore) -> None:
    """One real step before ready, so the first client does not pay for lazy initialisation.
    The warm-up is not traffic: the cumulative counters of `/metrics` start at 0 after it."""
    ids = core.tokenizer.encode("Hello") or [0]
    core.add_request("__warmup__", ids, SamplingParams(max_tokens=1, temperature=0.0))
    while core.has_unfinished_requests():
        core.step()
    core.reset_counters()


def dump_error(exc: BaseException) -> bytes:
    """An exception as the API process can load it: itself where it pickles and loads back,
    else a RuntimeError naming it (a custom exception's arguments may not round-trip)."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))


class EngineCoreProc:
    """The child's loop: apply commands, step, send one message per step."""

    def __init__(self, inbox: Any, outbox: Any, parent_pid: int) -> None:
        self.inbox, self.outbox, self.parent_pid = inbox, outbox, parent_pid
        self.encoder = msgspec.msgpack.Encoder()
        self.stopping = False
        # requests waiting for their grammar's compile or their LoRA adapter's read: rid →
        # (ids, params, the compile or None, when it began, bulk, the read or None)
        self.compiling: dict[str, tuple[Any, SamplingParams, Future | None, float, bool,
                                        Future | None]] = {}  # fmt: skip
        self.calls = Parked()  # `run_in_engine` calls whose answer waits (`engine/deferred.py`)
        self.compiler: Any = None  # the tokenizer's GrammarCompiler, once a grammar arrives

    def send(self, kind: bytes, payload: bytes) -> None:
        self.outbox.send_multipart((kind, payload))

    def wait_for_factory(self) -> tuple[Callable[[], EngineCore], bool] | None:
        """The `load` command's factory and whether `r` carries the tokenizer; None when told
        to stop (or orphaned) first."""
        while True:
            if not self.inbox.poll(int(PARENT_CHECK_S * 1000)):
                if os.getppid() != self.parent_pid:
                    return None
                continue
            for cmd in pickle.loads(self.inbox.recv()):
                if cmd[0] == "load":
                    return cmd[1], cmd[2]
                if cmd[0] == "preflight":
                    factory = self.preflight(cmd[1])
                    if factory is not None:
                        return factory, True
                if cmd[0] == "stop":
                    return None

    def preflight(self, job: Callable[[], tuple[Any, Any]]) -> Callable[[], EngineCore] | None:
        """`pagoda serve`'s start-up checks, here where torch is (`job`: `ByName` of
        `server.launch.checked_factory` and the flags); `p` carries their plain-data plan, or
        the error that failed them, to the API process. The core factory of the configuration
        checked; None when a check failed (the API process then stops this process)."""
        try:
            factory, plan = job()
        except BaseException as exc:
            log.debug("start-up check failed", exc_info=True)
            self.send(b"p", pickle.dumps((None, dump_error(exc))))
            return None
        self.send(b"p", pickle.dumps((plan, None)))
        return factory

    def run(self, factory: Callable[[], EngineCore], with_tokenizer: bool = True) -> int:
        """Load, warm up, serve until told to stop; the exit code."""
        try:
            core = factory()
            info = EngineInfo.from_core(core)
            if not with_tokenizer:  # the API process has its own
                info = dataclasses.replace(info, tokenizer=None)
            start = time.monotonic()
            first_step(core)
            log.info("engine process: first step in %.1f s; ready", time.monotonic() - start)
            self.send(b"r", pickle.dumps(info))
            self.send(b"s", self.encoder.encode(core.stats()))
            self.serve(core)
            core.close()  # a tensor-parallel group's other ranks stop with it
            return 0
        except BaseException as exc:
            log.exception("engine loop died")
            self.send(b"x", dump_error(exc))
            return 1

    def serve(self, core: EngineCore) -> None:
        zmq_poll, encode = self.inbox.poll, self.encoder.encode
        checked = time.monotonic()
        while not self.stopping:
            had_cmds = bool(self.compiling) and self.add_compiled(core)
            had_cmds = self.finish_calls(core) or had_cmds
            busy = core.has_unfinished_requests()
            idle_s = GRAMMAR_POLL_S if self.compiling or self.calls else PARENT_CHECK_S
            if zmq_poll(0 if busy else int(idle_s * 1000)):
                had_cmds = self.apply_all(core) or had_cmds
            if self.stopping:
                return
            if not core.has_unfinished_requests():
                if had_cmds:
                    self.send(b"s", encode(core.stats()))
                elif not busy and os.getppid() != self.parent_pid:
                    log.warning("the API process is gone; the engine process exits")
                    return
                continue
            outputs = core.step()
            self.send(b"o", encode((outputs, core.stats())))
            if time.monotonic() - checked > PARENT_CHECK_S:
                checked = time.monotonic()
                if os.getppid() != self.parent_pid:
                    log.warning("the API process is gone; the engine process exits")
                    return

    def apply_all(self, core: EngineCore) -> bool:
        """Apply every command waiting in the socket; True if there was any."""
        import zmq

        n = 0
        while True:
            try:
                data = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return n > 0
            for cmd in pickle.loads(data):
                n += 1
                self.apply(core, cmd)

    def apply(self, core: EngineCore, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, ids, params, *more = cmd
            bulk = bool(more and more[0])  # `bulk` may be left out (a single request)
            try:
                compile_ = self.grammar(core, params)
                lora = params.lora_request  # an adapter not in host memory: read meanwhile
                read = None if lora is None else core.read_lora(lora)
            except Exception as exc:  # this request only
                self.send(b"f", pickle.dumps((rid, dump_error(exc))))
                return
            if not all_done((compile_, read)):  # added once it is compiled and read
                self.compiling[rid] = (ids, params, compile_, time.monotonic(), bulk, read)
            else:
                self.add(core, rid, ids, params, compile_, bulk)
        elif kind == "abort":
            if self.compiling.pop(cmd[1], None) is None:
                core.abort_request(cmd[1])
        elif kind == "call":
            _, call_id, fn = cmd
            self.answer(call_id, lambda: fn(core))
        elif kind == "stop":
            self.stopping = True

    def answer(self, call_id: Any, call: Callable[[], Any]) -> None:
        """Send a call's result or error; a `Deferred` one waits in `calls` instead."""
        try:
            result = call()
            if isinstance(result, Deferred):
                self.calls.add(call_id, (result.wait,), result)
                return
            payload = pickle.dumps((call_id, result, None))
        except Exception as exc:  # the call's (or its result's pickling) only
            payload = pickle.dumps((call_id, None, dump_error(exc)))
        self.send(b"c", payload)

    def finish_calls(self, core: EngineCore) -> bool:
        """Answer the deferred calls whose wait is over; True if there was any."""
        ready = self.calls.ready()
        for call_id, deferred in ready:
            self.answer(call_id, lambda d=deferred: d.finish(core))
        return bool(ready)

    def grammar(self, core: EngineCore, params: SamplingParams) -> Future | None:
        """The compile of the request's grammar, started on the compiler's threads (None: no
        grammar to compile)."""
        spec = params.structured_outputs
        if spec is None or spec.compiled is not None:
            return None
        from pagoda.runtime.structured.compiler import compiler_for

        self.compiler = compiler_for(core.tokenizer, core.model_config.vocab_size)
        return self.compiler.submit(spec)

    def add(self, core: EngineCore, rid: str, ids: Any, params: SamplingParams,
            compile_: Future | None = None, bulk: bool = False) -> None:  # fmt: skip
        """Add one request to the core, with its compiled grammar; `f` if it is refused."""
        try:
            if compile_ is not None:
                params = params.with_grammar(
                    params.structured_outputs.with_compiled(compile_.result())
                )
            # validated by the API process
            core.add_request(rid, ids, params, checked=True, bulk=bulk)
        except Exception as exc:  # this request only
            self.send(b"f", pickle.dumps((rid, dump_error(exc))))

    def add_compiled(self, core: EngineCore) -> bool:
        """Add the requests whose grammar is ready; True if there was any. A compile running
        past the compiler's time bound gives its slot up, as in the server, so that a grammar
        that took long there (or was retried once cached) holds up no other's compile here."""
        ready, now = [], time.monotonic()
        for rid, (_, _, fut, began, _, read) in self.compiling.items():
            if all_done((fut, read)):
                ready.append(rid)
            elif fut is not None and not fut.done() and began < now - self.compiler.timeout_s:
                self.compiler.give_up_slot(fut)
        for rid in ready:  # (a failed read: `add_request` raises its error, `f` is sent)
            ids, params, fut, _, bulk, _ = self.compiling.pop(rid)
            self.add(core, rid, ids, params, fut, bulk)
        return bool(ready)


@dataclasses.dataclass(frozen=True)
class ByName:
    """A call of a function named by its module and name, with keyword arguments: it pickles
    without its module, so the API process can ask for `server.launch.checked_factory` without
    importing that module (it imports torch). A pickled function is a reference by name too;
    this one is written by the sender instead of taken from an imported module."""

    module: str
    name: str
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        import importlib

        return getattr(importlib.import_module(self.module), self.name)(**self.kwargs)


def preload() -> None:
    """Import what loading will need, before the factory arrives (errors surface at load)."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            return


def run_engine_core(
    in_addr: str,
    out_addr: str,
    parent_pid: int,
    log_level: str = "info",
) -> None:
    """Entry point of the engine process (spawned by `core_client.EngineProcClient`)."""
    import zmq

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    ctx = zmq.Context(1)
    inbox = ctx.socket(zmq.PULL)
    inbox.setsockopt(zmq.RCVHWM, 0)
    inbox.bind(in_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.SNDHWM, 0)
    outbox.connect(out_addr)
    proc = EngineCoreProc(inbox, outbox, parent_pid)
    start = time.monotonic()
    preload()
    imported = time.monotonic()
    load = proc.wait_for_factory()
    if load is not None:  # (nothing logged when the server's checks failed)
        log.info(
            "engine process: engine modules imported in %.1f s, then %.1f s until the factory",
            imported - start,
            time.monotonic() - imported,
        )
    code = 0 if load is None else proc.run(*load)
    outbox.close(linger=5000)  # deliver the last messages (the error, a final step)
    inbox.close(linger=0)
    ctx.term()
    os._exit(code)  # no atexit work: torch's and the sockets' teardown is the OS's
