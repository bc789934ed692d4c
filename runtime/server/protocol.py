"""OpenAI request schemas and OpenAI-style errors (a body becomes one of these models in
`request_body`).

Types are checked strictly (a string where a number belongs is a 400, not a silent cast); value
ranges are checked once, by `SamplingParams`, whose `ParamError`s name the field. A field the
server does not honour is refused with a 400 naming it (as OpenAI refuses arguments it does not
know), never silently ignored: unknown fields, OpenAI's fields for features this server lacks
(`audio`, `reasoning_effort`, ...), and values of accepted fields that would change nothing here
(`store: true`, `service_tier: "flex"`, `modalities: ["audio"]`). A null for one of OpenAI's
nullable fields asks for nothing and is dropped (`null_means_default`). vLLM's retired `guided_*`
fields get a pointer to `structured_outputs`. Message fields are refused where no template
reads them (`tool_call_id` outside a tool message, `reasoning_content` outside an assistant's),
as is a tool message that answers no earlier call.

Values echoed back in messages are cut to `MAX_ECHO` characters.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# OpenAI's `type`s (the SDKs expose it as `APIError.type`): a client's mistake, a wrong key and an
# unknown model or URL are all invalid_request_error (the status and `code` tell them apart);
# the server's failures and its "overloaded, retry" 503s are server_error
HTTP_ERROR_TYPES = {
    500: "server_error",
    503: "server_error",
}
MAX_ECHO = 300  # characters of a client value repeated in an error message
MAX_LOGIT_BIAS_VALUE = 100.0  # OpenAI's range for a logit_bias value (beyond it: inf logits)


def shorten(text: str, limit: int = MAX_ECHO) -> str:
    """`text` cut to `limit` characters (with a note of how much was cut)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _scalar(value: Any) -> str:
    """A client's value as JSON when it is a scalar (cut short), else its JSON type."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return shorten(json.dumps(value), 100)
    return "an array" if isinstance(value, list) else "an object"


def retry_headers(after: int) -> dict[str, str]:
    """`Retry-After` and OpenAI's `retry-after-ms` (which its SDKs prefer), the latter spread
    over 0.5-1.5 x the former: clients refused in one burst then do not all come back at the
    same instant (a whole-second Retry-After sends them back in lockstep, to be refused again)."""
    ms = round(after * 1000 * random.uniform(0.5, 1.5))
    return {"Retry-After": str(after), "retry-after-ms": str(ms)}


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message = shorten(message, 4 * MAX_ECHO)  # messages quote values; bound the total
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = HTTP_ERROR_TYPES.get(self.status, "invalid_request_error")
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: every chunk's usage is its choice's so far
    include_obfuscation: bool | None = None  # OpenAI's; false (or null) is what this server does

    @model_validator(mode="after")
    def _continuous_needs_usage(self) -> StreamOptions:
        if self.include_obfuscation:
            raise APIError(400, "stream_options.include_obfuscation=true is not supported: this "
                           "server does not pad stream chunks (send false or leave it out)",
                           param="stream_options.include_obfuscation",
                           code="unsupported_value")  # fmt: skip
        if self.continuous_usage_stats and not self.include_usage:
            raise APIError(400, "stream_options.continuous_usage_stats needs include_usage",
                           param="stream_options.continuous_usage_stats",
                           code="invalid_value")  # fmt: skip
        return self


# Fields that clients send, accepted only with the values that ask for what this server does
# anyway: (allowed values, why others are refused)
NO_OP_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "store": ((False, None), "this server does not store completions"),
    "service_tier": (("auto", "default", None), "this server has a single service tier"),
    "modalities": ((["text"], None), "this server generates text only"),
}
# vLLM's retired guided decoding fields → the structured_outputs key that replaced them
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar", "guided_decoding_backend": None,
          "guided_whitespace_pattern": None}  # fmt: skip


class _SamplingFields(_Strict):
    """Fields shared by completions and chat completions (OpenAI's plus vLLM's extras)."""

    # OpenAI's fields whose null means "left out" (nullable in OpenAI's API and its SDK's
    # types), whether this server has them or not: a null asks for nothing, so it is dropped
    # (`n=None` from a client passing its own default through is not a 400)
    null_means_default: ClassVar[frozenset[str]] = frozenset({"n", "stream"})

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None  # vLLM's: sample only from these ids
    bad_words: list[str] | None = None  # vLLM's: words the output must not contain
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and top k
    # accepted with the values that change nothing here (NO_OP_VALUES), hints with no effect
    store: bool | None = None
    service_tier: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None  # prefix caching is automatic
    safety_identifier: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_honoured(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if any(data.get(k, 0) is None for k in cls.null_means_default):
            data = {k: v for k, v in data.items() if v is not None or
                    k not in cls.null_means_default}  # fmt: skip
        for name, (allowed, why) in NO_OP_VALUES.items():
            if name in data and data[name] not in allowed:
                raise APIError(400, f"{name}={_scalar(data[name])} is not "
                               f"supported: {why}", param=name, code="unsupported_value")  # fmt: skip
        for name, key in GUIDED.items():
            if name in data:
                hint = (f'; use "structured_outputs": {{"{key}": ...}}' if key else
                        "; structured outputs always use xgrammar here")  # fmt: skip
                raise APIError(400, f"{name} is not supported{hint}", param=name,
                               code="unsupported_parameter")  # fmt: skip
        return data

    @model_validator(mode="after")
    def _refuse_what_would_change_nothing(self) -> _SamplingFields:
        """Fields that only mean something beside another one are refused without it (as
        OpenAI and vLLM refuse them), rather than silently dropped."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true",
                           param="stream_options", code="invalid_value")  # fmt: skip
        if self.prompt_logprobs is not None and self.stream:  # vLLM refuses it too
            raise APIError(400, "prompt_logprobs is not available when stream is true (with "
                           "/v1/completions, echo with logprobs streams the prompt's logprobs)",
                           param="prompt_logprobs", code="invalid_value")  # fmt: skip
        for token, bias in (self.logit_bias or {}).items():
            if not -MAX_LOGIT_BIAS_VALUE <= bias <= MAX_LOGIT_BIAS_VALUE:  # NaN fails too
                raise APIError(
                    400, f"logit_bias values must be in [-100, 100], got {_scalar(bias)} for "
                    f"token {shorten(token, 40)!r}", param="logit_bias", code="invalid_value",
                )  # fmt: skip
        return self


