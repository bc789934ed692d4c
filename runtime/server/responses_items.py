"""A response's input items as OpenAI lists them (`GET /v1/responses/{id}/input_items`), and
the query parameters of the stored-response routes, each checked (a 400 naming one that is
wrong or not served, never one ignored).

The items are those of the request's own `input` (a string is one user message), each with an
id (the one it was sent with, or a new one) and status `completed`; neither its `instructions`
nor the conversation `previous_response_id` continued are among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.server.protocol import APIError, shorten
from pagoda.runtime.server.responses_output import item_id
from pagoda.runtime.server.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    InputMessage,
    ReasoningItem,
    ResponsesRequest,
)

MAX_LIMIT, DEFAULT_LIMIT = 100, 20  # OpenAI's


def input_items(req: ResponsesRequest) -> tuple[dict[str, Any], ...]:
    """The request's input as OpenAI's stored items."""
    if isinstance(req.input, str):
        return (_message("user", req.input, None, None),)
    out = []
    for item in req.input:
        if isinstance(item, InputMessage):
            out.append(_message(item.role, item.content, item.id, item.status))
        elif isinstance(item, FunctionCallItem):
            out.append({"id": item.id or item_id("fc"), "type": "function_call",
                        "call_id": item.call_id, "name": item.name, "arguments": item.arguments,
                        "status": item.status or "completed"})  # fmt: skip
        elif isinstance(item, FunctionCallOutputItem):
            output = item.output if isinstance(item.output, str) else [
                {"type": "input_text", "text": p.text} for p in item.output]  # fmt: skip
            out.append({"id": item.id or item_id("fco"), "type": "function_call_output",
                        "call_id": item.call_id, "output": output,
                        "status": item.status or "completed"})  # fmt: skip
        else:
            assert isinstance(item, ReasoningItem)
            thought = {"id": item.id or item_id("rs"), "type": "reasoning",
                       "summary": [p.model_dump() for p in item.summary]}  # fmt: skip
            if item.content is not None:
                thought["content"] = [p.model_dump() for p in item.content]
            out.append(thought)
    return tuple(out)


def _message(role: str, content: Any, id_: str | None, status: str | None) -> dict[str, Any]:
    text = "output_text" if role == "assistant" else "input_text"
    parts = [{"type": text, "text": content}] if isinstance(content, str) else [
        {"type": "input_image", "image_url": p.image_url, "detail": p.detail or "auto"}
        if isinstance(p, InputImage) else {"type": text, "text": p.text}
        for p in content]  # fmt: skip
    for p in parts:
        if p["type"] == "output_text":
            p["annotations"] = []
    return {"id": id_ or item_id("msg"), "type": "message", "role": role, "content": parts,
            "status": status or "completed"}  # fmt: skip


def page(items: tuple[dict[str, Any], ...], query: Mapping[str, list[str]]) -> dict[str, Any]:
    """OpenAI's list object of `items` for the query's `limit`, `order` and `after`."""
    check_names(query, ("limit", "order", "after", "include"))
    refuse_include(query)
    limit = integer(query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    order = one(query, "order") or "desc"
    if order not in ("asc", "desc"):
        raise bad("order", f"order must be 'asc' or 'desc', not {shorten(order, 40)!r}")
    ordered = list(items if order == "asc" else reversed(items))
    after = one(query, "after")
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item["id"] == after), None)
        if at is None:
            raise bad("after", f"after: no input item of this response has id "
                               f"{shorten(after, 100)!r}")  # fmt: skip
        ordered = ordered[at + 1 :]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}  # fmt: skip


def query_lists(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Query parameters by name (`include[]=a&include[]=b`, as the SDK sends lists, under
    `include`)."""
    out: dict[str, list[str]] = {}
    for name, value in pairs:
        out.setdefault(name.removesuffix("[]"), []).append(value)
    return out


def check_names(query: Mapping[str, list[str]], served: tuple[str, ...]) -> None:
    for name in query:
        if name not in served:
            raise bad(name, f"query parameter {shorten(name, 60)!r} is not supported here "
                            f"(only {', '.join(served)})", code="unsupported_parameter")  # fmt: skip


def refuse_include(query: Mapping[str, list[str]]) -> None:
    values = [v for v in query.get("include", ()) if v]
    if values:
        raise bad("include", f"include={shorten(values[0], 60)!r} is not supported: no extra "
                             "output data is available here", code="unsupported_parameter")  # fmt: skip


def one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise bad(name, f"query parameter {name!r} is given {len(values)} times")
    return values[0]


def integer(query: Mapping[str, list[str]], name: str, default: int, low: int,
            high: int | None = None) -> int:  # fmt: skip
    text = one(query, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise bad(name, f"{name} must be an integer, not {shorten(text, 40)!r}") from None
    if value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise bad(name, f"{name} must be {span}, not {value}")
    return value


def boolean(query: Mapping[str, list[str]], name: str) -> bool | None:
    text = one(query, name)
    if text is None:
        return None
    if text.lower() not in ("true", "false"):
        raise bad(name, f"{name} must be true or false, not {shorten(text, 40)!r}")
    return text.lower() == "true"


def bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=shorten(param, 60), code=code)
