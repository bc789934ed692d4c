"""A request's stream of outputs: what the event loop fans each step's deltas out to, and what
the serving layer iterates. A reader that falls behind gets its pending deltas merged into one
(coalesced), instead of a backlog of one event per token. The fan-out only appends (a step
costs each stream a list append and a wake-up); deltas are merged once, when the reader takes
them, and a reader that wants only the whole result (`wake_at_end`) is woken once, not every
step.
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
        # The reader wants the whole result (a response that is not streamed): it is woken
        # when the request ends, and gets each sample's deltas merged into one.
        self.wake_at_end = False
        self._pending: dict[int, list[StepOutput]] = {}  # sample index -> deltas not read yet
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
        waiting = self._pending.get(i)
        if waiting is None:
            self._pending[i] = [out]
        else:
            waiting.append(out)
        if out.finished:
            self.done[i] = True
            if all(self.done):
                self.finished = self._ended = True
        if self._ended or not self.wake_at_end:
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
                self._pending.setdefault(i, []).append(end)
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
                deltas = self._pending.pop(next(iter(self._pending)))
                return deltas[0] if len(deltas) == 1 else _merge(deltas)
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


def _merge(deltas: list[StepOutput]) -> StepOutput:
    """Successive deltas of one sample, as one (the first's request, times, prompt and
    prompt logprobs; the last's finish; every token, text and logprob in order)."""
    a, b = deltas[0], deltas[-1]
    lps = [lp for d in deltas for lp in d.new_logprobs]
    return StepOutput(
        a.request_id,
        a.index,
        [t for d in deltas for t in d.new_token_ids],
        "".join([d.new_text for d in deltas]),
        lps,
        b.finished,
        b.finish_reason,
        b.stop_reason,
        next((d.num_prompt_tokens for d in deltas if d.num_prompt_tokens), 0),
        max(d.num_cached_tokens for d in deltas),
        max(d.num_output_tokens for d in deltas),
        a.arrival_time,
        next((d.first_scheduled_time for d in deltas if d.first_scheduled_time is not None), None),
        next((d.first_token_time for d in deltas if d.first_token_time is not None), None),
        next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None),
    )
