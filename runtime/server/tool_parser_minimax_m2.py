"""MiniMax-M2's tool calls (`--tool-call-parser minimax_m2`, vLLM's name): after optional text,
one block of calls, each an ``<invoke>`` with its arguments as ``<parameter>`` tags rather than
JSON, as MiniMax-M2's chat template asks for them::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

A value is typed as GLM-4.5's (`tool_parser_glm45.Glm45Parser.value`: the text, stripped, kept
as a string where the tool's schema says ``string``, else read as JSON, else as a Python
literal, else the string), which is what MiniMax's own parser does for the schema's types,
except that ``null`` is null whatever the type (as MiniMax's and vLLM's parsers read it); a
name may be quoted or not. Streaming is GLM-4.5's too (`Glm45Stream`): a call's id and name
once its ``<invoke name=...>`` is written, its arguments as JSON text parameter by parameter,
the closing brace with ``</invoke>``. Output that holds no complete call stays content.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.runtime.server.tool_parser_glm45 import Glm45Parser, json_pair

TAG = "<minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke name=", "</invoke>"
_PARAMETER = re.compile(r"<parameter name=([^>]*)>(.*?)</parameter>", re.DOTALL)


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

    def value(self, tool: str, key: str, raw: str) -> Any:
        """GLM-4.5's typing, but ``null`` is JSON's null whatever the schema says (a string
        argument's included), as MiniMax's and vLLM's parsers read it: the chat template
        writes a None argument as ``null``."""
        if raw.strip().lower() == "null":
            return None
        return super().value(tool, key, raw)

    def scan(self, region: str, parallel: bool) -> list[tuple[str, list[str], bool]]:
        """The calls in `region` (the text after `<minimax:tool_call>`) so far: (name, the
        arguments' `"key": value` JSON pieces, closed), up to the first whose name is not yet
        written."""
        calls: list[tuple[str, list[str], bool]] = []
        pos = 0
        while True:
            at = region.find(INVOKE, pos)
            head = -1 if at < 0 else region.find(">", at)
            if head < 0:
                break  # no further call, or its name still being written
            name = _unquoted(region[at + len(INVOKE) : head])
            if not name or "<" in name:
                break
            close = region.find(INVOKE_END, head)
            body = region[head + 1 :] if close < 0 else region[head + 1 : close]
            pieces, seen = [], set()
            for key, raw in _PARAMETER.findall(body):
                key = _unquoted(key)
                if key not in seen:
                    seen.add(key)
                    pieces.append(json_pair(key, self.value(name, key, raw)))
            calls.append((name, pieces, close >= 0))
            if close < 0 or not parallel:
                break
            pos = close + len(INVOKE_END)
        return calls
