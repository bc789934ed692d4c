"""A Messages API request as the chat completion request it runs as, and chat's errors named
as the Messages API names its fields.

The messages: `system` as a system message, then each message: a user message's `tool_result`
blocks become chat `tool` messages (in their order, before the message's text and images, which
stay a user message), an assistant message's `tool_use` blocks its `tool_calls` (the input as
JSON text) and its `thinking` blocks its `reasoning_content`. A last assistant message is
continued (Anthropic's prefill: chat's `continue_final_message`). Tools become chat's function
tools (`input_schema` as `parameters`), `tool_choice` chat's (`any` is `required`, `tool` a named
function, `disable_parallel_tool_use` is `parallel_tool_calls: false`), `stop_sequences` chat's
`stop`, `metadata.user_id` its `user`, `output_config.format` its `response_format` (a
json_schema) and `output_config.effort` its `reasoning_effort`. `thinking` switches a reasoning
model's thinking through its chat template's `enable_thinking` where the template reads it
(`chat_thinking`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pagoda.runtime.server.anthropic_protocol import (
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest
from pagoda.runtime.server.request_body import validation_error
from pydantic import ValidationError


def _word(name: str) -> str:
    """A pattern matching `name` as a whole word (where it starts or ends with one)."""
    head = r"\b" if name[0].isalnum() else ""
    return head + re.escape(name) + (r"\b" if name[-1].isalnum() else "")


# chat's field names → the Messages API's (in messages)
FIELD_NAMES = {
    "tool_choice.function.name": "tool_choice.name",
    "response_format.json_schema.schema": "output_config.format.schema",
    "response_format.json_schema": "output_config.format",
    "response_format": "output_config.format",
    "reasoning_effort": "output_config.effort",
    ".parameters": ".input_schema",
    "tool_call_id": "tool_use_id",
    "'image_url'": "'image'",
    "a message with role 'tool'": "a tool_result block",
    "tool call": "tool_use",
}
_CHAT_NAMES = re.compile(r"messages\[(\d+)\]|tools\[(\d+)\]\.function|"
                         + "|".join(_word(a) for a in FIELD_NAMES))  # fmt: skip
# the engine's field names (`SamplingParams`' ParamErrors) as this API's
RENAMES = {"prompt": "messages", "stop": "stop_sequences", "user": "metadata.user_id",
           "response_format": "output_config.format",
           "response_format.json_schema.schema": "output_config.format.schema"}  # fmt: skip
THINKING_SWITCH = "enable_thinking"  # the chat template variable (Qwen3's and others')


def chat_request(req: CountTokensRequest, variables: frozenset[str], reasoning: bool
                 ) -> tuple[ChatCompletionRequest, list[str]]:  # fmt: skip
    """(the chat request, where each chat message came from (for errors)); `variables`: what
    the chat template reads, `reasoning`: whether the server splits thinking off."""
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    if req.system is not None:
        messages.append({"role": "system", "content": _parts(req.system)})
        origins.append("system")
    for i, m in enumerate(req.messages):
        for message in _chat_messages(m):
            messages.append(message)
            origins.append(f"messages[{i}]")
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.messages[-1].role == "assistant":  # prefill: the reply continues it
        if messages[-1].get("tool_calls"):
            raise APIError(400, f"messages[{len(req.messages) - 1}]: a last assistant message is "
                           "continued, so it holds text only (no tool_use)",
                           param=f"messages[{len(req.messages) - 1}]", code="invalid_value")  # fmt: skip
        body["continue_final_message"] = True
    if req.tools:
        body["tools"] = [{"type": "function", "function": _function(t)} for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
            choice.type, {"type": "function", "function": {"name": choice.name}}
        )
        if choice.disable_parallel_tool_use is not None and req.tools:
            body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    out = req.output_config
    if out is not None and out.format is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": out.format.schema_, "strict": True}}  # fmt: skip
    if out is not None:
        body["reasoning_effort"] = out.effort
    switch = chat_thinking(req, variables, reasoning)
    if switch is not None:
        body["chat_template_kwargs"] = {THINKING_SWITCH: switch}
    if isinstance(req, MessagesRequest):
        body.update(max_tokens=req.max_tokens, stream=req.stream, temperature=req.temperature,
                    top_p=req.top_p, top_k=req.top_k, stop=req.stop_sequences,
                    user=req.metadata.user_id if req.metadata else None)  # fmt: skip
    body = {k: v for k, v in body.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(body), origins
    except ValidationError as e:
        raise messages_error(validation_error(e, ChatCompletionRequest), origins) from e
    except APIError as e:
        raise messages_error(e, origins) from e


def chat_thinking(req: CountTokensRequest, variables: frozenset[str], reasoning: bool
                  ) -> bool | None:  # fmt: skip
    """The template's `enable_thinking` for `thinking` (None: not set). Without a reasoning
    parser only `disabled` is taken (such a model's reply has no thinking to return); with one,
    a template without the switch thinks as it always does, so `disabled` is refused there."""
    thinking = req.thinking
    if thinking is None:
        return None
    if not reasoning:
        if thinking.type != "disabled":
            raise APIError(400, "thinking is not supported: this model is served without "
                           "--reasoning-parser, so its replies have no thinking to return",
                           param="thinking", code="unsupported_parameter")  # fmt: skip
        return None
    if THINKING_SWITCH in variables:
        return thinking.type != "disabled"
    if thinking.type == "disabled":
        raise APIError(400, "thinking.type=disabled is not supported: this model's chat template "
                       f"has no '{THINKING_SWITCH}' switch, so the model thinks as it always "
                       "does", param="thinking.type", code="unsupported_value")  # fmt: skip
    return None


def _chat_messages(m: Message) -> list[dict[str, Any]]:
    """Message `m` as chat messages (tool results first, each its own `tool` message)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "assistant":
        text = "".join(b.text for b in m.content if isinstance(b, TextBlock))
        calls = [{"id": b.id, "type": "function",
                  "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                 for b in m.content if isinstance(b, ToolUseBlock)]  # fmt: skip
        thoughts = [b.thinking for b in m.content if isinstance(b, ThinkingBlock)]
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls
                                   else None}  # fmt: skip
        if calls:
            message["tool_calls"] = calls
        if thoughts:
            message["reasoning_content"] = "".join(thoughts)
        return [message]
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": b.tool_use_id, "content": _result(b)}
        for b in m.content if isinstance(b, ToolResultBlock)
    ]  # fmt: skip
    rest = [b for b in m.content if not isinstance(b, ToolResultBlock)]
    if rest or not out:
        out.append({"role": "user", "content": _parts(rest)})
    return out


def _parts(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """Text and image blocks as chat's parts (chat joins texts one a line)."""
    if isinstance(content, str):
        return content
    return [{"type": "image_url", "image_url": {"url": b.url}} if isinstance(b, ImageBlock)
            else {"type": "text", "text": b.text} for b in content]  # fmt: skip


def _result(block: ToolResultBlock) -> str:
    text = block.content if isinstance(block.content, str) else \
        "\n".join(b.text for b in block.content)  # fmt: skip
    return f"Error: {text}" if block.is_error else text


def _function(tool: Any) -> dict[str, Any]:
    out = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema,
           "strict": tool.strict}  # fmt: skip
    return {k: v for k, v in out.items() if v is not None}


def messages_error(e: APIError, origins: list[str]) -> APIError:
    """`e` (chat's) with its field names as the Messages API's: `messages[3]` as the message
    (or `system`) it came from, `tool_call_id` as `tool_use_id`, ..."""

    def rename(text: str) -> str:
        def one(m: re.Match) -> str:
            if m.group(1) is not None:
                i = int(m.group(1))
                return origins[i] if i < len(origins) else "messages"
            if m.group(2) is not None:
                return f"tools[{m.group(2)}]"
            return FIELD_NAMES[m.group(0)]

        return _CHAT_NAMES.sub(one, text)

    param = rename(e.param) if e.param else e.param
    text = rename(e.message)
    if param and param not in text:  # Anthropic's body has no `param`: the message names it
        text = f"{param}: {text}"
    return APIError(e.status, text, param=param, code=e.code, headers=e.headers)