class JsonSchemaSpec(_Strict):
    """OpenAI `response_format.json_schema`."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _name_as_openai_allows(self) -> JsonSchemaSpec:
        if not re.fullmatch(r"[a-zA-Z0-9_-]+", self.name):  # OpenAI's pattern (1-64: `Field`)
            raise APIError(400, "Invalid 'response_format.json_schema.name': string does not "
                           "match pattern. Expected a string that matches the pattern "
                           f"'^[a-zA-Z0-9_-]+$', got {shorten(self.name, 80)!r}",
                           param="response_format.json_schema.name", code="invalid_value")  # fmt: skip
        return self


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_only_with_its_type(self) -> ResponseFormat:
        if self.json_schema is not None and self.type != "json_schema":
            raise APIError(400, f"response_format.json_schema is only read with type "
                           f'"json_schema", not "{self.type}"', param="response_format.json_schema",
                           code="invalid_value")  # fmt: skip
        return self


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` extra: one of json, regex, choice, grammar, json_object,
    structural_tag. Unknown keys are refused (a constraint must never be silently dropped)."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool | None = None


class _StructuredFields(_SamplingFields):
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None


class CompletionRequest(_StructuredFields):
    # "must be ...": the message a wrong prompt gets (pydantic would name one union branch)
    error_hints: ClassVar[dict[str, str]] = {
        "prompt": "prompt must be a string, a list of strings, a list of token ids (integers) "
        "or a list of lists of token ids",
    }
    null_means_default = _SamplingFields.null_means_default | {"echo", "suffix"}
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # (one resolution: every one reads alike)


class ImagePart(_Strict):
    """An image (`multimodal.chat_images`): a vision model's only; others answer a 400."""

    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(_Strict):
    url: str


class VideoPart(_Strict):
    """A video (`multimodal.chat_videos`): a model that reads videos only (Qwen2-VL's); others
    answer a 400."""

    type: Literal["video_url"]
    video_url: VideoURL


class CalledFunction(_Strict):
    name: str
    arguments: str | dict[str, Any]  # OpenAI sends JSON text; an object is taken as is


