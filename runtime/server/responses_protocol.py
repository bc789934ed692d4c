"""The Responses API's request (`POST /v1/responses`): its schema, and what is refused.

Types are checked strictly, as chat's are (`protocol.py`). A field this server does not honour
is a 400 naming it, never silently ignored: `conversation`, `prompt`, `include`,
`truncation: "auto"`, built-in tools (web search, file search, code interpreter, ...), input
parts other than text and images (files, audio; an image by `file_id`; images for a model that
reads text only are chat's 400), input items other than messages, function calls,
their outputs and reasoning, `reasoning.summary` and `text.verbosity`. A null for one of
OpenAI's nullable fields asks for nothing and is dropped.

Each input item and tool is validated by its own model (`type` picks it), so an error names the
item (`input[2].call_id`), not a branch of a union.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pagoda.runtime.server.protocol import APIError, _scalar, _Strict, shorten
from pagoda.runtime.server.request_body import validation_error
from pydantic import BaseModel, Field, ValidationError, model_validator

# Fields of OpenAI's Responses API this server does not honour → (the values that ask for
# nothing, why others are refused)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "conversation": ((), "conversations are not stored here (use previous_response_id)"),
    "prompt": ((), "prompt templates are not stored here"),
    "include": (([],), "no extra output data is available here"),
    "truncation": (("disabled",), "input is not truncated here; a prompt too long is a 400"),
    "max_tool_calls": ((), "built-in tools are not served here"),
    "top_logprobs": (
        (),
        "output logprobs are not available from /v1/responses here (use /v1/chat/completions)",
    ),
    "stream_options": ((), "stream options are not available from /v1/responses here"),
    "context_management": ((), "context is not compacted here"),
    "prompt_cache_retention": ((), "the prefix cache keeps what fits, for no set time"),
}
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's bounds
EFFORTS = ("low", "medium", "high")  # chat's reasoning_effort (the template's variable)


class InputText(_Strict):
    """A text part of a message: `input_text`, or `output_text` as a response gave it."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # a response's, sent back: must be empty
    logprobs: list[Any] | None = None  # a response's, sent back: dropped (a copy of the output)

    @model_validator(mode="after")
    def _no_annotations(self) -> InputText:
        if self.annotations:
            raise APIError(400, "annotations are not supported (send them back empty)",
                           param="annotations", code="unsupported_parameter")  # fmt: skip
        return self


class InputImage(_Strict):
    """An image part (`input_image`): its URL (`data:` or http(s)) runs as chat's `image_url`
    part (a vision model's only: chat answers a 400 for a model that reads text only); one by
    `file_id` is refused (`_check_parts`)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None  # (one resolution: every one reads alike)


InputPart = Annotated[InputText | InputImage, Field(discriminator="type")]
PART_TYPES = ("input_text", "output_text", "input_image")


class InputMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart]
    id: str | None = None  # an output message sent back
    status: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Strict):
    """A reasoning model's thinking, sent back: the next assistant message's `reasoning_content`."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    @model_validator(mode="after")
    def _not_encrypted(self) -> ReasoningItem:
        if self.encrypted_content is not None:
            raise APIError(400, "encrypted_content is not supported: this server sends none",
                           param="encrypted_content", code="unsupported_parameter")  # fmt: skip
        return self


