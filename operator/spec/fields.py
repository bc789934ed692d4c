"""Typed readers over a raw spec dict, and the error every spec problem raises.

Each reader checks type and bounds and names the offending field in its message, so an
InferenceService written without the API server's schema (or before a schema change) gets the
same clear `Degraded` reason as one the schema would have rejected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_QUANTITY = re.compile(
    r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)))?$"
)

MAX_ECHO = 200  # characters of an offending value quoted in a message (the CRD caps messages)
_HTTP_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s]*)?$")


def show(value: Any) -> str:
    """`repr(value)`, cut to MAX_ECHO characters: a 1 MB field must not become a 1 MB message."""
    text = repr(value)
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}... ({len(text)} characters)"


def is_http_url(value: str) -> bool:
    """An absolute http(s) URL with a host (what Prometheus base URLs look like)."""
    return bool(_HTTP_URL.match(value))


def base_url_problem(value: str, *, credentials: bool) -> str | None:
    """Why `value` is no base URL to append an API path to (None when it is one): it must be an
    absolute http(s) URL with a host and no query or fragment (a `?` would swallow the path
    appended after it); `credentials`: whether a `user:password@` is allowed."""
    if not is_http_url(value):
        return "must be an http(s) URL"
    if "?" in value or "#" in value:
        return "must be a base URL without a query (?) or fragment (#)"
    if not credentials and "@" in value.split("://", 1)[1].split("/", 1)[0]:
        return "must not hold a user or password (user:password@)"
    return None


class SpecError(Exception):
    """An InferenceService that cannot be served as written: `reason` is CamelCase, `message` is for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def opt_int(d: Mapping[str, Any], key: str, path: str, lo: int, hi: int) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError("InvalidSpec", f"{path}.{key} must be an integer, got {show(value)}")
    if not lo <= value <= hi:
        raise SpecError("InvalidSpec", f"{path}.{key} must be between {lo} and {hi}, got {value}")
    return value


def int_or(d: Mapping[str, Any], key: str, path: str, lo: int, hi: int, default: int) -> int:
    value = opt_int(d, key, path, lo, hi)
    return default if value is None else value


def opt_number(d: Mapping[str, Any], key: str, path: str, lo: float) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError("InvalidSpec", f"{path}.{key} must be a number, got {show(value)}")
    if value < lo:
        raise SpecError("InvalidSpec", f"{path}.{key} must be at least {lo}, got {value}")
    return float(value)


def bool_or(d: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise SpecError("InvalidSpec", f"{path}.{key} must be true or false, got {show(value)}")
    return value


def opt_str(
    d: Mapping[str, Any],
    key: str,
    path: str,
    *,
    max_len: int | None = None,
    pattern: re.Pattern[str] | None = None,
) -> str | None:
    """A non-empty string within the CRD's maxLength and pattern, or None when absent."""
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(
            "InvalidSpec", f"{path}.{key} must be a non-empty string, got {show(value)}"
        )
    if max_len is not None and len(value) > max_len:
        raise SpecError(
            "InvalidSpec",
            f"{path}.{key} must be at most {max_len} characters, got {len(value)}: {show(value)}",
        )
    if pattern is not None and not pattern.match(value):
        raise SpecError(
            "InvalidSpec", f"{path}.{key} must match {pattern.pattern}, got {show(value)}"
        )
    return value


def choice(d: Mapping[str, Any], key: str, path: str, choices: Sequence[Any], default: Any) -> Any:
    value = d.get(key, default)
    if value not in choices:
        allowed = ", ".join(str(c) for c in choices)
        raise SpecError("InvalidSpec", f"{path}.{key} must be one of {allowed}; got {show(value)}")
    return value


def mapping(d: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    """An optional object field ({} when absent or null). Only null is absent: `[]`, `""`,
    `false` or `0` are refused, not read as an empty object (the schema may not be applied)."""
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError("InvalidSpec", f"{path}.{key} must be an object, got {show(value)}")
    return value


def quantity(d: Mapping[str, Any], key: str, path: str) -> str | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(
            "InvalidSpec", f"{path}.{key} must be a quantity such as 4 or 16Gi, got {show(value)}"
        )
    text = str(value)
    if not _QUANTITY.match(text):
        raise SpecError(
            "InvalidSpec", f"{path}.{key} is not a valid non-negative quantity: {show(value)}"
        )
    return text


def closed_object(
    d: Mapping[str, Any], key: str, path: str, known: Sequence[str]
) -> Mapping[str, Any] | None:
    """An optional object field whose keys are all in `known`: None when absent or null;
    InvalidSpec for anything but an object, or for unknown keys (named, beside the known ones)."""
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("InvalidSpec", f"{path}.{key} must be an object, got {show(value)}")
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise SpecError(
            "InvalidSpec",
            f"{path}.{key}: unknown field(s) {', '.join(unknown)} (known: {', '.join(known)})",
        )
    return value
