"""`/v1/responses`: OpenAI's Responses API, run as the chat completion it amounts to.

A request becomes a chat request (`responses_input.py`) and runs through chat's path (its
template, tools and their parsers, a reasoning model's thinking split off, structured outputs,
metrics); chat's reply becomes the response's output items (`responses_output.py`). A streamed
response sends OpenAI's events, each with its `sequence_number`: response.created,
response.in_progress, then for each item output_item.added, its part and text deltas (or a
call's argument deltas) and their done events, output_item.done, and last response.completed
(response.incomplete where max_output_tokens cut it short; an error event and response.failed
where it failed; nothing more for one cancelled, whose status is `cancelled`). A client that
goes away aborts the request, as chat's (not a background one's).

Stored responses (`store`, by default): `GET /v1/responses/{id}` and `DELETE` them, list
their input items, and `previous_response_id` continues one's conversation
(`responses_store.py`, routes in `responses_routes.py`). `background` runs a response without
its client (`responses_background.py`): the POST answers at once, the run stores what it
reaches, `cancel` aborts it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.endpoint import Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.responses_background import BackgroundRun, BackgroundRuns
from pagoda.runtime.server.responses_input import (
    RENAMES,
    chat_function,
    chat_request,
    responses_error,
)
from pagoda.runtime.server.responses_items import input_items
from pagoda.runtime.server.responses_output import ResponseOutput, as_messages, usage
from pagoda.runtime.server.responses_protocol import ResponsesRequest
from pagoda.runtime.server.responses_store import ResponseStore
from pagoda.runtime.server.serving import Serving, StreamTotals, stream_error, to_json

log = logging.getLogger("pagoda.server")


class ResponseState:
    """What a response echoes of its request, and the conversation it stores."""

    def __init__(self, req: ResponsesRequest, job: Job, conversation: list[dict[str, Any]]):
        self.req, self.job, self.conversation = req, job, conversation
        self.id = job.id
        self.created_at = job.created
        self.output = ResponseOutput()  # a stream's items so far
        # the response's JSON at its last change of status, and once ended its conversation
        self.body: bytes | None = None
        self.messages: list[dict[str, Any]] | None = None

    def json(self, status: str, output: list[dict[str, Any]] | None = None,
             usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
             ) -> bytes:  # fmt: skip
        """The response at `status` as JSON, kept as `body`."""
        self.body = to_json(self.response(status, output or [], usage, error))
        return self.body

    def response(self, status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None, error: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:  # fmt: skip
        req, params = self.req, self.job.params
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        choice = req.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": req.background, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None, "metadata": req.metadata or {}, "model": self.job.model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": None},
            "service_tier": "default", "store": req.store,
            "temperature": params.temperature, "top_p": params.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                     else {"type": "text"}},
            "tool_choice": choice.model_dump() if choice is not None and
            not isinstance(choice, str) else choice or "auto",
            "tools": [{"type": "function", **chat_function(t)} for t in req.tools or ()],
            "truncation": "disabled", "usage": usage, "user": req.user,
        }  # fmt: skip


class ResponsesEndpoint(ChatEndpoint):
    request_model = ResponsesRequest
    object_name = "response"
    chunk_object_name = "response"
    id_prefix = "resp"
    renames = RENAMES

    def __init__(self, *args: Any, store: ResponseStore | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.store = store or ResponseStore()
        self.runs = BackgroundRuns()

    def prepare(self, req: ResponsesRequest, info: EngineInfo, strings: TokenStrings) -> Job:
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            previous = self.store.get(req.previous_response_id, "previous_response_id")
            if previous.running:
                raise APIError(400, f"Previous response '{req.previous_response_id}' is still "
                               "in progress; continue it once it has ended",
                               param="previous_response_id", code="invalid_value")  # fmt: skip
            history = previous.messages
        chat, conversation, origins = chat_request(req, history)
        try:
            job = super().prepare(chat, info, strings)
        except APIError as e:
            raise responses_error(e, origins) from e
        job.id = f"resp_{uuid.uuid4().hex}"
        job.api_state = ResponseState(req, job, conversation)
        return job

    def response_body(self, job: Job, choices: list[dict[str, Any]],
                      usage_: dict[str, Any]) -> bytes:  # fmt: skip
        (choice,) = choices  # n is 1
        out = ResponseOutput()
        out.feed_message(choice["message"])
        status = _status(choice["finish_reason"])
        out.close(_item_status(status))
        return self._finish(job.api_state, status, out, usage(usage_))

    def stream(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        return self._events(serving, job)

    async def _events(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        state: ResponseState = job.api_state
        frame, out, totals = _framer(), state.output, StreamTotals(job)
        first = "queued" if state.req.background else "in_progress"
        yield frame({"type": "response.created", "response": state.response(first, [], None)})
        yield frame({"type": "response.in_progress", "response": state.json("in_progress")},
                    raw=True)  # fmt: skip
        status = "completed"
        try:
            async with aclosing(serving.choice_deltas(job, totals)) as deltas:
                async for c in deltas:
                    events = out.feed(c["delta"])
                    if c["finish_reason"] is not None:
                        status = _status(c["finish_reason"])
                        events += out.close(_item_status(status))
                    for event in events:
                        yield frame(event)
            body = self._finish(state, status, out, usage(serving.usage(job, totals)))
        except Exception as e:  # headers are sent: the error ends the stream
            err = stream_error(job, e)
            yield frame({"type": "error", "code": err.code, "message": err.message,
                         "param": err.param})  # fmt: skip
            if out.items:  # the item cut short, in the failed response's output
                out.close("incomplete")
            failed = state.json("failed", out.items, None,
                                {"code": err.code or "server_error", "message": err.message})  # fmt: skip
            yield frame({"type": "response.failed", "response": failed}, raw=True)
            return
        if status == "cancelled":  # OpenAI's events have no cancellation: the stream ends
            return
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield frame({"type": kind, "response": body}, raw=True)

    def _finish(self, state: ResponseState, status: str, out: ResponseOutput,
                usage_: dict[str, Any]) -> bytes:  # fmt: skip
        """The response's JSON, stored if its request asks (`store`; a background response's
        run stores its own)."""
        body = state.json(status, out.items, usage_)
        state.messages = state.conversation + as_messages(out.items)
        if state.req.store and not state.req.background:
            items = input_items(state.req)
            self.store.put(state.id, body, state.messages, _size(state.messages, items), items)
        return body

    # -- background responses -------------------------------------------------------------------
    def detach(self, serving: Serving, job: Job) -> bytes | AsyncIterator[bytes] | None:
        """A background response: stored `queued` and run without its client; the answer is
        that JSON, or its stream's events (followed, not owned: the run goes on without a
        reader). None for any other response."""
        state: ResponseState = job.api_state
        if not state.req.background:
            return None
        items = input_items(state.req)
        run = BackgroundRun(state.id, state.json("queued"), self.store, state.req.stream,
                            lambda: serving.abort(job))  # fmt: skip
        self.store.put(state.id, run.body, [], _size([], items), items, run)
        self.runs.start(run, self._background(serving, job, run))
        return run.follow(-1) if state.req.stream else run.body

    async def _background(self, serving: Serving, job: Job, run: BackgroundRun) -> None:
        state: ResponseState = job.api_state
        try:
            if run.keep_events:
                async with aclosing(self._events(serving, job)) as frames:
                    async for f in frames:
                        run.add(f)
                        run.set_body(state.body)
            else:
                run.set_body(state.json("in_progress"))
                await serving.full_response(job)  # `_finish` keeps its JSON and messages
        except asyncio.CancelledError:  # shutdown, past its wait: what it had is kept
            if state.output.items:
                state.output.close("incomplete")
            state.json("cancelled", state.output.items)
            raise
        except Exception as e:  # the engine's failure (an APIError), or a bug (a 500)
            err = e if isinstance(e, APIError) else None
            if err is None:
                log.exception("background response %s failed", state.id)
                err = APIError(500, f"internal error ({type(e).__name__})", code="internal_error")
            state.json("failed", [], None, {"code": err.code or "server_error",
                                            "message": err.message})  # fmt: skip
        finally:
            serving.abort(job)  # no-op once finished
            run.end(state.body, state.messages, _size(state.messages or [], ()))


def _status(finish_reason: str | None) -> str:
    """A response's status by its reply's finish reason (an abort: `cancel`, a drain)."""
    return {"length": "incomplete", "abort": "cancelled"}.get(finish_reason or "", "completed")


def _item_status(status: str) -> str:
    return "completed" if status == "completed" else "incomplete"


def _size(messages: list[dict[str, Any]], items: tuple[dict[str, Any], ...]) -> int:
    """A stored response's conversation and input items, in bytes (roughly)."""
    return (sum(len(str(m.get("content") or "")) for m in messages) + 200 * len(messages)
            + len(to_json(list(items))))  # fmt: skip


def _framer() -> Callable[..., bytes]:
    """SSE events numbered from 0, with OpenAI's `event:` line (`raw`: the `response` given
    as its JSON already)."""
    count = iter(range(1 << 62))

    def frame(event: dict[str, Any], raw: bool = False) -> bytes:
        kind = event["type"].encode()
        if raw:
            head = to_json({"type": event["type"], "sequence_number": next(count)})
            data = head[:-1] + b',"response":' + event["response"] + b"}"
        else:
            data = to_json({**event, "sequence_number": next(count)})
        return b"event: " + kind + b"\ndata: " + data + b"\n\n"

    return frame
