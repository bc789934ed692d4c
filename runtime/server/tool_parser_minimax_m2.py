"""MiniMax-M2's tool calls (`--tool-call-parser minimax_m2`, vLLM's name): after optional text,
one block of calls, each an ``<invoke>`` with its arguments as ``<parameter>`` tags rather than
JSON, as MiniMax-M2's chat template asks for them::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

A value is typed as vLLM's `minimax_m2` parser types it (`value`): the text, stripped;
``null``, ``none`` or ``nil`` (any case) is null; otherwise the types its tool's schema allows
(`type`, a list of them, an `enum`'s values, `anyOf`/`oneOf`/`allOf`) are tried in the order
integer, number (a whole number as an integer), boolean (true/1/yes/on, false/0/no/off),
object or array (JSON), string; where none of them reads it, JSON, else the text. An argument
its schema does not type (no `type`, or not in the schema, or a tool the request does not
list) is a **string**, ``42`` included, as vLLM keeps it. A name may be quoted or not.
Streaming is GLM-4.5's (`Glm45Stream`): a call's id and name once its ``<invoke name=...>``
is written, its arguments as JSON text parameter by parameter, the closing brace with
``</invoke>``. Output that holds no complete call stays content.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pagoda.runtime.server.tool_call import json_value
from pagoda.runtime.server.tool_parser_glm45 import Glm45Parser

TAG = "<minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke name=", "</invoke>"
_PARAMETER = re.compile(r"<parameter name=([^>]*)>(.*?)</parameter>", re.DOTALL)


_ORDER = ("integer", "int", "number", "float", "boolean", "bool", "object", "array", "string",
          "str", "text")  # vLLM's order of preference  # fmt: skip
_NO = object()  # the text is not of this type
_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}  # fmt: skip
_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"), (dict, "object"))  # fmt: skip


def schema_types(schema: Any) -> set[str]:
    """The JSON types an argument's schema allows (lowercase): its `type` (or types), its
    `enum`'s values' types, its `anyOf`/`oneOf`/`allOf`'s; {"string"} where it names none."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    t = schema.get("type")
    types.update(x.lower() for x in (t if isinstance(t, list) else [t]) if isinstance(x, str))
    enum = schema.get("enum")
    for v in enum if isinstance(enum, list) else []:
        types.add("null" if v is None else next(n for k, n in _ENUM_TYPES if isinstance(v, k)))
    for choice in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(choice), list):
            for sub in schema[choice]:
                types |= schema_types(sub)
    return types or {"string"}


def _as(t: str, text: str) -> Any:
    """`text` as a value of JSON type `t`, or `_NO`."""
    if t in ("string", "str", "text"):
        return text
    try:
        if t in ("integer", "int"):
            return int(text)
        if t in ("number", "float"):
            x = float(text)
            return _NO if not math.isfinite(x) else int(x) if x == int(x) else x
        if t in ("object", "array"):
            return json_value(text, rewritten=True)
    except ValueError:  # not JSON (NaN, nested past json's depth, ...): not that type
        return _NO
    return _BOOLEANS.get(text.lower(), _NO)


def _unquoted(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name


class MiniMaxM2Parser(Glm45Parser):
    """`tool_parsers.ToolParser`'s interface (listed in its PARSERS) over MiniMax-M2's tags."""

    name = "minimax_m2"
    markers = (TAG,)
    TAG = TAG

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self.schemas = {}  # tool name -> {argument: its schema}
        for t in tools or []:
            fn = t.get("function") or {}
            props = (fn.get("parameters") or {}).get("properties") or {}
            self.schemas[fn.get("name", "")] = props if isinstance(props, dict) else {}

    def value(self, tool: str, key: str, raw: str) -> Any:
        """An argument's value from its text, as vLLM's `minimax_m2` parser reads it (module
        docstring)."""
        text = raw.strip()
        if text.lower() in ("null", "none", "nil"):
            return None
        types = schema_types(self.schemas.get(tool, {}).get(key))
        for t in _ORDER:
            if t in types:
                got = _as(t, text)
                if got is not _NO:
                    return got
        try:
            return json_value(text, rewritten=True)
        except ValueError:
            return text

    def block(self, region: str, pos: int, first: bool) -> tuple[str, str, int | None] | None:
        """The `<invoke>` from `pos` of `region` (the text after `<minimax:tool_call>`): (its
        name, its body, where it ends: None while open), or None where no further call's name
        is written yet (`Glm45Parser.scan` reads the calls through it)."""
        at = region.find(INVOKE, pos)
        head = -1 if at < 0 else region.find(">", at)
        if head < 0:
            return None  # no further call, or its name still being written
        close = region.find(INVOKE_END, head)
        body = region[head + 1 :] if close < 0 else region[head + 1 : close]
        name = _unquoted(region[at + len(INVOKE) : head])
        return name, body, None if close < 0 else close + len(INVOKE_END)

    def pairs(self, body: str) -> list[tuple[str, str]]:
        return [(_unquoted(key), raw) for key, raw in _PARAMETER.findall(body)]
