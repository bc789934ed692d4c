"""GLM-4.5 / GLM-4.6's tool calls (`--tool-call-parser glm45`, vLLM's name): after optional text,
one block per call, the arguments as key/value tags rather than JSON::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

A value is the text between its tags, stripped (vLLM's rule): kept as a string where the tool's
schema types that argument ``string`` (GLM's chat template writes strings raw), else read as
JSON (the template writes other values with ``tojson``), else as a Python literal, else kept as
the string. A call's arguments become one JSON object, each key once (the first).

Streaming sends a call's id and name once its name line is written, then its arguments as JSON
text pair by pair as each ``</arg_value>`` arrives, and the closing brace with
``</tool_call>``: the pieces join to the whole response's arguments. Text before the first call
is content (holding back what could begin ``<tool_call>``); output in which no call's name is
written stays content, and a call to a function the request's tools lack is dropped, the calls
after it read on. A whole response's calls are the stream's: a call cut short (max_tokens) is
reported with its arguments so far (`tool_call.py`'s rules).
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from typing import Any

from pagoda.runtime.server.tool_call import (
    KnownNames,
    ScannedCallStream,
    StartTag,
    ToolCall,
    call_id,
    json_value,
    parsed,
    too_deep,
    tool_names,
)

TAG, END = "<tool_call>", "</tool_call>"
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_NAME_END = re.compile(r"\n|<arg_key>|</tool_call>")


def _types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name -> {argument: its schema's `type`} of the request's tools (OpenAI's shape)."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or []:
        fn = t.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {
            k: v.get("type") for k, v in props.items() if isinstance(v, dict)
        }
    return out


class Glm45Parser(StartTag, KnownNames):
    """`tool_parsers.ToolParser`'s interface (listed in its PARSERS) over GLM-4.5's tags."""

    name = "glm45"
    markers = ("<arg_key>", TAG)  # the first tells GLM-4.5's template from a Hermes one
    TAG = TAG
    new_id = staticmethod(call_id)

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.types = _types(tools)
        self.names = tool_names(tools)

    @classmethod
    def for_request(cls, tools: list[dict[str, Any]]) -> Glm45Parser:
        return cls(tools)

    def value(self, tool: str, key: str, raw: str) -> Any:
        """An argument's value from its text (module docstring)."""
        text = raw.strip()
        if self.types.get(tool, {}).get(key) == "string":
            return text
        with contextlib.suppress(ValueError):  # not JSON (NaN, nested too deeply, ...)
            return json_value(text, rewritten=True)
        if too_deep(text):  # (no literal either)
            return text
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            literal = ast.literal_eval(text)
            json.dumps(literal, allow_nan=False)  # only what JSON can carry (no inf)
            return literal
        return text

    def block(self, region: str, pos: int, first: bool) -> tuple[str, str, int | None] | None:
        """The call at `pos` of `region` (the text after the first `<tool_call>`, which `first`
        follows): (its name, its body, where it ends: None while open), or None where no
        further call's name is written yet."""
        if not first:
            j = region.find(TAG, pos)
            if j < 0:
                return None
            pos = j + len(TAG)
        close = region.find(END, pos)
        body = region[pos:] if close < 0 else region[pos:close]
        m = _NAME_END.search(body)
        if m is None and close < 0:
            return None  # the name is still being written
        name = (body[: m.start()] if m else body).strip()
        return name, body, None if close < 0 else close + len(END)

    def pairs(self, body: str) -> list[tuple[str, str]]:
        """(key, value text) of each argument in a call's body."""
        return [(key.strip(), raw) for key, raw in _PAIR.findall(body)]

    def scan(self, region: str) -> list[tuple[str, list[str], bool]]:
        """The calls in `region` (the text after the call marker) so far, those to functions
        the request's tools lack too (the stream drops them): (name, the arguments' `"key":
        value` JSON pieces, each key once (the first), closed), up to the first whose name is
        not yet written (`block`)."""
        calls: list[tuple[str, list[str], bool]] = []
        pos = 0
        while (found := self.block(region, pos, not calls)) is not None:
            name, body, end = found
            if not name or "<" in name:
                break
            pieces, seen = [], set()
            for key, raw in self.pairs(body):
                if key not in seen:
                    seen.add(key)
                    pieces.append(json_pair(key, self.value(name, key, raw)))
            calls.append((name, pieces, end is not None))
            if end is None:
                break
            pos = end
        return calls

    def parse(self, text: str, parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
        return parsed(self, text, parallel)

    def stream(self, parallel: bool = True) -> Glm45Stream:
        return Glm45Stream(self, parallel)


def json_pair(key: str, value: Any) -> str:
    """One argument as the JSON text of an object's member: `"key": value`."""
    return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"


def arguments(pieces: list[str], done: bool) -> str:
    """A call's arguments JSON text so far: every prefix of the closed call's."""
    if not pieces:
        return "{}" if done else ""
    return "{" + ", ".join(pieces) + ("}" if done else "")


class Glm45Stream(ScannedCallStream):
    """Incremental `Glm45Parser` output as OpenAI chat deltas: content up to `<tool_call>`,
    then each call's key/value pairs as JSON arguments as they arrive."""

    hold_space = True  # whitespace before a call is not content (as `parse` strips it)

    def arguments(self, region: str) -> list[tuple[str, str]]:
        return [(name, arguments(pieces, done))
                for name, pieces, done in self.parser.scan(region)]  # fmt: skip
