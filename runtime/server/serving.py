"""Running jobs: body → Job (on a worker thread) → engine requests → OpenAI responses or SSE.

Everything that can be rejected is rejected before the first engine request is added, so a bad
request never leaves work behind; a batch of prompts is added all-or-nothing. The event loop
only moves bytes and outputs: parsing, templating and tokenization run on `prep_pool`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any

import orjson
from pagoda.runtime.engine.admission import EngineUnavailableError, QueueFullError
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.engine.request_stream import RequestStream
from pagoda.runtime.sampling.bad_words import bad_words_token_ids
from pagoda.runtime.sampling.bans import check_bans_leave_tokens
from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.server.endpoint import Endpoint, Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, retry_headers
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.structured_outputs import StructuredOutputs
from prometheus_client import CollectorRegistry

log = logging.getLogger("pagoda.server")
BULK_BODY_BYTES = 64 << 10
# A full response past this many logprob entries (or characters of text / 100) is built and
# encoded on a thread of its own, one choice at a time: 256 choices of 400 tokens with 20
# alternatives each took 10 s of the event loop, while every stream and /health waited.
BULK_RESPONSE_ITEMS = 4096


def to_json(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON: orjson, json for what orjson refuses (as `sse`)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()  # ASCII: surrogates escaped


def response_json(head: dict[str, Any], choices: list[dict[str, Any]], usage: Any) -> bytes:
    """`{**head, "choices": choices, "usage": usage}` as JSON, each choice encoded on its own
    (an encoder holds the GIL while it runs: one choice at a time lets the event loop in)."""
    top = to_json({**head, "choices": [], "usage": usage})
    # keys are quoted and quotes in values escaped: this is the structural key, head's first
    at = top.index(b'"choices":[]') + len(b'"choices":[')
    return top[:at] + b",".join(to_json(c) for c in choices) + top[at:]


def sse(data: dict[str, Any]) -> bytes:
    """One SSE event as UTF-8; orjson (about 10x json's speed: this runs per token per stream),
    json for what orjson refuses (lone surrogates, non-string keys). Bytes, not str: the
    response would encode each event again."""
    try:
        return b"data: " + orjson.dumps(data) + b"\n\n"
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return f"data: {text}\n\n".encode()


def unavailable(e: EngineUnavailableError) -> APIError:
    # retries spread (retry-after-ms), not in lockstep; a dead engine's 503 names no time
    if isinstance(e, QueueFullError):
        return APIError(503, str(e), code="queue_full", headers=retry_headers(e.retry_after or 1))
    headers = retry_headers(e.retry_after) if e.retry_after else None
    return APIError(503, str(e), code="unavailable", headers=headers)


class NonFiniteLogits(Exception):
    """A sample ended with finish reason "error": the model gave its row no finite logit."""


class RequestFailed(Exception):
    """What a request's engine stream raised (`error`: the core refused its input, the engine
    went away, ...), for `failure` to answer. Anything else raised while a response is built
    is a server bug: a 500, never a 400 blaming the request."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


NON_FINITE_MESSAGE = ("the model produced non-finite logits (NaN or Inf) for this request; "
                      "its weights or activations are broken (a bad checkpoint, an overflow)")  # fmt: skip


def failure(job: Job, e: Exception) -> APIError | None:
    """The API error for a request that failed in the engine; None for a server bug."""
    if isinstance(e, NonFiniteLogits):
        return APIError(500, NON_FINITE_MESSAGE, code="non_finite_logits")
    if not isinstance(e, RequestFailed):  # raised building the response (a parser's bug)
        return None
    e = e.error
    if isinstance(e, ParamError):
        return job.param_error(e)
    if isinstance(e, EngineUnavailableError):
        return unavailable(e)
    if isinstance(e, ValueError):  # the core refused this request's input when adding it
        return APIError(400, str(e), code="invalid_request")
    return None


