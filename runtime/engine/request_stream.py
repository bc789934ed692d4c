"""A request's stream of outputs: what the event loop fans each step's deltas out to, and what
the serving layer iterates. A reader that falls behind gets its pending deltas merged into one
(coalesced), instead of a backlog of one event per token.
"""

from __future__ import annotations

import asyncio
import time

from pagoda.runtime.engine.outputs import StepOutput


class RequestStream:
    """The outputs of one request (all `n` samples), consumed with `async for`.

    Deltas a reader has not taken yet are coalesced per sample: a client that reads slower
    than tokens are made gets all its pending tokens as one delta (one SSE event), rather than
    a queue of one event per token that it falls further behind on.
    """

    def __init__(self, request_id: str, n: int, arrival_time: float | None = None) -> None:
        self.request_id = request_id
        self.n = n
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.done = [False] * n
        self.tokens = [0] * n  # output tokens so far, per sample
        self.started = False  # some sample has an output
        self.finished = False  # every sample finished, or the request failed/aborted
        self._pending: dict[int, StepOutput] = {}  # sample index -> delta not read yet
        self._error: BaseException | None = None
        self._ended = False  # nothing comes after what is pending
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _put(self, out: StepOutput) -> bool:
        """Event loop: add one delta; True once every sample has finished."""
        i = out.index
        self.tokens[i] = out.num_output_tokens
        self.started = True
        prev = self._pending.get(i)
        if prev is None:
            self._pending[i] = out
        else:
            self._pending[i] = _merge(prev, out)
        if out.finished:
            self.done[i] = True
            if all(self.done):
                self.finished = self._ended = True
        self._wake()
        return self.finished

    def _abort(self) -> None:
        for i, d in enumerate(self.done):
            if not d:
                end = StepOutput(
                    request_id=self.request_id,
                    index=i,
                    new_token_ids=[],
                    new_text="",
                    new_logprobs=[],
                    finished=True,
                    finish_reason="abort",
                    num_output_tokens=self.tokens[i],
                )
                prev = self._pending.get(i)
                self._pending[i] = end if prev is None else _merge(prev, end)
        self.finished = self._ended = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self.finished = self._ended = True
        self._error = exc
        self._wake()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StepOutput:
        while True:
            if self._pending:
                return self._pending.pop(next(iter(self._pending)))
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


def _merge(a: StepOutput, b: StepOutput) -> StepOutput:
    """Delta `a` followed by delta `b` of the same sample, as one."""
    return StepOutput(
        a.request_id,
        a.index,
        a.new_token_ids + b.new_token_ids,
        a.new_text + b.new_text,
        a.new_logprobs + b.new_logprobs if b.new_logprobs else a.new_logprobs,
        b.finished,
        b.finish_reason,
        b.stop_reason,
        a.num_prompt_tokens or b.num_prompt_tokens,
        max(a.num_cached_tokens, b.num_cached_tokens),
        max(a.num_output_tokens, b.num_output_tokens),
        a.arrival_time,
        a.first_scheduled_time if a.first_scheduled_time is not None else b.first_scheduled_time,
        a.first_token_time if a.first_token_time is not None else b.first_token_time,
    )
