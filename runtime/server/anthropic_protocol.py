"""Anthropic's Messages API request (`POST /v1/messages`, `/v1/messages/count_tokens`): its
schema, and what is refused.

Types are checked strictly, as chat's are (`protocol.py`). A field this server does not honour
is a 400 naming it (unknown fields, Anthropic's server-side features: `container`,
`mcp_servers`, `context_management`, ...), never silently ignored; so are content blocks other
than text, images (a base64 or URL source), tool use and its results, and thinking sent back,
and tools other than custom ones (Anthropic's server tools: web search, code execution, ...).
`cache_control` is accepted wherever Anthropic takes it (`ephemeral`): it asks for what the
prefix cache does for every prompt.

Each content block and tool is validated by its own model (`type` picks it), so an error names
the block (`messages[1].content[2].tool_use_id`), not a branch of a union.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pagoda.runtime.server.protocol import APIError, _Strict, shorten
from pagoda.runtime.server.request_body import validation_error
from pydantic import BaseModel, Field, ValidationError, model_validator

MIN_THINKING_BUDGET = 1024  # Anthropic's lower bound of `thinking.budget_tokens`
MESSAGES_PATH = "/v1/messages"
# an HTTP status → Anthropic's error type (anything else: invalid_request_error)
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}  # fmt: skip


def error_body(e: APIError) -> dict[str, Any]:
    """`e` as Anthropic's error body (the answer of every error on `MESSAGES_PATH`'s routes)."""
    kind = ERROR_TYPES.get(e.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def messages_path(path: str) -> bool:
    """Whether `path` is one of the Messages API's (`/v1/messages` and the paths under it)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_shape(path: str, e: APIError) -> dict[str, Any]:
    """The error body a route answers: Anthropic's on the Messages API's paths, else OpenAI's."""
    return error_body(e) if messages_path(path) else e.body()


class CacheControl(_Strict):
    """A cache breakpoint: every prompt's prefix is cached here, so it asks for nothing more."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None  # a reply's, sent back: must be empty

    @model_validator(mode="after")
    def _no_citations(self) -> TextBlock:
        if self.citations:
            raise APIError(400, "citations are not supported (send them back empty)",
                           param="citations", code="unsupported_parameter")  # fmt: skip
        return self


class Base64Source(_Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(_Strict):
    type: Literal["url"]
    url: str


class ImageBlock(_Strict):
    """An image (a vision model's only: chat answers a 400 for a model that reads text only)."""

    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None

    @property
    def url(self) -> str:
        s = self.source
        return s.url if isinstance(s, URLSource) else f"data:{s.media_type};base64,{s.data}"


class ToolUseBlock(_Strict):
    """An assistant's tool call, sent back."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Strict):
    """A tool's result (a chat `tool` message); `is_error` writes it as `Error: ...`."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        parts = data.get("content") if isinstance(data, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise APIError(400, f"content[{j}]: a tool_result's content holds text blocks "
                               f"only here, not {shorten(str(kind), 40)!r}",
                               param=f"content[{j}].type", code="unsupported_content")  # fmt: skip
        return data


