"""Background responses (`background: true`): a response that runs on the API process's event
loop without its client, as OpenAI's and vLLM's do.

The POST answers at once (status `queued`); the run goes on, whether or not anyone polls it,
and keeps the stored entry's JSON current (`in_progress`, then `completed`, `incomplete`,
`failed` or `cancelled`: `responses_store.py`). Created with `stream`, its numbered stream
events are kept with it, so that `GET /v1/responses/{id}?stream=true&starting_after=N`
replays those after N and follows the rest as they come; a reader that goes away leaves the
run going. `cancel` aborts its engine request (the run then ends `cancelled`); the server's
shutdown cancels those still running (`BackgroundRuns.close`); a drain lets them finish for
its timeout, as any request, and its abort then ends them `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from pagoda.runtime.server.responses_store import ResponseStore

log = logging.getLogger("pagoda.server")
CLOSE_WAIT_S = 5.0  # shutdown: how long aborted runs get to record their end


class BackgroundRun:
    """One background response's run: its JSON as it goes, its events, its end."""

    def __init__(self, response_id: str, body: bytes, store: ResponseStore, keep_events: bool,
                 abort: Callable[[], None]) -> None:  # fmt: skip
        self.id, self.body, self.store = response_id, body, store
        self.keep_events = keep_events
        self.frames: list[bytes] = []  # SSE events, by sequence number
        self.done = False
        self.abort = abort  # its engine request's (no-op once it has finished)
        self._more = asyncio.Event()  # set (and replaced) at each new event and at the end
        self.task: asyncio.Task[None] | None = None

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self.task = asyncio.get_running_loop().create_task(work, name=f"background {self.id}")

    def add(self, frame: bytes) -> None:
        """One more stream event (kept where the response was created with `stream`)."""
        if self.keep_events:
            self.frames.append(frame)
            self.store.update(self.id, grow=len(frame))
            self._wake()

    def set_body(self, body: bytes | None) -> None:
        if body is not None and body is not self.body:
            self.body = body
            self.store.update(self.id, body=body)

    def end(self, body: bytes | None, messages: list[dict[str, Any]] | None,
            message_bytes: int) -> None:  # fmt: skip
        """The run is over: its last JSON and its conversation (what a later response with
        `previous_response_id` continues; `message_bytes`, roughly) are stored."""
        if body is not None:
            self.body = body
        self.done = True
        self.store.update(self.id, body=body, messages=messages, grow=message_bytes)
        self._wake()

    async def cancel(self) -> None:
        """Abort the engine request and wait for the run to record its end (`cancelled`, or
        what it reached first); the caller going away does not stop that."""
        if not self.done:
            self.abort()
        if self.task is not None and not self.task.done():
            await asyncio.shield(self.task)

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The events after sequence number `after`, then each new one until the run ends."""
        i = after + 1
        while True:
            if i < len(self.frames):
                frames, i = self.frames[i:], len(self.frames)
                for frame in frames:
                    yield frame
            elif self.done:
                return
            else:
                await self._more.wait()

    def _wake(self) -> None:
        more, self._more = self._more, asyncio.Event()
        more.set()


class BackgroundRuns:
    """The runs still going, by response id (for shutdown)."""

    def __init__(self) -> None:
        self.running: dict[str, BackgroundRun] = {}

    def start(self, run: BackgroundRun, work: Coroutine[Any, Any, None]) -> None:
        async def tracked() -> None:
            try:
                await work
            finally:
                self.running.pop(run.id, None)

        self.running[run.id] = run
        run.start(tracked())

    async def close(self) -> None:
        """Shutdown: abort every run still going and give them a moment to end `cancelled`;
        a run that does not end by then is cancelled outright."""
        runs = list(self.running.values())
        if not runs:
            return
        log.info("shutdown: cancelling %d background response(s)", len(runs))
        for run in runs:
            run.abort()
        tasks = [r.task for r in runs if r.task is not None]
        _, late = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
