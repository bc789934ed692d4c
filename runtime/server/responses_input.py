"""A Responses API request as the chat completion request it runs as, and chat's errors named
as the Responses API names its fields.

The messages: `instructions` as a system message, then the conversation `previous_response_id`
continues (its input and output; not its instructions, as OpenAI's), then `input` (a string is
a user message; items become messages: a `function_call` joins the assistant message before it
or makes one, a `function_call_output` is a tool message, a `reasoning` item the next assistant
message's `reasoning_content`). Tools in the flat form become chat's (`strict` true unless
given, OpenAI's default), `text.format` becomes `response_format`, `reasoning.effort` chat's
`reasoning_effort`, `max_output_tokens` its `max_tokens`.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest
from pagoda.runtime.server.request_body import validation_error
from pagoda.runtime.server.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputImage,
    InputItem,
    InputMessage,
    ReasoningItem,
    ResponsesRequest,
)
from pydantic import ValidationError

# chat's field names → the Responses API's, longest first (for params and messages)
FIELD_NAMES = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("tool_choice.function.name", "tool_choice.name"),
    ("reasoning_effort", "reasoning.effort"),
    ("tool_call_id", "call_id"),
    ("type 'image_url'", "type 'input_image'"),
)
_CHAT_NAMES = re.compile(r"messages\[(\d+)\]|tools\[(\d+)\]\.function|"
                         + "|".join(re.escape(a) for a, _ in FIELD_NAMES) + r"|\bmessages\b")  # fmt: skip
# the engine's field names (`SamplingParams`' ParamErrors) as this API's
RENAMES = {"prompt": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
           "response_format.json_schema.schema": "text.format.schema"}  # fmt: skip


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]
                 ) -> tuple[ChatCompletionRequest, list[dict[str, Any]], list[str]]:  # fmt: skip
    """(the chat request, the conversation's messages without the instructions (what a later
    response continues), where each chat message came from in this request (for errors))."""
    conversation, origins = list(history), ["previous_response_id"] * len(history)
    if isinstance(req.input, str):
        conversation.append({"role": "user", "content": req.input})
        origins.append("input")
    else:
        _add_items(req.input, conversation, origins)
    messages = conversation
    if req.instructions is not None:
        messages = [{"role": "system", "content": req.instructions}, *conversation]
        origins = ["instructions", *origins]
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
        "stream": req.stream, "user": req.user, "service_tier": req.service_tier,
        "safety_identifier": req.safety_identifier, "prompt_cache_key": req.prompt_cache_key,
        "parallel_tool_calls": req.parallel_tool_calls,
        "mm_processor_kwargs": req.mm_processor_kwargs,
    }  # fmt: skip
    if req.tools:
        body["tools"] = [{"type": "function", "function": chat_function(t)} for t in req.tools]
    if isinstance(req.tool_choice, str):
        body["tool_choice"] = req.tool_choice
    elif req.tool_choice is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None:
        body["response_format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            spec = {"name": fmt.name, "schema": fmt.schema_, "description": fmt.description,
                    "strict": fmt.strict}  # fmt: skip
            body["response_format"]["json_schema"] = {k: v for k, v in spec.items()
                                                      if v is not None}  # fmt: skip
    if req.reasoning is not None and req.reasoning.effort is not None:
        body["reasoning_effort"] = req.reasoning.effort
    body = {k: v for k, v in body.items() if v is not None}
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise responses_error(validation_error(e, ChatCompletionRequest), origins) from e
    except APIError as e:
        raise responses_error(e, origins) from e
    return chat, conversation, origins


def chat_function(tool: FunctionTool) -> dict[str, Any]:
    """A flat function tool as chat's `function` (`strict` true where not given: OpenAI's
    default for the Responses API)."""
    out = {"name": tool.name, "description": tool.description, "parameters": tool.parameters,
           "strict": tool.strict is not False}  # fmt: skip
    return {k: v for k, v in out.items() if v is not None}


def _add_items(items: list[InputItem], messages: list[dict[str, Any]], origins: list[str]) -> None:
    thought: tuple[int, str] | None = None  # a reasoning item waiting for its message
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, ReasoningItem):
            parts = item.content if item.content is not None else item.summary
            thought = (i, "\n".join(p.text for p in parts))
            continue
        if isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text(item.output)})  # fmt: skip
            origins.append(where)
            continue
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            last = messages[-1] if messages and origins[-1].startswith("input[") else None
            if last is not None and last["role"] == "assistant" and thought is None:
                last.setdefault("tool_calls", []).append(call)  # one reply: text, then calls
                continue
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            assert isinstance(item, InputMessage)
            message = {"role": item.role, "content": _text(item.content)}
        if thought is not None:
            if message["role"] != "assistant":
                _misplaced(thought[0])
            message["reasoning_content"], thought = thought[1], None
        messages.append(message)
        origins.append(where)
    if thought is not None:
        _misplaced(thought[0])


def _misplaced(i: int) -> None:
    raise APIError(400, f"input[{i}]: a reasoning item must come right before the assistant "
                   "message or function call it led to", param=f"input[{i}]",
                   code="invalid_value")  # fmt: skip


def _text(content: Any) -> str | list[dict[str, Any]]:
    """A string, or the parts as chat's parts: texts (chat joins them, one a line) and images
    (`image_url`)."""
    if isinstance(content, str):
        return content
    return [{"type": "image_url", "image_url": {"url": p.image_url, "detail": p.detail}}
            if isinstance(p, InputImage) else {"type": "text", "text": p.text}
            for p in content]  # fmt: skip


def responses_error(e: APIError, origins: list[str]) -> APIError:
    """`e` (chat's) with its field names as the Responses API's: `messages[3]` as the input
    item (or `instructions`, `previous_response_id`) it came from, `response_format` as
    `text.format`, ..."""

    def rename(text: str) -> str:
        def one(m: re.Match) -> str:
            if m.group(1) is not None:
                i = int(m.group(1))
                return origins[i] if i < len(origins) else "input"
            if m.group(2) is not None:
                return f"tools[{m.group(2)}]"
            if m.group(0) == "messages":
                return "input"
            return dict(FIELD_NAMES)[m.group(0)]

        return _CHAT_NAMES.sub(one, text)

    param = rename(e.param) if e.param else e.param
    return APIError(e.status, rename(e.message), param=param, code=e.code, headers=e.headers)