ITEMS: dict[str, type[BaseModel]] = {
    "message": InputMessage,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(_Strict):
    """A function tool, in the Responses API's flat form."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # OpenAI's default is true (`responses_input.chat_tool`)


class NamedFunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    """`text.format`: text, json_object, or json_schema with `schema`, `name`, `strict`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_only_with_its_type(self) -> TextFormat:
        given = [k for k in ("name", "schema_", "description", "strict")
                 if getattr(self, k) is not None]  # fmt: skip
        if self.type != "json_schema" and given:
            key = given[0].rstrip("_")
            raise APIError(400, f"text.format.{key} is only read with type \"json_schema\", not "
                           f'"{self.type}"', param=f"text.format.{key}", code="invalid_value")  # fmt: skip
        if self.type == "json_schema" and self.name is None:
            raise APIError(400, "'text.format.name' is a required property",
                           param="text.format.name", code="missing_required_parameter")  # fmt: skip
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # what the model does; others are refused

    @model_validator(mode="before")
    @classmethod
    def _refuse_verbosity(cls, data: Any) -> Any:
        _refuse(data, "text", {"verbosity": ("medium", "the model's verbosity is its own")})
        return data


class ReasoningConfig(_Strict):
    effort: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_summaries(cls, data: Any) -> Any:
        why = (None, "reasoning summaries are not made here (the thinking itself is the "
                     "reasoning item's content)")  # fmt: skip
        return _refuse(data, "reasoning", {"summary": why, "generate_summary": why})


def _refuse(data: Any, field: str, refused: dict[str, tuple[Any, str]]) -> Any:
    """`data` without the keys of `refused` that hold their one allowed value (or null); any
    other value is a 400 naming `field.key`."""
    if not isinstance(data, dict):
        return data
    for key, (allowed, why) in refused.items():
        if data.get(key) not in (None, allowed):
            raise APIError(400, f"{field}.{key}={_scalar(data[key])} is not supported: {why}",
                           param=f"{field}.{key}", code="unsupported_value")  # fmt: skip
    return {k: v for k, v in data.items() if k not in refused or refused[k][0] is not None}


class ResponsesRequest(_Strict):
    null_means_default: ClassVar[frozenset[str]] = frozenset({
        "model", "instructions", "max_output_tokens", "temperature", "top_p", "seed", "tools",
        "tool_choice", "parallel_tool_calls", "text", "reasoning", "stream", "store", "background",
        "previous_response_id", "metadata", "user", "service_tier", "safety_identifier",
        "prompt_cache_key", "mm_processor_kwargs", *REFUSED})  # fmt: skip
    error_hints: ClassVar[dict[str, str]] = {
        "input": "input must be a string or a list of input items",
        "tools": "tools must be a list of function tools",
    }

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None  # vLLM's, as chat's
    tools: list[Any] | None = None  # FunctionTool each (`_items_by_type`)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    store: bool = True
    background: bool = False  # run without the client (`responses_background.py`); stored
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # hints with no effect here (as chat's); service_tier: chat's rule (one tier)
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # prefix caching is automatic
    # vLLM's: the image processor's settings for this request's images, over
    # --mm-processor-kwargs (chat's field; a later response does not inherit them)
    mm_processor_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_honoured(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None or k not in cls.null_means_default}
        for name, (allowed, why) in REFUSED.items():
            if name not in data:
                continue
            value = data.pop(name)
            if value not in allowed:
                raise APIError(400, f"{name} is not supported: {why}", param=name,
                               code="unsupported_parameter")  # fmt: skip
        if isinstance(data.get("input"), list):
            if not data["input"]:
                raise APIError(400, "invalid 'input': empty array; expected at least one item",
                               param="input", code="empty_array")  # fmt: skip
            data["input"] = _items_by_type(data["input"], "input", ITEMS, "message")
        if isinstance(data.get("tools"), list):
            data["tools"] = _items_by_type(data["tools"], "tools", {"function": FunctionTool})
        return data

    @model_validator(mode="after")
    def _fields_that_need_another(self) -> ResponsesRequest:
        if self.parallel_tool_calls is not None and not self.tools:
            raise APIError(400, "parallel_tool_calls is only allowed when tools are given",
                           param="parallel_tool_calls", code="invalid_value")  # fmt: skip
        if self.background and not self.store:
            raise APIError(400, "background responses must be stored: store=false is refused "
                           "with background=true", param="store", code="invalid_value")  # fmt: skip
        if self.previous_response_id is not None and not self.previous_response_id:
            raise APIError(400, "previous_response_id is empty", param="previous_response_id",
                           code="invalid_value")  # fmt: skip
        _check_metadata(self.metadata)
        return self


def _items_by_type(items: list[Any], field: str, models: dict[str, type[BaseModel]],
                   default: str | None = None) -> list[BaseModel]:  # fmt: skip
    """Each item validated by the model its `type` names (`default` where it has none); a type
    not served is a 400 naming it."""
    out = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"invalid value for '{where}': expected an object", param=where,
                           code="invalid_type")  # fmt: skip
        kind = item.get("type", default)
        if not isinstance(kind, str):
            raise APIError(400, f"'{where}.type' is a required property", param=f"{where}.type",
                           code="missing_required_parameter")  # fmt: skip
        model = models.get(kind)
        if model is None:
            what = "input items" if field == "input" else "tools"
            served = ", ".join(models)
            raise APIError(400, f"{where}: {what} of type {shorten(kind, 40)!r} are not supported "
                           f"here (only {served})", param=f"{where}.type",
                           code="unsupported_parameter")  # fmt: skip
        if model is InputMessage:
            _check_parts(item, where)
        try:
            out.append(model.model_validate(item))
        except ValidationError as e:
            raise validation_error(e, model, where) from e
        except APIError as e:  # a validator's own: its param is relative to the item
            raise APIError(400, f"{where}.{e.message}", param=f"{where}.{e.param}",
                           code=e.code) from e  # fmt: skip
    return out


def _check_parts(item: dict[str, Any], where: str) -> None:
    """A content part other than text or an image is named in the 400."""
    parts = item.get("content")
    for j, part in enumerate(parts if isinstance(parts, list) else ()):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":
            _check_image(part, f"{where}.content[{j}]")
        if isinstance(kind, str) and kind not in PART_TYPES:
            raise APIError(400, f"{where}.content[{j}]: content parts of type "
                           f"{shorten(kind, 40)!r} are not supported here (parts of type "
                           "'input_text' or 'input_image')", param=f"{where}.content[{j}].type",
                           code="unsupported_content")  # fmt: skip


def _check_image(part: dict[str, Any], where: str) -> None:
    if part.get("file_id") is not None:
        raise APIError(400, f"{where}.file_id is not supported: files are not stored here (send "
                       "the image as image_url)", param=f"{where}.file_id",
                       code="unsupported_parameter")  # fmt: skip
    if part.get("image_url") is None:
        raise APIError(400, f"{where}: an input_image needs 'image_url'",
                       param=f"{where}.image_url", code="missing_required_parameter")  # fmt: skip


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_KEYS:
        raise APIError(400, f"metadata holds {len(metadata)} pairs; at most {METADATA_KEYS}",
                       param="metadata", code="invalid_value")  # fmt: skip
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
            raise APIError(400, f"metadata keys are at most {METADATA_KEY_CHARS} characters and "
                           f"values {METADATA_VALUE_CHARS}; {shorten(key, 80)!r} is longer",
                           param="metadata", code="invalid_value")  # fmt: skip
