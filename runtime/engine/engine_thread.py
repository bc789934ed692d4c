"""The engine core on a thread of the server's process (`--no-engine-process`; the tests' fake
cores): `AsyncEngine`'s other way to run it, beside the engine process (`core_client.py`).

The thread owns the core exclusively: it builds it, warms it up and steps it; nothing else
touches it. The event loop talks to it through an inbox of commands (``("add", rid, ids,
params, bulk)``, ``("abort", rid)``, ``("call", fn, future)``), and the thread hands each step's
outputs, a request's failure, readiness and a fatal error back through
`loop.call_soon_threadsafe` to the `AsyncEngine`'s event-loop callbacks (`_dispatch`, `_fail`,
`_set_ready`, `_fail_all`). PyTorch releases the GIL inside its kernels, so HTTP work overlaps
the model's.

A request naming a LoRA adapter that is not in host memory yet is parked while the adapter is
read off the thread (`engine/deferred.py`), and so is a call that answers with a `Deferred`.
The thread may start before any event loop exists (`preload`, what `pagoda serve` does: the
model loads while the server builds its app); nothing reaches the loop before `start` hands it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pagoda.runtime.engine.core_proc import first_step
from pagoda.runtime.engine.deferred import Deferred, Parked
from pagoda.runtime.engine.info import EngineInfo

if TYPE_CHECKING:
    from pagoda.runtime.engine.async_engine import AsyncEngine
    from pagoda.runtime.engine.core import EngineCore

log = logging.getLogger(__name__)


class EngineThread:
    """The core built by `factory` and stepped on one thread, for `engine` (its callbacks)."""

    def __init__(self, factory: Callable[[], EngineCore], engine: AsyncEngine) -> None:
        self._factory = factory
        self.engine = engine
        self._core: EngineCore | None = None  # this thread's; never touched elsewhere
        self._inbox: collections.deque[tuple] = collections.deque()
        self._wake = threading.Event()
        # adds and calls waiting on an adapter read (`engine/deferred.py`)
        self._parked = Parked(self._wake.set)
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._has_loop = threading.Event()  # set by `start` (or `stop`): the thread may call it
        self.thread: threading.Thread | None = None

    # -- the event loop's side ---------------------------------------------------------------
    def preload(self) -> None:
        """Start the thread (once): it builds the core now, even before any event loop runs."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="pagoda-engine", daemon=True)
            self.thread.start()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the thread the event loop (starting it unless preloaded)."""
        self._loop = loop
        self.preload()
        self._has_loop.set()

    def post(self, cmd: tuple) -> None:
        self._inbox.append(cmd)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float) -> None:
        self._stop = True
        self._has_loop.set()  # a preloaded thread waiting for a loop that never came
        self._wake.set()
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def died(self) -> bool:
        """The thread ended without being asked to stop."""
        return self.thread is not None and not self.thread.is_alive() and not self._stop

    def call_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the event loop (from any thread; preloaded: once it has one)."""
        self._has_loop.wait()  # preloaded: the loop comes with `start`
        if self._loop is None:  # stopped before it started
            self._stop = True
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: the server is going away
            self._stop = True

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            self._core = core = self._factory()
            engine.info = EngineInfo.from_core(core)
            self._warm_up(core)
            self.call_loop(engine._set_ready)
            self._serve(core)
        except BaseException as exc:
            log.exception("engine loop died")
            engine.error = engine.error or exc
            self.call_loop(engine._fail_all, exc)
        finally:
            if self._core is not None:  # stops a tensor-parallel group's other ranks
                self._core.close()

    def _warm_up(self, core: EngineCore) -> None:
        """One real step, so the first client does not pay for lazy initialisation."""
        first_step(core)
        self._stats(core)

    def _stats(self, core: EngineCore) -> None:
        if self.engine.observer is not None:
            self.engine._record_stats(core.stats())

    def _serve(self, core: EngineCore) -> None:
        while not self._stop:
            self._wake.clear()
            had_cmds = self._apply_inbox(core)
            had_cmds = self._apply_parked(core) or had_cmds
            if not core.has_unfinished_requests():
                if had_cmds:
                    self._stats(core)
                self._wake.wait()
                continue
            outputs = core.step()
            self._stats(core)
            if outputs:
                self.call_loop(self.engine._dispatch, outputs)

    def _apply_inbox(self, core: EngineCore) -> bool:
        n = 0
        while self._inbox:
            cmd = self._inbox.popleft()
            n += 1
            kind = cmd[0]
            if kind == "add":
                lora = cmd[3].lora_request  # an adapter not in host memory: read meanwhile
                try:
                    read = None if lora is None else core.read_lora(lora)
                except Exception as exc:  # this request only
                    self.call_loop(self.engine._fail, cmd[1], exc)
                    continue
                if read is None or read.done():
                    self._add(core, cmd)
                else:
                    self._parked.add(cmd[1], (read,), cmd)
            elif kind == "abort":
                if not self._parked.drop(cmd[1]):
                    core.abort_request(cmd[1])
            elif kind == "call":
                self._answer(cmd[2], lambda fn=cmd[1]: fn(core))
        return n > 0

    def _add(self, core: EngineCore, cmd: tuple) -> None:
        _, rid, ids, params, bulk = cmd
        try:  # validated, and this engine's own copy (`AsyncEngine.add_requests`)
            core.add_request(rid, ids, params, checked=True, bulk=bulk)
        except Exception as exc:  # this request only (a failed adapter read: its error)
            self.call_loop(self.engine._fail, rid, exc)

    def _answer(self, fut: asyncio.Future[Any], call: Callable[[], Any]) -> None:
        """Settle a call's future with its result or error; a `Deferred` one is parked."""
        try:
            result, exc = call(), None
        except Exception as e:
            result, exc = None, e
        if isinstance(result, Deferred):
            self._parked.add(fut, (result.wait,), result)
            return
        self.call_loop(_settle, fut, result, exc)

    def _apply_parked(self, core: EngineCore) -> bool:
        """The parked adds and calls whose adapter read is over; True if there was any."""
        ready = self._parked.ready()
        for key, item in ready:
            if isinstance(item, Deferred):
                self._answer(key, lambda d=item: d.finish(core))
            else:
                self._add(core, item)
        return bool(ready)


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
