"""`/v1/messages`: Anthropic's Messages API, run as the chat completion it amounts to.

A request becomes a chat request (`anthropic_input.py`) and runs through chat's path (its
template, tools and their parsers, a reasoning model's thinking split off, metrics); chat's
reply becomes the message's content blocks (`anthropic_output.py`). A streamed message sends
Anthropic's events, each with its `event:` line: message_start, ping, then per block
content_block_start, its deltas (text_delta, thinking_delta, input_json_delta) and
content_block_stop, then message_delta (the stop reason and the usage) and message_stop; an
error once the stream has begun is an `error` event. A client that goes away aborts the
request, as chat's. `POST /v1/messages/count_tokens` counts the prompt's tokens (chat's
rendering of it, as `/tokenize` does). Errors, on these paths, are Anthropic's body:
`{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from pagoda.runtime.engine.admission import EngineUnavailableError
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.server import tools
from pagoda.runtime.server.anthropic_input import RENAMES, chat_request, messages_error
from pagoda.runtime.server.anthropic_output import (
    StreamBlocks,
    content_blocks,
    message,
    stop_of,
    usage_of,
)
from pagoda.runtime.server.anthropic_protocol import (
    MESSAGES_PATH,
    CountTokensRequest,
    MessagesRequest,
    error_body,
)
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.endpoint import Job
from pagoda.runtime.server.http import read_body
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.serving import Serving, StreamTotals, stream_error, to_json, unavailable


class MessagesEndpoint(ChatEndpoint):
    request_model = MessagesRequest
    object_name = "message"
    chunk_object_name = "message"
    id_prefix = "msg"
    renames = RENAMES

    def prepare(self, req: MessagesRequest, info: EngineInfo, strings: TokenStrings) -> Job:
        chat, origins = self.chat(req, info)
        try:
            job = super().prepare(chat, info, strings)
        except APIError as e:
            raise messages_error(e, origins) from e
        job.id = f"msg_{uuid.uuid4().hex}"
        return job

    def chat(self, req: CountTokensRequest, info: EngineInfo) -> tuple[Any, list[str]]:
        variables = info.tokenizer.variables_for(bool(req.tools))
        return chat_request(req, variables, self.reasoning_parser is not None)

    def count_tokens(self, req: CountTokensRequest, info: EngineInfo) -> dict[str, int]:
        """The prompt's tokens, as `/v1/messages` would feed the engine (images' placeholders
        expanded)."""
        self.resolve_model(req.model)
        chat, origins = self.chat(req, info)
        try:
            template = info.tokenizer.template_for(bool(chat.tools))
            setup = tools.prepare(chat, template, self.tool_parser, info.tokenizer)
            return {"input_tokens": len(self.prompt(chat, info, setup)[2])}
        except APIError as e:
            raise messages_error(e, origins) from e

    def response_body(self, job: Job, choices: list[dict[str, Any]],
                      usage: dict[str, Any]) -> bytes:  # fmt: skip
        (choice,) = choices  # n is 1
        stop = stop_of(choice["finish_reason"], choice.get("stop_reason"))
        blocks = content_blocks(choice["message"])
        return to_json(message(job.id, job.model, blocks, stop, usage_of(usage)))

    def stream(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        return self._events(serving, job)

    async def _events(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        totals, blocks = StreamTotals(job), StreamBlocks()
        opening = {"input_tokens": len(job.prompts[0]), "output_tokens": 0}
        yield sse({"type": "message_start",
                   "message": message(job.id, job.model, [], (None, None), opening)})  # fmt: skip
        yield sse({"type": "ping"})
        try:
            stop: tuple[Any, Any] = ("end_turn", None)
            async with aclosing(serving.choice_deltas(job, totals)) as deltas:
                async for c in deltas:
                    events = blocks.feed(c["delta"])
                    if c["finish_reason"] is not None:
                        stop = stop_of(c["finish_reason"], c.get("stop_reason"))
                    for event in events:
                        yield sse(event)
            for event in blocks.close():
                yield sse(event)
            usage = usage_of(serving.usage(job, totals))
        except Exception as e:  # headers are sent: the error ends the stream
            err = e if isinstance(e, APIError) else stream_error(job, e)
            yield sse(error_body(err))
            return
        yield sse({"type": "message_delta",
                   "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]}, "usage": usage})  # fmt: skip
        yield sse({"type": "message_stop"})


def sse(event: dict[str, Any]) -> bytes:
    """An SSE event with Anthropic's `event:` line (its `type`)."""
    return b"event: " + event["type"].encode() + b"\ndata: " + to_json(event) + b"\n\n"


def add_count_tokens_route(app: FastAPI, serving: Serving, endpoint: MessagesEndpoint,
                           authorize: Callable[[Request], None],
                           max_request_bytes: int) -> None:  # fmt: skip
    @app.post(f"{MESSAGES_PATH}/count_tokens", include_in_schema=False)
    async def count_tokens(raw: Request) -> dict[str, int]:
        authorize(raw)
        body = await read_body(raw, max_request_bytes)
        try:
            info = serving.engine.loaded_info()
        except EngineUnavailableError as e:
            raise unavailable(e) from e

        def work() -> dict[str, int]:
            return endpoint.count_tokens(parse_request(body, CountTokensRequest), info)

        return await asyncio.get_running_loop().run_in_executor(serving.prep_pool, work)