class ToolCall(_Strict):
    """An assistant message's tool call, as a response gave it (`index`: a streamed call's)."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction
    index: int | None = None


# Fields of a response's message that clients send back with it: accepted while they say
# nothing (they would otherwise be dropped silently: no template renders them)
ECHOED_EMPTY = ("refusal", "audio", "function_call", "annotations")
# Roles whose messages must carry content (as OpenAI requires); an assistant's may be null
NEEDS_CONTENT = ("system", "developer", "user", "tool")
# What the `openai` SDK's parse helpers add to an assistant message, and send back when that
# message is appended to the next request: its own reading of `content` (`parsed`) and of each
# call's `arguments` (`function.parsed_arguments`). Copies of what the message carries: dropped.
SDK_COPIES = ("parsed",)
SDK_CALL_COPIES = ("parsed_arguments",)


class ChatMessage(BaseModel):
    """A message: the fields chat templates read (`name`, `tool_calls`, `tool_call_id`,
    `reasoning_content`) and nothing else; an unknown field is refused like an unknown request
    argument."""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart | VideoPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # vLLM's newer name of reasoning_content (a reply carries both); templates read the other
    reasoning: str | None = None

    @property
    def images(self) -> list[tuple[int, ImagePart]]:
        """(index, part) of the content's image parts."""
        content = self.content if isinstance(self.content, list) else ()
        return [(j, p) for j, p in enumerate(content) if isinstance(p, ImagePart)]

    @property
    def videos(self) -> list[tuple[int, VideoPart]]:
        """(index, part) of the content's video parts."""
        content = self.content if isinstance(self.content, list) else ()
        return [(j, p) for j, p in enumerate(content) if isinstance(p, VideoPart)]

    def as_template_dict(self, parts: bool = False) -> dict[str, Any]:
        """The message as chat templates read it: content a string (text parts one per line),
        or with `parts` (a vision model's templates) a list of {"type": "text", "text": ...}
        and {"type": "image"} parts, as transformers' processors hand them over."""
        data = self.model_dump(exclude_none=True)
        if "reasoning" in data:
            data.setdefault("reasoning_content", data.pop("reasoning"))
        if parts:
            content = self.content if isinstance(self.content, list) else [self.content or ""]
            data["content"] = [
                {"type": "text", "text": p} if isinstance(p, str) else
                {"type": "image"} if isinstance(p, ImagePart) else
                {"type": "video"} if isinstance(p, VideoPart) else {"type": "text", "text": p.text}
                for p in content
            ]  # fmt: skip
        elif isinstance(self.content, list):
            # one part per line, as vLLM (and TensorRT-LLM) join text parts
            data["content"] = "\n".join(p.text for p in self.content)
        data.setdefault("content", "")
        if not self.tool_calls:  # `[]` says no calls; templates testing `'tool_calls' in
            data.pop("tool_calls", None)  # message` (Llama 3.1's) would render an empty call
        return data


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_StructuredFields):
    null_means_default = _SamplingFields.null_means_default | {
        "logprobs", "audio", "moderation", "prediction", "prompt_cache_retention",
        "reasoning_effort", "verbosity"}  # fmt: skip
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[str] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's and vLLM's: the chat template's `reasoning_effort` variable (gpt-oss's), a 400
    # for a template that does not read it (`chat._with_effort`)
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    # vLLM's chat extras
    echo: bool = False  # the reply starts with the last message's content when it has its role
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # the image processor's settings for this request's images, over --mm-processor-kwargs
    # (`multimodal/processor_kwargs.py`; a key the model's processor does not read: a 400)
    mm_processor_kwargs: dict[str, Any] | None = None

    @property
    def generation_prompt(self) -> bool:
        """Whether the template opens a new (assistant) turn: not when continuing the last
        message (`add_generation_prompt` left out then means false)."""
        return self.add_generation_prompt and not self.continue_final_message

    @property
    def reply_role(self) -> str:
        """The role of the reply (vLLM's rule): the assistant's after a generation prompt,
        else the last message's, which the model continues."""
        return "assistant" if self.generation_prompt else self.messages[-1].role

    @model_validator(mode="after")
    def _fields_that_need_another(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt and \
                "add_generation_prompt" in self.model_fields_set:  # fmt: skip
            raise APIError(400, "continue_final_message and add_generation_prompt cannot both be "
                           "true: the model either continues the last message or starts a new "
                           "one", param="continue_final_message", code="invalid_value")  # fmt: skip
        if self.parallel_tool_calls is not None and not self.tools:
            raise APIError(400, "parallel_tool_calls is only allowed when tools are given",
                           param="parallel_tool_calls", code="invalid_value")  # fmt: skip
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):  # fmt: skip
            raise APIError(400, "max_tokens and max_completion_tokens disagree; give one "
                           "(max_completion_tokens is the newer name)",
                           param="max_completion_tokens", code="invalid_value")  # fmt: skip
        _check_message_fields(self.messages)
        return self

    @model_validator(mode="before")
    @classmethod
    def _known_parts(cls, data: Any) -> Any:
        """A content part other than text or an image is named in the 400 (not "Input should
        be ..."), as
        are a message other than an assistant's without content, a tool message without
        `tool_call_id`, tool calls outside an assistant message, and
        a response's own fields sent back non-empty (empty ones are dropped)."""
        messages = data.get("messages") if isinstance(data, dict) else None
        if messages == []:  # OpenAI's answer (its minItems: 1), not pydantic's wording
            raise APIError(400, "invalid 'messages': empty array; expected at least one message",
                           param="messages", code="empty_array")  # fmt: skip
        if isinstance(messages, list) and any(
            isinstance(m, dict) and (any(k in m for k in ECHOED_EMPTY) or _has_sdk_copies(m))
            for m in messages
        ):
            data = {**data, "messages": [_without_empty_echoes(m, i) for i, m in
                                         enumerate(messages)]}  # fmt: skip
            messages = data["messages"]
        for i, m in enumerate(messages if isinstance(messages, list) else ()):
            if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id") is None:
                raise APIError(400, f"messages[{i}]: a message with role 'tool' needs "
                               "'tool_call_id' (the id of the call it answers)",
                               param=f"messages[{i}].tool_call_id",
                               code="missing_required_parameter")  # fmt: skip
            if (isinstance(m, dict) and m.get("role") in NEEDS_CONTENT
                    and m.get("content") is None):  # fmt: skip
                raise APIError(400, f"messages[{i}]: a message with role {m['role']!r} needs "
                               "'content' (a string or an array of text parts)",
                               param=f"messages[{i}].content",
                               code="missing_required_parameter")  # fmt: skip
            if isinstance(m, dict) and m.get("tool_calls") and m.get("role") != "assistant":
                raise APIError(400, f"messages[{i}]: only assistant messages carry tool_calls",
                               param=f"messages[{i}].tool_calls", code="invalid_value")  # fmt: skip
            parts = m.get("content") if isinstance(m, dict) else None
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind not in ("text", "image_url", "video_url"):
                    raise APIError(
                        400, f"messages[{i}].content[{j}]: content parts of type "
                        f"{shorten(kind, 40)!r} are not supported (parts of type 'text', "
                        "'image_url' for a model that reads images, 'video_url' for one that "
                        "reads videos)",
                        param=f"messages[{i}].content[{j}].type", code="unsupported_content",
                    )  # fmt: skip
        return data