class Serving:
    """Prepares and runs jobs against one AsyncEngine (the only engine object it uses)."""

    def __init__(
        self,
        engine: AsyncEngine,
        prep_threads: int = 2,
        structured: StructuredOutputs | None = None,
    ) -> None:
        self.engine = engine
        self.prep_pool = ThreadPoolExecutor(prep_threads, thread_name_prefix="pagoda-prep")
        # Large bodies (seconds of tokenizing at worst) queue on their own thread, so they
        # never hold the threads that small requests are prepared on (docs/reliability.md).
        self.bulk_pool = ThreadPoolExecutor(1, thread_name_prefix="pagoda-prep-bulk")
        # Large full responses are built and encoded here (`BULK_RESPONSE_ITEMS`)
        self.response_pool = ThreadPoolExecutor(1, thread_name_prefix="pagoda-response")
        self._strings: tuple[EngineInfo, TokenStrings] | None = None
        self.structured = structured or StructuredOutputs("", CollectorRegistry())

    def close(self) -> None:
        self.prep_pool.shutdown(wait=False, cancel_futures=True)
        self.bulk_pool.shutdown(wait=False, cancel_futures=True)
        self.response_pool.shutdown(wait=False, cancel_futures=True)

    def strings(self, info: EngineInfo) -> TokenStrings:
        if self._strings is None or self._strings[0] is not info:
            self._strings = (info, TokenStrings(info.tokenizer))
        return self._strings[1]

    async def prepare(self, endpoint: Endpoint, body: bytes) -> Job:
        """Parse and tokenize off the event loop; APIError for anything refused."""
        try:
            info = self.engine.loaded_info()
        except EngineUnavailableError as e:
            raise unavailable(e) from e
        strings = self.strings(info)

        def work() -> Job:
            job = endpoint.prepare(parse_request(body, endpoint.request_model), info, strings)
            try:  # off the event loop: scanning 2 M token ids takes a second
                self.engine.check_prompts(info, job.prompts, job.params)
            except ParamError as e:
                raise job.param_error(e) from e
            if job.params.bad_words:  # here, not on the engine's step loop (up to seconds)
                try:
                    ids = bad_words_token_ids(job.params.bad_words, info.tokenizer,
                                              info.vocab_size)  # fmt: skip
                except ValueError as e:
                    raise job.param_error(ParamError("bad_words", str(e))) from e
                job.params.bad_words_token_ids = ids  # the job's own params: no re-check
            if job.params.allowed_token_ids is not None and job.params.bad_words_token_ids:
                try:  # the bad words' part (check_prompts checked the rest)
                    check_bans_leave_tokens(job.params, info.tokenizer.eos_token_ids,
                                            info.vocab_size, job.params.bad_words_token_ids)  # fmt: skip
                except ParamError as e:
                    raise job.param_error(e) from e
            return job

        pool = self.prep_pool if len(body) <= BULK_BODY_BYTES else self.bulk_pool
        job = await asyncio.get_running_loop().run_in_executor(pool, work)
        spec = job.params.structured_outputs
        if spec is not None:  # the grammar, compiled on the compiler's threads (time-bounded)
            try:
                compiled = await self.structured.compile(info, spec)
            except ParamError as e:
                raise job.param_error(e) from e
            job.params = job.params.with_grammar(compiled)
        return job

    def submit(self, job: Job) -> None:
        """Add the job's engine requests (all or none); refusals become 400s and 503s."""
        try:
            job.streams = self.engine.add_requests(
                job.prompts, job.params, job.id, checked=True, arrival_time=job.arrival_time
            )
        except ParamError as e:
            raise job.param_error(e) from e
        except EngineUnavailableError as e:
            raise unavailable(e) from e
        if job.params.structured_outputs is not None:
            self.structured.count(job.params.structured_outputs)

    def abort(self, job: Job) -> None:
        for s in job.streams or ():
            self.engine.abort(s.request_id)

    async def _outputs(self, job: Job) -> AsyncIterator[tuple[int, StepOutput]]:
        """(choice index, delta) from every prompt's stream, as they come."""
        streams, n = job.streams or [], job.params.n
        if len(streams) == 1:
            try:
                async for out in streams[0]:
                    if out.finish_reason == "error":
                        raise NonFiniteLogits(out.request_id)
                    yield out.index, out
            except NonFiniteLogits:
                raise
            except Exception as e:  # the stream's own failure (the consumer's are not here)
                raise RequestFailed(e) from e
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(i: int, s: RequestStream) -> None:
            try:
                async for out in s:
                    queue.put_nowait((i * n + out.index, out))
            except Exception as e:
                queue.put_nowait((i, e))
            queue.put_nowait((i, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        try:
            left = len(tasks)
            while left:
                idx, item = await queue.get()
                if item is None:
                    left -= 1
                elif isinstance(item, Exception):
                    raise RequestFailed(item) from item
                elif item.finish_reason == "error":
                    raise NonFiniteLogits(item.request_id)
                else:
                    yield idx, item
        finally:
            for t in tasks:
                t.cancel()

    @staticmethod
    def _usage(
        job: Job, tokens: list[int], cached: list[int], ids: list[list[int]]
    ) -> dict[str, Any]:
        """Usage; `cached`: each prompt's cached tokens (its choices share the prompt, and
        the prompt is counted once, as are its cached tokens); `ids`: each choice's output
        tokens, where the endpoint counts some of them (`Endpoint.usage_details`)."""
        prompt = sum(len(p) for p in job.prompts)
        out = sum(tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": out,
            "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": sum(cached)},
            **job.endpoint.usage_details(job, ids),
        }

    async def full_response(self, job: Job) -> bytes:
        """The whole response as JSON; a failure in the engine is raised as its APIError."""
        try:
            return await self._full_response(job)
        except Exception as e:
            err = failure(job, e)
            if err is None and isinstance(e, RequestFailed):
                raise e.error from e  # the engine's own failure, by its name (the guard's 500)
            if err is None:
                raise
            raise err from e

    async def _full_response(self, job: Job) -> bytes:
        k = job.num_choices
        texts = [""] * k
        lps: list[list] = [[] for _ in range(k)]
        tokens, finish, stop = [0] * k, [None] * k, [None] * k
        cached = [0] * len(job.prompts)
        ids: list[list[int]] = [[] for _ in range(k)]
        keep_ids = bool(job.reasoning)  # reasoning_tokens: 0 where the reply does not think
        for s in job.streams or ():
            s.wake_at_end = True  # no wake-up per step: the deltas are merged for us
        async for idx, o in self._outputs(job):
            texts[idx] += o.new_text
            if keep_ids:
                ids[idx].extend(o.new_token_ids)
            lps[idx].extend(o.new_logprobs)
            tokens[idx] = 0 if job.echo_only else o.num_output_tokens
            if o.prompt_logprobs is not None:
                job.prompt_logprobs.setdefault(idx // job.params.n, o.prompt_logprobs)
            if o.finished:
                finish[idx], stop[idx] = o.finish_reason, o.stop_reason
                j = idx // job.params.n
                cached[j] = max(cached[j], o.num_cached_tokens)

        def build() -> bytes:
            ep = job.endpoint
            choices = [ep.choice(job, i, texts[i], lps[i]) for i in range(k)]
            for i, c in enumerate(choices):
                c.update(finish_reason=ep.finish_reason(job, i, finish[i]), stop_reason=stop[i])
            usage = self._usage(job, tokens, cached, ids)
            body = ep.response_body(job, choices, usage)  # the Responses API's own shape
            if body is not None:
                return body
            head = {**ep.head(job, chunk=False), **ep.response_fields(job)}
            return response_json(head, choices, usage)

        items = sum(map(len, lps)) * (1 + (job.params.logprobs or 0))
        items += (
            sum(map(len, job.prompt_logprobs.values()))
            * job.params.n
            * (1 + (job.params.prompt_logprobs or 0))
        )
        if items + sum(map(len, texts)) // 100 <= BULK_RESPONSE_ITEMS:
            return build()
        return await asyncio.get_running_loop().run_in_executor(self.response_pool, build)

    async def stream_response(self, job: Job) -> AsyncIterator[bytes]:
        """SSE chunks; the last is `data: [DONE]`. Errors after the start become an error event."""
        ep = job.endpoint
        head = ep.head(job, chunk=True)
        totals = StreamTotals(job)

        def chunk(choice: dict[str, Any]) -> bytes:
            data = {**head, "choices": [choice]}
            if job.continuous_usage:  # vLLM's: this choice's prompt and its tokens so far
                i = choice["index"]
                prompt, out = len(job.prompts[i // job.params.n]), totals.tokens[i]
                data["usage"] = {"prompt_tokens": prompt, "completion_tokens": out,
                                 "total_tokens": prompt + out}  # fmt: skip
            elif job.include_usage:
                data["usage"] = None
            return sse(data)

        try:
            for c in ep.opening(job):
                yield chunk({**c, "finish_reason": None})
            async with aclosing(self.choice_deltas(job, totals)) as deltas:  # closed with us
                async for c in deltas:
                    yield chunk(c)
            if job.include_usage:
                yield sse({**head, "choices": [], "usage": self.usage(job, totals)})
        except Exception as e:  # headers are sent: the error becomes the stream's last event
            yield sse(stream_error(job, e).body())
        yield b"data: [DONE]\n\n"

    async def choice_deltas(self, job: Job, totals: StreamTotals) -> AsyncIterator[dict[str, Any]]:
        """Each choice delta a stream sends (`Endpoint.delta`'s, with `finish_reason`, and
        `stop_reason` on a choice's last), as the engine's outputs come (a reader that falls
        behind gets them merged: `RequestStream`); `totals` counts what usage reports."""
        ep = job.endpoint
        want_lp = job.params.logprobs is not None
        offsets, started = [0] * job.num_choices, [False] * job.num_choices
        keep_ids = bool(job.reasoning)  # reasoning_tokens: 0 where the reply does not think
        async for idx, o in self._outputs(job):
            totals.tokens[idx] = 0 if job.echo_only else o.num_output_tokens
            first, started[idx] = not started[idx], True
            if keep_ids:
                totals.ids[idx].extend(o.new_token_ids)
            if o.prompt_logprobs is not None:
                job.prompt_logprobs.setdefault(idx // job.params.n, o.prompt_logprobs)
            if not (o.new_text or o.finished or (want_lp and o.new_logprobs) or
                    (first and job.echo)):  # fmt: skip
                continue
            c = ep.delta(job, idx, o.new_text, o.new_logprobs, offsets[idx], first,
                         o.finished)  # fmt: skip
            if c is None:  # held back (a tool-call parser waits for more text)
                continue
            # text_offset counts the logprob tokens' own text, as the full response does:
            # the text sent so far lags it while a possible stop string is held back
            if o.new_logprobs:
                offsets[idx] += sum(len(job.strings.text(lp.token_id)) for lp in o.new_logprobs)
            if first:
                offsets[idx] += ep.echoed_text_length(job, idx)
            c["finish_reason"] = ep.finish_reason(job, idx, o.finish_reason) if o.finished else None
            if o.finished:
                c["stop_reason"] = o.stop_reason
                j = idx // job.params.n
                totals.cached[j] = max(totals.cached[j], o.num_cached_tokens)
            yield c

    def usage(self, job: Job, totals: StreamTotals) -> dict[str, Any]:
        """A streamed response's usage, from what `choice_deltas` counted."""
        return self._usage(job, totals.tokens, totals.cached, totals.ids)


class StreamTotals:
    """What a stream counts for its usage: each choice's output tokens (and, for a reasoning
    parser, their ids), each prompt's cached tokens."""

    def __init__(self, job: Job) -> None:
        self.tokens = [0] * job.num_choices
        self.ids: list[list[int]] = [[] for _ in range(job.num_choices)]
        self.cached = [0] * len(job.prompts)


def stream_error(job: Job, e: Exception) -> APIError:
    """The API error a stream ends with once its headers are sent (a server bug: a 500,
    logged)."""
    err = failure(job, e)
    if err is None:
        log.exception("stream %s failed", job.id)
        bug = e.error if isinstance(e, RequestFailed) else e
        err = APIError(500, f"internal error ({type(bug).__name__})", code="internal_error")
    return err
