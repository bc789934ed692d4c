"""DrainingServer: uvicorn whose exit signals drain the engine instead of stopping at once.

SIGTERM/SIGINT start a drain: /ready turns 503, new requests get 503, in-flight requests run for
up to --drain-timeout seconds, then the process exits 0. A second SIGINT exits at once. An
engine that dies (its process killed, its loop failed) turns /health 503; two seconds later the
process exits 1 (an engine that fails to load on bad input, a `ReasonedError` such as a
checkpoint with NaN weights, exits 2 with one line, as the checks before loading do). Both exits 1 (an engine that fails to start, one that dies while serving) leave
`EngineFailed: ...` / `EngineDied: ...` as the container's termination message
(runtime/termination.py), which the operator shows as the service's condition reason.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import signal
from types import FrameType

import uvicorn
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.termination import (
    ReasonedError,
    Termination,
    exit_error,
    write_termination_log,
)

log = logging.getLogger("pagoda.serve")
DEAD_GRACE_S = 2.0  # an engine dead while serving: seconds of 503s before the process exits


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose exit signals drain the engine first; exits 1 if loading fails or
    the engine dies while serving."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, cfg: ServerConfig) -> None:
        super().__init__(config)
        self.engine, self.cfg = engine, cfg
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False
        self._tasks: list[asyncio.Task] = []  # keep references: tasks are weakly held

    async def serve(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks.append(self._loop.create_task(self._watch_startup()))
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (main thread). Unlike uvicorn's, it does not re-raise the signal."""
        if self._drain_requested or self._loop is None:
            self.should_exit = True
            self.force_exit = self.force_exit or sig == signal.SIGINT
            return
        self._drain_requested = True
        self._loop.call_soon_threadsafe(self._begin_drain, signal.Signals(sig).name)

    def _begin_drain(self, name: str) -> None:
        self._tasks.append(asyncio.ensure_future(self._drain(name)))

    async def _drain(self, name: str) -> None:
        log.info("%s: draining (up to %.0f s)", name, self.cfg.drain_timeout)
        aborted = await self.engine.drain(self.cfg.drain_timeout)
        if aborted:
            log.warning("drain timeout: aborted %d request(s)", aborted)
        self.should_exit = True

    async def _watch_startup(self) -> None:
        engine = self.engine
        while not (engine.ready or engine.dead or self.should_exit):
            await asyncio.sleep(0.1)
        if engine.ready:
            freeze_startup_objects()
            names = ", ".join(self.cfg.served_model_names)
            url = f"http://{self.cfg.host}:{self.config.port}/v1"
            log.info("ready: OpenAI API at %s serving %s (metrics at /metrics)", url, names)
        elif engine.dead and isinstance(engine.error, ReasonedError):
            # bad input found only at load (a checkpoint with NaN/Inf weights): the one line
            # and exit 2 of every refused checkpoint, with its reason for the operator
            exit_error("pagoda serve", engine.error)
            self.exit_code = 2
            self.should_exit = True
            return
        elif engine.dead:
            log.error("engine failed to start: %s", _one_line(engine.error))
            write_termination_log(Termination("EngineFailed", None, _one_line(engine.error)))
            self.exit_code = 1
            self.should_exit = True
            return
        while not (engine.dead or self.should_exit):
            await asyncio.sleep(0.1)
        if engine.dead and not self.should_exit:
            # /health is 503 and every stream got its error; give probes and clients a moment
            # to see it, then exit non-zero so that the pod restarts at once.
            log.error("engine died: %s; exiting", _one_line(engine.error))
            write_termination_log(Termination("EngineDied", None, _one_line(engine.error)))
            self.exit_code = 1
            await asyncio.sleep(DEAD_GRACE_S)
            self.should_exit = True


def freeze_startup_objects() -> None:
    """Keep the collector off what start-up made (modules, the tokenizer, the app): they never
    die, and every full collection walked them all while holding the GIL, so a request that
    allocates many objects (a large body's models) paused the event loop for a second on top
    of its own work. The engine core does the same in its process."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # frozen objects are never collected, not even at exit
    atexit.register(gc.unfreeze)


def _one_line(exc: BaseException | None) -> str:
    text = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:500]
