"""AsyncEngine: the synchronous `EngineCore` behind an asyncio façade, in a process of its own
or on a thread of the server's.

Why not on the event loop: a step is long (tens of ms of model compute) and must not block the
loop that accepts requests and streams tokens. Two ways to run it:

- `engine_process=True` (`pagoda serve`'s default, `core_proc.py`): the core runs in a child
  process; the step loop's host work and the API's per-token work no longer share a GIL.
  Commands go out as one message per loop iteration, each step's outputs come back as one.
- `engine_process=False` (`--no-engine-process`; tests with fake cores): the core runs on a
  thread of this process (`engine_thread.py`: PyTorch releases the GIL inside its kernels, so
  HTTP work overlaps the model's). The thread owns the core exclusively; the event loop talks
  to it through an inbox of commands (add, abort, call) and receives each step's outputs in one
  `loop.call_soon_threadsafe` batch.

Either way each step's outputs are fanned out to per-request streams by the event loop, once
per step, and a reader that falls behind gets its pending tokens coalesced into one delta.

The serving layer sees only this class and the immutable `EngineInfo` snapshot it publishes once
the model is loaded (tokenizer, context length, vocabulary), never the core itself.

Failure model: a bad request is rejected before it reaches the thread (`validate`, one path,
errors are `ParamError(field, message)`); an error while adding one request fails only that
request. An exception inside `step()` cannot be pinned on one request, so it is fatal: every
stream fails, `error` is set and `/health` turns 503.

Admission (the queue's bounds, 400/503 refusals, bulk requests' fair share of the core's batch)
is `admission.py`'s; this class asks it before admitting a request and feeds the core what it
says.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pagoda.runtime.engine.admission import Admission, EngineUnavailableError
from pagoda.runtime.engine.engine_thread import EngineThread
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.engine.request_stream import RequestStream
from pagoda.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from pagoda.runtime.engine.core import EngineCore
    from pagoda.runtime.engine.core_client import EngineProcClient

log = logging.getLogger(__name__)


class RequestEvent(NamedTuple):
    """What one output meant to its request, for the metrics: `first`, the request's first
    output (of any sample); `ended`, its last (every sample finished)."""

    output: StepOutput
    arrival_time: float  # the request's `RequestStream.arrival_time` (`time.monotonic`)
    first: bool
    ended: bool
    n: int = 1  # the request's samples (its engine sequences)


class StepObserver(Protocol):
    """Metrics hook. `record_stats` may run on the engine thread and must stay cheap; the others
    run on the event loop. Outputs reach `record_events` only if they reached a live request
    (an output that arrives after its request was aborted is not counted again)."""

    def record_stats(self, stats: EngineStats) -> None: ...

    def record_events(self, events: Sequence[RequestEvent]) -> None: ...

    def record_abort(self, arrival_time: float, tokens_per_sample: Sequence[int]) -> None: ...


class AsyncEngine:
    """Engine thread + event-loop bookkeeping. All public methods run on the event loop."""

    def __init__(
        self,
        core_factory: Callable[[], EngineCore],
        *,
        max_queue_len: int = 512,
        max_seqs_per_request: int | None = None,
        max_num_seqs: int | None = None,
        observer: StepObserver | None = None,
        retry_after: int = 1,
        engine_process: bool = False,
        log_level: str = "info",
        engine_client: EngineProcClient | None = None,
    ) -> None:
        """`max_queue_len`, `max_seqs_per_request`, `max_num_seqs`, `retry_after`: the limits
        of `Admission` (which see); `engine_process`: run the core in a child process
        (`core_factory` must pickle); `engine_client`: that process, spawned already
        (`EngineProcClient.spawn`)."""
        self._factory = core_factory
        self.engine_process = engine_process
        self._log_level = log_level
        self._client: EngineProcClient | None = None  # engine_process: the child's end here
        self._spawned = engine_client
        # else the engine thread (`engine_thread.py`), started by `preload` or `start`
        self._thread = None if engine_process else EngineThread(core_factory, self)
        self.admission = Admission(max_queue_len, max_seqs_per_request, max_num_seqs, retry_after)
        self.observer = observer
        self.retry_after = retry_after
        self.info: EngineInfo | None = None  # published once the model is loaded
        self.ready = False  # model loaded and one warm-up step done
        self.draining = False
        self.error: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}
        self._feed_pending = False
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started: asyncio.Future[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def preload(self) -> None:
        """Engine thread only: start it now, before any event loop runs, so the model loads
        while the server imports and builds its app (`pagoda serve`); `start` then hands it
        the loop, and nothing reaches the loop before that. The core is built and stepped on
        this one thread, as without `preload`."""
        if self._thread is not None:
            self._thread.preload()

    def start(self) -> None:
        """Start the engine process or thread (it loads the model, warms up, then serves)."""
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.create_future()
        if self.engine_process:
            from pagoda.runtime.engine.core_client import EngineProcClient

            self._client = self._spawned or EngineProcClient(self._log_level)
            self._client.start(self._loop, self._factory, self)
            return
        assert self._thread is not None
        self._thread.start(self._loop)

    async def wait_started(self) -> None:
        """Return once ready; raise the load/warm-up error if the thread died first."""
        assert self._started is not None, "start() first"
        await asyncio.shield(self._started)

    @property
    def alive(self) -> bool:
        if self._client is not None:
            return self.error is None and self._client.alive
        return self.error is None and self._thread is not None and self._thread.alive

    @property
    def dead(self) -> bool:
        """The loop failed, or its thread or process ended without being asked to stop."""
        if self._client is not None:
            return self.error is not None or self._client.died
        return self.error is not None or (self._thread is not None and self._thread.died)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_queued(self) -> int:
        """Sequences accepted that have no output yet (the bound of `max_queue_len`)."""
        return self.admission.num_queued

    def fail(self, exc: BaseException) -> None:
        """Mark the engine dead from any thread (a tensor-parallel rank died): `/health` turns
        503, every stream fails, the server exits (`DrainingServer`)."""
        if self.error is None:
            self.error = exc
        if self._thread is not None:
            self._thread.wake()  # the engine thread's next step raises it too
            if self._loop is not None:
                self._thread.call_loop(self._fail_all, exc)

    def stop(self, timeout: float = 10.0) -> None:
        if self._client is not None:
            self._client.stop(timeout)
        elif self._thread is not None:
            self._thread.stop(timeout)

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, let in-flight ones finish for `timeout` s, abort the rest.

        Returns the number of requests aborted at the deadline.
        """
        self.draining = True
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = list(self._streams)
        for rid in left:
            self.abort(rid)
        return len(left)

    # -- requests (event loop) ---------------------------------------------------------------
    def loaded_info(self) -> EngineInfo:
        """The engine's info, or EngineUnavailableError (503) while it cannot take requests."""
        if self.error is not None:
            raise EngineUnavailableError(f"engine loop died: {self.error!r}")
        if self.draining:
            raise EngineUnavailableError("server is shutting down", self.retry_after)
        if not self.ready or self.info is None:
            raise EngineUnavailableError("model is still loading", self.retry_after)
        return self.info

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """The one validation path: ParamError for bad input, EngineUnavailableError if down."""
        if not isinstance(params, SamplingParams):
            raise TypeError("params must be a SamplingParams")
        self.loaded_info().validate(prompt_token_ids, params)

    def check_prompts(
        self, info: EngineInfo, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> None:
        """The per-prompt checks of `add_requests` (ParamError), safe on any thread: they read
        the immutable `info` and fixed limits only. The server runs them on its worker thread,
        so a 4 MiB body of token ids (2 M ids, about a second of Python) is never scanned on
        the event loop; it then calls `add_requests(..., checked=True)`."""
        self.admission.check_size(len(prompts), params)
        for ids in prompts:
            info.validate(ids, params)
            time.sleep(0)  # let the event loop's thread take the GIL between prompts

    def add_requests(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        prefix: str,
        *,
        checked: bool = False,
        arrival_time: float | None = None,
    ) -> list[RequestStream]:
        """Admit a batch all-or-nothing (ids `prefix-0`, `prefix-1`, ...).

        More sequences (prompts × n) than `max_seqs_per_request` can never be admitted:
        ParamError (400), not 503. A full queue is QueueFullError (503). `checked`: the
        prompts passed `check_prompts` already (the engine's availability is checked here),
        and the params are the caller's own, made for these requests and never changed after
        (the server's): they run as they are, not copied and validated again (without it
        the params are copied, since SamplingParams are mutable and the caller's may change).
        `arrival_time` (`time.monotonic`; default now): where the metrics' latencies start.
        """
        if checked:
            self.admission.check_size(len(prompts), params)
            self.loaded_info()
        else:
            params = params.validated()  # SamplingParams are mutable: this copy is what runs
            self.admission.check_size(len(prompts), params)
            for ids in prompts:
                self.validate(ids, params)
        seqs = len(prompts) * params.n
        bulk = seqs > 1
        self.admission.check_room(seqs, bulk)
        rids = [f"{prefix}-{i}" for i in range(len(prompts))]
        if any(rid in self._streams for rid in rids):
            raise ValueError(f"duplicate request id prefix {prefix!r}")
        streams = [self._admit(rid, params, bulk, arrival_time) for rid in rids]
        if bulk and self.admission.paces_bulk:  # shared out round-robin (`_feed`)
            self.admission.hold_back(
                prefix, [(r, list(ids), params) for r, ids in zip(rids, prompts)]
            )
            self._feed()
        else:
            for rid, ids in zip(rids, prompts):
                self._post(("add", rid, list(ids), params, bulk))
        return streams

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Admit a request or raise: ParamError (bad input), EngineUnavailableError, QueueFullError."""
        params = params.validated()  # SamplingParams are mutable: this copy is what runs
        self.admission.check_size(1, params)
        self.validate(prompt_token_ids, params)
        self.admission.check_room(params.n, params.n > 1)
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"duplicate request id {rid!r}")
        stream = self._admit(rid, params, params.n > 1)
        self._post(("add", rid, list(prompt_token_ids), params, params.n > 1))
        return stream

    def _admit(
        self, rid: str, params: SamplingParams, bulk: bool, arrival_time: float | None = None
    ) -> RequestStream:
        stream = RequestStream(rid, params.n, arrival_time)
        self._streams[rid] = stream
        self.admission.admit(rid, params.n, bulk)
        return stream

    def _feed(self) -> None:
        """Hand the core the bulk prompts whose turn it is (`Admission.next_for_core`)."""
        for rid, ids, params in self.admission.next_for_core():
            self._post(("add", rid, ids, params, True))

    def _feed_soon(self) -> None:
        if self._loop is None:
            self._feed()
        elif not self._feed_pending:
            self._feed_pending = True
            self._loop.call_soon(self._fed_later)

    def _fed_later(self) -> None:
        self._feed_pending = False
        self._feed()

    def abort(self, request_id: str) -> None:
        """Abort a request still running (no-op otherwise); its blocks are freed next iteration."""
        stream = self._streams.pop(request_id, None)
        self.admission.unqueue(request_id)
        if stream is None or stream.finished:
            return
        if not self.admission.drop_waiting(request_id):
            self._post(("abort", request_id))
        if self.admission.release(request_id):
            self._feed_soon()  # after the caller's other aborts (a job aborts all its prompts)
        if self.observer is not None:  # the request ends here: its unfinished samples' tokens
            pending = [t for t, d in zip(stream.tokens, stream.done) if not d]
            self.observer.record_abort(stream.arrival_time, pending)
        stream._abort()

    async def check_integrity(self) -> dict[str, Any]:
        """Block-pool integrity check (raises if inconsistent) and stats, between steps."""

        stats = await self.run_in_engine(_integrity_probe)
        return {"stats": stats, "in_flight": self.num_in_flight, "queued": self.num_queued}

    async def run_in_engine(self, fn: Callable[[EngineCore], Any]) -> Any:
        """Run `fn(core)` in the engine between steps (debug endpoints, tests); with an engine
        process `fn` and its result must pickle (a module-level function, not a lambda)."""
        if not self.alive:
            raise EngineUnavailableError("engine loop is not running")
        assert self._loop is not None
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._post(("call", fn, fut))
        return await fut

    def _post(self, cmd: tuple) -> None:
        if self._client is not None:
            self._client.post(cmd)
        elif self._thread is not None:
            self._thread.post(cmd)

    # -- event-loop callbacks (scheduled by the engine thread, or the process's messages) -----
    def _record_stats(self, stats: EngineStats) -> None:
        """A step's stats (engine process: on the event loop; else on the engine thread)."""
        if self.observer is None:
            return
        try:
            self.observer.record_stats(stats)
        except Exception:  # metrics must never take the engine down
            log.exception("metrics update failed")

    def _dispatch(self, outputs: list[StepOutput]) -> None:
        released = False
        events: list[RequestEvent] = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted meanwhile (counted then)
            first = not stream.started
            if first:  # its first output: it no longer waits (later calls were no-ops)
                self.admission.unqueue(out.request_id)
            if out.finished and self.admission.release(out.request_id, 1):
                released = True
            ended = stream._put(out)
            if ended:
                del self._streams[out.request_id]
            if first or out.finished:
                events.append(RequestEvent(out, stream.arrival_time, first, ended, stream.n))
        if events and self.observer is not None:
            try:
                self.observer.record_events(events)
            except Exception:  # metrics must never take the engine down
                log.exception("metrics update failed")
        if released and self.admission.has_waiting:
            self._feed()

    def _fail(self, request_id: str, exc: BaseException) -> None:
        self.admission.unqueue(request_id)
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream._fail(exc)
        if self.admission.release(request_id) and self.admission.has_waiting:
            self._feed()

    def _fail_all(self, exc: BaseException) -> None:
        self.admission.clear_waiting()
        for rid in list(self._streams):
            self._fail(rid, EngineUnavailableError(f"engine loop died: {exc!r}"))
        if self._started is not None and not self._started.done():
            self._started.set_exception(exc)

    def _set_ready(self) -> None:
        self.ready = True
        if self._started is not None and not self._started.done():
            self._started.set_result(None)


def _integrity_probe(core: EngineCore) -> dict[str, Any]:
    """`check_integrity`'s call (module level: it crosses to the engine process)."""
    import msgspec

    core.check_integrity()
    return msgspec.structs.asdict(core.stats())
