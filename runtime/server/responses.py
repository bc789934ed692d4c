"""`/v1/responses`: OpenAI's Responses API, run as the chat completion it amounts to.

A request becomes a chat request (`responses_input.py`) and runs through chat's path (its
template, tools and their parsers, a reasoning model's thinking split off, structured outputs,
metrics); chat's reply becomes the response's output items (`responses_output.py`). A streamed
response sends OpenAI's events, each with its `sequence_number`: response.created,
response.in_progress, then for each item output_item.added, its part and text deltas (or a
call's argument deltas) and their done events, output_item.done, and last response.completed
(response.incomplete where max_output_tokens cut it short; an error event and response.failed
where it failed). A client that goes away aborts the request, as chat's.

Stored responses (`store`, by default): `GET /v1/responses/{id}` and `DELETE` them, and
`previous_response_id` continues one's conversation (`responses_store.py`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.endpoint import Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, shorten
from pagoda.runtime.server.responses_input import (
    RENAMES,
    chat_function,
    chat_request,
    responses_error,
)
from pagoda.runtime.server.responses_output import ResponseOutput, as_messages, usage
from pagoda.runtime.server.responses_protocol import ResponsesRequest
from pagoda.runtime.server.responses_store import ResponseStore
from pagoda.runtime.server.serving import Serving, StreamTotals, stream_error, to_json


class ResponseState:
    """What a response echoes of its request, and the conversation it stores."""

    def __init__(self, req: ResponsesRequest, job: Job, conversation: list[dict[str, Any]]):
        self.req, self.job, self.conversation = req, job, conversation
        self.id = job.id
        self.created_at = job.created

    def response(self, status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None, error: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:  # fmt: skip
        req, params = self.req, self.job.params
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        choice = req.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": error,
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

    def prepare(self, req: ResponsesRequest, info: EngineInfo, strings: TokenStrings) -> Job:
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            history = self.store.get(req.previous_response_id, "previous_response_id").messages
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
        out.close(status)
        return self._finish(job.api_state, status, out, usage(usage_))

    def stream(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        return self._events(serving, job)

    async def _events(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        state: ResponseState = job.api_state
        frame, out, totals = _framer(), ResponseOutput(), StreamTotals(job)
        yield frame({"type": "response.created", "response": state.response("in_progress", [],
                                                                             None)})  # fmt: skip
        yield frame({"type": "response.in_progress",
                     "response": state.response("in_progress", [], None)})  # fmt: skip
        status = "completed"
        try:
            async with aclosing(serving.choice_deltas(job, totals)) as deltas:
                async for c in deltas:
                    events = out.feed(c["delta"])
                    if c["finish_reason"] is not None:
                        status = _status(c["finish_reason"])
                        events += out.close(status)
                    for event in events:
                        yield frame(event)
            body = self._finish(state, status, out, usage(serving.usage(job, totals)))
        except Exception as e:  # headers are sent: the error ends the stream
            err = stream_error(job, e)
            yield frame({"type": "error", "code": err.code, "message": err.message,
                         "param": err.param})  # fmt: skip
            if out.items:  # the item cut short, in the failed response's output
                out.close("incomplete")
            failed = state.response("failed", out.items, None,
                                    {"code": err.code or "server_error", "message": err.message})  # fmt: skip
            yield frame({"type": "response.failed", "response": failed})
            return
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield frame({"type": kind, "response": body}, raw=True)

    def _finish(self, state: ResponseState, status: str, out: ResponseOutput,
                usage_: dict[str, Any]) -> bytes:  # fmt: skip
        """The response's JSON, stored if its request asks (`store`)."""
        body = to_json(state.response(status, out.items, usage_))
        if state.req.store:
            messages = state.conversation + as_messages(out.items)
            size = sum(len(str(m.get("content") or "")) for m in messages) + 200 * len(messages)
            self.store.put(state.id, body, messages, size)
        return body


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


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


def add_response_routes(app: FastAPI, endpoint: ResponsesEndpoint,
                        authorize: Callable[[Request], None]) -> None:  # fmt: skip
    """`GET` and `DELETE /v1/responses/{id}` (`POST /v1/responses` is an OpenAI route of
    `api.py`'s); query parameters (OpenAI's `stream`, `include`, `starting_after`, for
    responses run in the background) are refused."""

    def refuse_query(raw: Request) -> None:
        for name in raw.query_params:
            raise APIError(400, f"query parameter {shorten(name, 60)!r} is not supported here "
                           "(responses are not run in the background)", param=shorten(name, 60),
                           code="unsupported_parameter")  # fmt: skip

    @app.get("/v1/responses/{response_id}", include_in_schema=False)
    async def get(raw: Request, response_id: str) -> Response:
        authorize(raw)
        refuse_query(raw)
        body = endpoint.store.get(response_id).body
        return Response(body, media_type="application/json")

    @app.delete("/v1/responses/{response_id}", include_in_schema=False)
    async def delete(raw: Request, response_id: str) -> dict[str, Any]:
        authorize(raw)
        refuse_query(raw)
        endpoint.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}
