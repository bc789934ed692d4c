"""EngineProcClient: the API process's end of the engine process (`core_proc.py`).

Runs entirely on the event loop, without threads of its own: commands posted during one
iteration of the loop go out as one message (ZeroMQ queues it; a send never blocks the loop),
and the outputs socket and the child's exit are watched with `loop.add_reader`, so each step's
message is decoded and fanned out to the request streams by the loop itself, once per step.

The child is started with `spawn` (a forked copy of a process that has started threads or
OpenMP is unsafe) and is not a daemon, so it may start processes of its own (tensor-parallel
workers). `pagoda serve` spawns it first thing (`spawn()`), so that it imports torch and the
engine while the server checks its flags and model; the core factory follows as its first
command as soon as the engine's configuration is known (`load()`, before the HTTP app is
built: the model loads while the API process imports and builds it, and loads its own tokenizer
meanwhile), else at `start()`. Its death while serving, for any reason (an exception, SIGKILL,
out of memory), is seen through its process sentinel: every request fails with 503 and
`/health` turns 503.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from pagoda.runtime.engine.core_proc import StepMessage, run_engine_core
from pagoda.runtime.engine.outputs import EngineStats

if TYPE_CHECKING:
    from pagoda.runtime.engine.async_engine import AsyncEngine

log = logging.getLogger(__name__)


PREFLIGHTED = "checked there"  # `_loading` once `preflight` had the engine process load


class EngineDeadError(RuntimeError):
    """The engine process ended without being asked to."""


def engine_context() -> multiprocessing.context.BaseContext:
    """How the engine process starts: spawned (a fork would copy the server's threads). The
    tests fork it from a server that imported the engine once (tests/forkserver_testlib.py)."""
    return multiprocessing.get_context("spawn")


class EngineProcClient:
    def __init__(self, log_level: str = "info") -> None:
        self.log_level = log_level
        self.factory: Callable[[], Any] | None = None
        self.engine: AsyncEngine | None = None
        self.proc: Any = None
        self.stopping = False
        self.exited = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple] = []
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._next_call = 0
        self._step_decoder = msgspec.msgpack.Decoder(StepMessage)
        self._stats_decoder = msgspec.msgpack.Decoder(EngineStats)
        self._dir: str | None = None
        self._ctx: Any = None
        self._tx: Any = None
        self._rx: Any = None
        self._rx_fd: int | None = None
        self._loading: Callable[[], Any] | None = None  # the factory sent by `load`
        self.tokenizer: Any = None  # this process's own (`load`), else the engine's comes
        self._tokenizer_error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def spawn(self) -> EngineProcClient:
        """Start the process (it imports the engine, then waits for `start`)."""
        import zmq

        self._dir = tempfile.mkdtemp(prefix="pagoda-engine-")
        in_addr, out_addr = f"ipc://{self._dir}/in", f"ipc://{self._dir}/out"
        self._ctx = zmq.Context(1)
        self._tx = self._ctx.socket(zmq.PUSH)
        self._tx.setsockopt(zmq.SNDHWM, 0)
        self._tx.connect(in_addr)  # connecting, not binding: sends queue before the child binds
        self._rx = self._ctx.socket(zmq.PULL)
        self._rx.setsockopt(zmq.RCVHWM, 0)
        self._rx.bind(out_addr)
        self.proc = engine_context().Process(
            target=run_engine_core,
            args=(in_addr, out_addr, os.getpid(), self.log_level),
            name="pagoda-engine-core",
        )
        self.proc.start()
        # Before multiprocessing's own exit handler, which would wait for this (non-daemon)
        # process forever if the server exits without stopping it (an error in start-up).
        atexit.register(self._stop_at_exit)
        return self

    def load(self, factory: Callable[[], Any], tokenizer: Callable[[], Any] | None = None) -> None:
        """Send the core factory now (spawning first if needed), so the model loads while this
        process builds its app; `start` with the same factory then sends nothing more.

        `tokenizer`: builds this process's own tokenizer (the same one the core loads), called
        here right after the factory has left, while the engine loads; the engine then leaves
        its tokenizer out of the `EngineInfo` it sends when ready, so ready waits for no
        tokenizer to be pickled and rebuilt (~0.1 s for a 49k vocabulary). Should it fail
        here, the engine's load fails the same way (same file, same code) and reports it."""
        import zmq

        try:
            data = pickle.dumps([("load", factory, tokenizer is None)])
        except Exception as e:
            raise TypeError(f"the engine process needs a picklable core factory: {e}") from e
        if self.proc is None:
            self.spawn()
        self._tx.send(data, zmq.NOBLOCK)
        self._loading = factory
        if tokenizer is not None:
            try:
                self.tokenizer = tokenizer()
            except Exception as e:  # the engine's load reports it (or `_handle` below does)
                log.debug("this process could not load the tokenizer", exc_info=True)
                self._tokenizer_error = e

    def preflight(
        self,
        job: Callable[[], Any],
        meanwhile: Callable[[], Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run `pagoda serve`'s start-up checks in the engine process (it imports torch and the
        model code; this process then needs neither) and return their plain-data result (a
        `server.api_process.ServePlan`); the engine process goes on to load the model it
        checked, and sends its tokenizer with `EngineInfo` when ready. A failed check is raised
        here as the engine process raised it (a ValueError: one line, exit 2). `job`: run
        there, returns (core factory, plan): `core_proc.ByName` of `launch.checked_factory`
        with the flags, plain data; `meanwhile`: called once it is sent, while the engine
        process imports torch and checks (the server imports its app then)."""
        import time

        import zmq

        if self.proc is None:
            self.spawn()
        self._tx.send(pickle.dumps([("preflight", job)]), zmq.NOBLOCK)
        self._loading = PREFLIGHTED
        if meanwhile is not None:
            meanwhile()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._rx.poll(200):
            if not self.proc.is_alive():
                self._rx.poll(500)  # its last words, if any
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the engine process's start-up checks took over {timeout} s")
        else:
            kind, payload = self._rx.recv_multipart()
            if kind == b"p":
                plan, err = pickle.loads(payload)
                if err is not None:
                    raise _load_error(err)
                return plan
            if kind == b"x":
                raise _load_error(payload)
            raise RuntimeError(f"engine process: unexpected message {kind!r} during start-up")
        raise EngineDeadError(
            f"engine process exited with code {self.proc.exitcode} during the start-up checks"
        )

    def _stop_at_exit(self) -> None:
        if not self.stopping:
            self.stop(timeout=2)

    def start(
        self, loop: asyncio.AbstractEventLoop, factory: Callable[[], Any], engine: AsyncEngine
    ) -> None:
        """Hand the process its core factory (spawning it first if `spawn` was not called);
        the engine's callbacks run on `loop` from now on."""
        import zmq

        if self._loading is None or (self._loading is not factory and factory is not None):
            self.load(factory)
        self._loop, self.factory, self.engine = loop, factory, engine
        self._rx_fd = self._rx.getsockopt(zmq.FD)
        loop.add_reader(self._rx_fd, self._on_readable)
        loop.add_reader(self.proc.sentinel, self._on_exit)
        # the descriptor is edge-triggered: messages queued before it was watched (after
        # `preflight` read its answer) would wait for the next edge
        loop.call_soon(self._on_readable)

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.exited and self.proc.is_alive()

    @property
    def died(self) -> bool:
        """The process ended without being asked to stop."""
        return self.exited and not self.stopping

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the loop to stop, wait for the process (then terminate, then kill), clean up."""
        self.stopping = True
        if self.proc is None:
            return
        if self.proc.is_alive() and self._loading is None:  # spawned, never given a model:
            self.proc.terminate()  # nothing to stop gracefully (a failed start-up check; it
            self.proc.join(max(timeout, 5))  # may be importing torch, reading no "stop" yet)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        elif self.proc.is_alive():
            self._pending.append(("stop",))
            self._flush()
            self.proc.join(timeout)
            if self.proc.is_alive():
                log.warning("engine process did not stop in %.0f s; terminating it", timeout)
                self.proc.terminate()
                self.proc.join(5)
                if self.proc.is_alive():
                    self.proc.kill()
                    self.proc.join(5)
        self._close()

    def _close(self) -> None:
        if self._loop is not None and not self._loop.is_closed() and self._rx_fd is not None:
            self._loop.remove_reader(self._rx_fd)
            self._loop.remove_reader(self.proc.sentinel)
        for sock in (self._tx, self._rx):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._tx = self._rx = self._ctx = self._rx_fd = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- API → engine ----------------------------------------------------------------------
    def post(self, cmd: tuple) -> None:
        """Queue a command; everything posted in this loop iteration leaves as one message."""
        if cmd[0] == "call":
            _, fn, fut = cmd
            try:
                pickle.dumps(fn)
            except Exception as e:
                fut.set_exception(TypeError(f"engine process: cannot send {fn!r}: {e}"))
                return
            self._next_call += 1
            self._calls[self._next_call] = fut
            cmd = ("call", self._next_call, fn)
        elif cmd[0] == "add":
            cmd = (*cmd[:3], portable(cmd[3]), *cmd[4:])
        if not self._pending and self._loop is not None:
            self._loop.call_soon(self._flush)
        self._pending.append(cmd)

    def _flush(self) -> None:
        import zmq

        cmds, self._pending = self._pending, []
        if not cmds or self._tx is None:
            return
        try:
            data = pickle.dumps(cmds, protocol=5)
        except Exception:  # one command that does not pickle fails alone
            data = pickle.dumps([c for c in cmds if self._sendable(c)], protocol=5)
        self._tx.send(data, zmq.NOBLOCK)

    def _sendable(self, cmd: tuple) -> bool:
        try:
            pickle.dumps(cmd, protocol=5)
            return True
        except Exception as e:
            if cmd[0] == "add" and self.engine is not None:
                self.engine._fail(cmd[1], ValueError(f"request cannot reach the engine: {e}"))
            return False

    # -- engine → API ----------------------------------------------------------------------
    def _on_readable(self) -> None:
        """Every message waiting (the ZeroMQ descriptor is edge-triggered: drain it)."""
        import zmq

        rx = self._rx
        while rx is not None and rx.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                kind, payload = rx.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                self._handle(kind, payload)
            except Exception:  # one bad message must not stop the loop from reading on
                log.exception("engine message %r failed", kind)
            rx = self._rx

    def _handle(self, kind: bytes, payload: bytes) -> None:
        engine = self.engine
        if kind == b"o":
            outputs, stats = self._step_decoder.decode(payload)
            engine._record_stats(stats)
            if outputs:
                engine._dispatch(outputs)
        elif kind == b"s":
            engine._record_stats(self._stats_decoder.decode(payload))
        elif kind == b"f":
            rid, err = pickle.loads(payload)
            engine._fail(rid, _load_error(err))
        elif kind == b"c":
            call_id, result, err = pickle.loads(payload)
            fut = self._calls.pop(call_id, None)
            if fut is not None and not fut.done():
                if err is not None:
                    fut.set_exception(_load_error(err))
                else:
                    fut.set_result(result)
        elif kind == b"r":
            info = pickle.loads(payload)
            if info.tokenizer is None:  # left out: this process loaded its own (`load`)
                if self.tokenizer is None:
                    why = self._tokenizer_error or "none was loaded"
                    self._died(RuntimeError(f"the API process has no tokenizer: {why}"))
                    return
                info = dataclasses.replace(info, tokenizer=self.tokenizer)
            engine.info = info
            engine._set_ready()
        elif kind == b"x":
            self._died(_load_error(payload))

    def _on_exit(self) -> None:
        if self.exited:
            return
        self.proc.join(1)
        if self.proc.exitcode == 1 and self._rx is not None and self.engine.error is None:
            self._rx.poll(1000)  # the error that ended the loop, sent just before it exited
        self._on_readable()  # the last messages first
        self.exited = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.proc.sentinel)
        if not self.stopping:
            code = self.proc.exitcode
            self._died(EngineDeadError(f"engine process exited with code {code}"))

    def _died(self, exc: BaseException) -> None:
        if self.engine.error is not None:
            return
        log.error("engine process died: %s", exc)
        self.engine.error = exc
        self.engine._fail_all(exc)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(f"engine process died: {exc!r}"))
        self._calls.clear()


def portable(params: Any) -> Any:
    """`params` as the engine process can receive them: a grammar compiled here (xgrammar's
    `CompiledGrammar` does not pickle) is left out, and the engine compiles it again from the
    spec (its compiler caches per spec, so once per distinct grammar)."""
    so = getattr(params, "structured_outputs", None)
    if so is not None and getattr(so, "compiled", None) is not None:
        params = params.with_grammar(so.with_compiled(None))
    return params


def _load_error(data: bytes) -> BaseException:
    try:
        exc = pickle.loads(data)
    except Exception as e:
        return RuntimeError(f"engine error that could not be loaded: {e}")
    return exc if isinstance(exc, BaseException) else RuntimeError(repr(exc))
