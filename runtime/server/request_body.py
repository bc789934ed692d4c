"""Request bodies → request models (`protocol`), every failure an APIError 400 naming what
is wrong, never a 500.

Any body, however hostile, parses to a request model or raises APIError 400: invalid UTF-8 or
JSON, duplicate keys in an object (which JSON parsers resolve differently), more JSON objects
than `MAX_JSON_OBJECTS`, nesting deeper than the parser recurses, integers over Python's
4300-digit limit, lone surrogates (which no tokenizer accepts), wrong types and content parts
other than text (pydantic's errors as OpenAI's, naming the field).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pagoda.runtime.server.protocol import APIError, shorten
from pydantic import BaseModel, ValidationError

# JSON objects in one body (a long conversation with tools holds a few thousand): each becomes
# a validated model, and validation holds the GIL (about 6 µs an object, more with the collector)
MAX_JSON_OBJECTS = 16_384
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _param_of(loc: tuple[Any, ...]) -> str | None:
    """('messages', 0, 'content', 'str') → 'messages[0].content' (union branch names dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "int", "float", "bool") or "[" in str(part):
            break  # pydantic names the union member it tried; not a field
        elif str(part)[:1].isupper():
            continue  # a model of a union (NamedToolChoice): its fields follow
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _lone_surrogate_path(value: Any, path: str = "") -> str | None:
    """The path of the first string holding a lone UTF-16 surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            where = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
            found = _lone_surrogate_path(item, where)
            if found is not None:
                return found
    return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict; APIError 400 naming a key given twice (parsers disagree on
    which one wins: the first, the last, or an error)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise APIError(400, f"duplicate key {shorten(key, 100)!r} in a JSON object of the "
                       "request body", param=shorten(key, 100), code="duplicate_key")  # fmt: skip
    return obj


def load_json(body: bytes) -> Any:
    """Bytes → JSON value, every failure an APIError 400 (never a 500). More than
    `MAX_JSON_OBJECTS` objects is refused while parsing: validating each one into a model holds
    the GIL, so 100k messages in a 4 MiB body held the event loop (and every stream) for
    seconds."""
    objects = 0

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal objects
        objects += 1
        if objects > MAX_JSON_OBJECTS:
            raise APIError(400, f"the request body holds more than {MAX_JSON_OBJECTS} JSON "
                           "objects (messages, content parts, tools, schema nodes); send fewer",
                           code="too_many_objects")  # fmt: skip
        return _unique_keys(pairs)

    try:
        data = json.loads(body, object_pairs_hook=hook)
    except RecursionError as e:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from e
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, 4300-digit int limit
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from e
    if _SURROGATE_ESCAPE.search(body):  # only \\uD8xx-\\uDFxx escapes make lone surrogates
        try:
            where = _lone_surrogate_path(data)
        except RecursionError as e:
            raise APIError(400, "request body is nested too deeply", code="invalid_json") from e
        if where is not None:
            raise APIError(
                400, f"'{shorten(where, 100)}' holds a lone UTF-16 surrogate (invalid Unicode)",
                param=shorten(where, 100), code="invalid_unicode",
            )  # fmt: skip
    return data


def parse_request(body: bytes, model: type[BaseModel]) -> Any:
    """JSON bytes → request model, or an APIError 400 naming the offending field."""
    data = load_json(body)
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(data)
    except RecursionError as e:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from e
    except ValidationError as e:
        raise validation_error(e, model) from e


def validation_error(e: ValidationError, model: type[BaseModel], prefix: str = "") -> APIError:
    """pydantic's error as OpenAI's 400, naming the field (`prefix`: the path of the value
    `model` validated within the body, as `input[2]`)."""
    errors = e.errors(include_url=False, include_input=False)
    err = errors[0]
    if err["type"] == "literal_error":  # "auto" | {...}: the object branch says more
        err = max(errors, key=lambda x: len(x["loc"]))
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden" and loc:  # the last part is the client's own key,
        head = _param_of(loc[:-1])  # whatever it looks like ('Max_tokens', 'str')
        param = f"{head}.{loc[-1]}" if head else str(loc[-1])
    else:
        param = _param_of(loc)
    if prefix:
        param = f"{prefix}.{param}" if param else prefix
    param = shorten(param, 100) if param else None
    hint = getattr(model, "error_hints", {}).get(str(err["loc"][0]) if err["loc"] else "")
    if err["type"] == "missing":
        msg, code = f"'{param}' is a required property", "missing_required_parameter"
    elif err["type"] == "extra_forbidden":
        msg, code = f"unrecognized request argument '{param}': this server does not " \
            "support it", "unsupported_parameter"  # fmt: skip
    elif hint is not None:
        msg, code = f"invalid value for '{param}': {hint}", "invalid_type"
    else:
        msg, code = f"invalid value for '{param}': {shorten(err['msg'])}", "invalid_type"
    return APIError(400, msg, param=param, code=code)