# A message field → the one role whose messages carry it (elsewhere no template reads it)
ROLE_OF_FIELD = {"tool_call_id": "tool", "reasoning_content": "assistant", "reasoning": "assistant"}


def _check_message_fields(messages: list[ChatMessage]) -> None:
    """APIError 400 for a field on a message of a role that does not carry it, and (as OpenAI
    answers) for a tool message that answers no call of an earlier assistant message."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        for key, role in ROLE_OF_FIELD.items():
            if m.role != role and getattr(m, key) is not None:
                raise APIError(400, f"messages[{i}].{key} is only read on messages with role "
                               f"'{role}', not '{m.role}'", param=f"messages[{i}].{key}",
                               code="unsupported_parameter")  # fmt: skip
        if None not in (m.reasoning, m.reasoning_content) and m.reasoning != m.reasoning_content:
            raise APIError(400, f"messages[{i}]: reasoning and reasoning_content are two names of "
                           "one field and differ here; send one", param=f"messages[{i}].reasoning",
                           code="invalid_value")  # fmt: skip
        calls.update(c.id for c in m.tool_calls or ())
        if m.role == "tool" and m.tool_call_id not in calls:
            raise APIError(400, f"messages[{i}]: a message with role 'tool' must answer a tool "
                           f"call of an earlier assistant message; no call has the id "
                           f"{shorten(m.tool_call_id or '', 80)!r}",
                           param=f"messages[{i}].tool_call_id", code="invalid_value")  # fmt: skip


def _has_sdk_copies(m: dict) -> bool:
    if m.get("role") != "assistant":
        return False
    calls = m.get("tool_calls")
    return any(k in m for k in SDK_COPIES) or any(
        isinstance(c, dict) and isinstance(c.get("function"), dict)
        and any(k in c["function"] for k in SDK_CALL_COPIES)
        for c in (calls if isinstance(calls, list) else ())
    )  # fmt: skip


def _without_empty_echoes(m: Any, i: int) -> Any:
    """Message `i` without the response fields it sent back empty (APIError if one is not),
    and, for an assistant message, without the SDK's copies of its content and arguments."""
    if not isinstance(m, dict):
        return m
    for key in ECHOED_EMPTY:
        if m.get(key) not in (None, [], ""):
            raise APIError(400, f"messages[{i}].{key} is not supported (a response's field: "
                           "send it back empty or leave it out)", param=f"messages[{i}].{key}",
                           code="unsupported_parameter")  # fmt: skip
    if not _has_sdk_copies(m):
        return {k: v for k, v in m.items() if k not in ECHOED_EMPTY}
    out = {k: v for k, v in m.items() if k not in ECHOED_EMPTY and k not in SDK_COPIES}
    if isinstance(m.get("tool_calls"), list):
        out["tool_calls"] = [
            {**c, "function": {k: v for k, v in c["function"].items() if k not in SDK_CALL_COPIES}}
            if isinstance(c, dict) and isinstance(c.get("function"), dict) else c
            for c in m["tool_calls"]
        ]  # fmt: skip
    return out