class ThinkingBlock(_Strict):
    """A reply's thinking, sent back: the assistant message's `reasoning_content` (`signature`:
    this server's, an empty string, which signs nothing)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


# the blocks each role's messages may hold
BLOCKS: dict[str, dict[str, type[BaseModel]]] = {
    "user": {"text": TextBlock, "image": ImageBlock, "tool_result": ToolResultBlock},
    "assistant": {"text": TextBlock, "tool_use": ToolUseBlock, "thinking": ThinkingBlock},
}
Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Any]  # blocks, each validated by `_blocks`


class CustomTool(_Strict):
    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    cache_control: CacheControl | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise APIError(400, "tool_choice.name is given with type \"tool\", and only then",
                           param="tool_choice.name", code="invalid_value")  # fmt: skip
        if self.type == "none" and self.disable_parallel_tool_use is not None:
            raise APIError(400, "tool_choice.disable_parallel_tool_use is not read with type "
                           '"none"', param="tool_choice.disable_parallel_tool_use",
                           code="invalid_value")  # fmt: skip
        return self


class Thinking(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None

    @model_validator(mode="after")
    def _budget_with_enabled(self) -> Thinking:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise APIError(400, 'thinking.budget_tokens is given with type "enabled", and only '
                           "then", param="thinking.budget_tokens", code="invalid_value")  # fmt: skip
        if self.budget_tokens is not None and self.budget_tokens < MIN_THINKING_BUDGET:
            raise APIError(400, f"thinking.budget_tokens: must be at least {MIN_THINKING_BUDGET}",
                           param="thinking.budget_tokens", code="invalid_value")  # fmt: skip
        return self


class Metadata(_Strict):
    user_id: str | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    """`format`: the reply is JSON the schema holds (chat's `response_format` json_schema, the
    structured-outputs engine); `effort`: the chat template's `reasoning_effort` (chat's rule:
    low, medium or high, a 400 for a template that does not read it)."""

    format: OutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(_Strict):
    """`/v1/messages/count_tokens`: what the prompt is made of."""

    error_hints: ClassVar[dict[str, str]] = {
        "system": "system must be a string or a list of text blocks",
    }

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Any] | None = None  # CustomTool each (`_by_type`)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _blocks_and_tools(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("messages") == []:
            raise APIError(400, "messages: at least one message is required", param="messages",
                           code="empty_array")  # fmt: skip
        if isinstance(data.get("messages"), list):
            data = {**data, "messages": [_blocks(m, i) for i, m in enumerate(data["messages"])]}
        if isinstance(data.get("tools"), list):
            data["tools"] = [_tool(t, i) for i, t in enumerate(data["tools"])]
        return data

    @model_validator(mode="after")
    def _choice_needs_tools(self) -> CountTokensRequest:
        if self.tool_choice is not None and self.tool_choice.type != "none" and not self.tools:
            raise APIError(400, "tool_choice is only allowed when tools are given",
                           param="tool_choice", code="invalid_value")  # fmt: skip
        return self


class MessagesRequest(CountTokensRequest):
    """`/v1/messages`: the prompt, and how to sample the reply."""

    max_tokens: int = Field(ge=1)
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)  # Anthropic's range
    top_p: float | None = None
    top_k: int | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: both are it

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if budget is not None and budget >= self.max_tokens:
            raise APIError(400, "thinking.budget_tokens must be less than max_tokens",
                           param="thinking.budget_tokens", code="invalid_value")  # fmt: skip
        return self


def _blocks(message: Any, i: int) -> Any:
    """Message `i` with each content block validated by the model its `type` and the message's
    role name; a block of another type is a 400 naming it."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    models = BLOCKS.get(message.get("role"))  # type: ignore[arg-type]
    if models is None:
        return message  # the role's own error, from `Message`
    out = []
    for j, block in enumerate(message["content"]):
        where = f"messages[{i}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        model = models.get(kind) if isinstance(kind, str) else None
        if model is None:
            served = ", ".join(models)
            raise APIError(400, f"{where}: content blocks of type {shorten(str(kind), 40)!r} are "
                           f"not supported in {message['role']} messages here (only {served})",
                           param=f"{where}.type", code="unsupported_content")  # fmt: skip
        out.append(_validate(model, block, where))
    return {**message, "content": out}


def _tool(tool: Any, i: int) -> Any:
    where = f"tools[{i}]"
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind not in (None, "custom"):
        raise APIError(400, f"{where}: tools of type {shorten(str(kind), 40)!r} are not supported "
                       "here (Anthropic's server tools run on Anthropic's servers; only custom "
                       "tools)", param=f"{where}.type", code="unsupported_parameter")  # fmt: skip
    return _validate(CustomTool, tool, where)


def _validate(model: type[BaseModel], data: Any, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, model, where) from e
    except APIError as e:  # a validator's own: its param is relative to the block
        raise APIError(400, f"{where}.{e.message}", param=f"{where}.{e.param}",
                       code=e.code) from e  # fmt: skip
