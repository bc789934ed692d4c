"""Tool-call parsers: a model's output text → OpenAI `tool_calls`, whole or as stream deltas.

Three formats, those of the model families served here (names as vLLM's `--tool-call-parser`):

* `hermes` (Hermes 2 Pro, Qwen 2.5/3, and the prompt Pagoda adds for templates without tools):
  ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block per call,
  after optional text;
* `llama3_json` (Llama 3.1-3.3): the whole output is ``{"name": "f", "parameters": {...}}``
  (after an optional ``<|python_tag|>``), several separated by ``;``;
* `mistral`: text, then ``[TOOL_CALLS]`` and a JSON array of ``{"name", "arguments"}`` objects.

All three are read by one scanner: a format says where its calls start (`_start`) and at which
JSON depth the call objects sit; inside the call region every top-level object is one call, and
its `arguments` (or `parameters`) value is streamed as raw JSON text as it arrives, so a client
sees OpenAI's chunk sequence: the call's id, type and name first, then argument deltas. Text
before the call region is content (streamed too, holding back only what could begin a call
marker). Output in which no call begins (no name and arguments key written) stays content; a
call to a function the request's tools lack is dropped, the calls after it read on; a whole
response is the stream's, arguments as written (`tool_call.py`'s rules).

GLM-4.5's calls (`glm45`: key/value tags, not JSON) are read by `tool_parser_glm45.py`, listed
in `PARSERS` beside these, and so are DeepSeek's (`deepseek_v3`, `deepseek_v31`:
`tool_parser_deepseek.py`) and MiniMax-M2's (`minimax_m2`: `<invoke>` / `<parameter>` tags,
`tool_parser_minimax_m2.py`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pagoda.runtime.server.harmony_tools import HarmonyToolParser
from pagoda.runtime.server.tool_call import (
    CallStream,
    KnownNames,
    StartTag,
    ToolCall,
    call_id,
    parsed,
    slot,
)
from pagoda.runtime.server.tool_parser_deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from pagoda.runtime.server.tool_parser_glm45 import Glm45Parser
from pagoda.runtime.server.tool_parser_minimax_m2 import MiniMaxM2Parser

ARG_KEYS = ("arguments", "parameters")
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
_ALNUM = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """9 letters and digits: Mistral's chat templates refuse any other id when the call and
    its result are sent back (as vLLM's mistral parser writes them)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def _value_end(text: str, start: int) -> int | None:
    """End (exclusive) of the JSON value starting at `start` (skipping leading whitespace), or
    None when the text stops inside it."""
    i, n = start, len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    if i == n:
        return None
    depth, in_str, esc = 0, False, False
    scalar = text[i] not in '{["'
    for j in range(i, n):
        c = text[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
                if depth == 0:
                    return j + 1
            continue
        if scalar:
            if c in ",}] \t\r\n":
                return j
            continue
        if c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def _objects(region: str, depth_of_calls: int) -> list[tuple[int, int | None]]:
    """(start, end or None) of the JSON objects at `depth_of_calls` in `region`."""
    spans: list[tuple[int, int | None]] = []
    depth, in_str, esc, start = 0, False, False, -1
    for j, c in enumerate(region):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
            continue
        if c == '"' and depth > depth_of_calls:
            in_str = True
        elif c in "{[":
            if c == "{" and depth == depth_of_calls:
                start = j
            depth += 1
        elif c in "}]" and depth > 0:
            depth -= 1
            if c == "}" and depth == depth_of_calls and start >= 0:
                spans.append((start, j + 1))
                start = -1
    if start >= 0:
        spans.append((start, None))
    return spans


@dataclass
class _Partial:
    """What is known so far of one call object's text."""

    name: str | None
    args: str  # the arguments value's text so far
    done: bool  # the object is closed
    args_done: bool
    has_args: bool  # the arguments key has been written


def _read_call(obj: str, done: bool) -> _Partial:
    a = _ARGS.search(obj)
    start = a.end() if a else len(obj)
    end = _value_end(obj, start) if a else None
    args = obj[start:end] if end is not None else obj[start:]
    name = None
    for m in _NAME.finditer(obj):  # the call's own name, not one inside the arguments
        if a is None or m.start() < a.start() or (end is not None and m.start() >= end):
            try:  # an escape JSON lacks ("\x"): no name, so the text stays content
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                name = None
            break
    return _Partial(name, args.strip(), done, end is not None, a is not None)


class ToolParser(KnownNames, ABC):
    """One output format. Subclasses say where calls start and how deep the call objects are."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]  # chat-template text that identifies the format
    call_depth: ClassVar[int] = 0
    # a call's id, in the form the format's chat templates take back
    new_id: ClassVar[Callable[[], str]] = staticmethod(call_id)

    @abstractmethod
    def _start(self, text: str, final: bool) -> int | None:
        """Where the call region begins (None: not begun; content may continue)."""

    def _held(self, text: str) -> int:
        """How many trailing characters could still turn into the call marker."""
        return 0

    def parse(self, text: str, parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole output: the calls its stream sends (`tool_call.parsed`).
        Without `parallel`, the first call only."""
        return parsed(self, text, parallel)

    def marker_text(self, text: str, start: int) -> str:
        """The marker just before `start` (left out of the content)."""
        return ""

    def stream(self, parallel: bool = True) -> ToolStream:
        return ToolStream(self, parallel)


class HermesParser(StartTag, ToolParser):
    name = "hermes"
    markers = ("<tool_call>",)
    TAG = "<tool_call>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = ("<|python_tag|>", '"parameters"')
    TAG = "<|python_tag|>"

    def _start(self, text: str, final: bool) -> int | None:
        stripped = text.lstrip()
        lead = len(text) - len(stripped)
        if stripped.startswith(self.TAG):
            return lead + len(self.TAG)
        if stripped.startswith("{"):
            return lead
        return None

    def marker_text(self, text: str, start: int) -> str:
        return self.TAG if text[:start].rstrip().endswith(self.TAG) else ""

    def _held(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or self.TAG.startswith(stripped):
            return len(text)  # undecided: the first character tells
        return 0


class MistralParser(StartTag, ToolParser):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    TAG = "[TOOL_CALLS]"
    call_depth = 1  # objects inside the JSON array
    new_id = staticmethod(mistral_call_id)


class HunyuanParser(MistralParser):
    """Hunyuan-A13B's calls, as vLLM's hunyuan_a13b reads them: a JSON array of
    `{"name", "arguments"}` objects between `<tool_calls>` and `</tool_calls>`."""

    name = "hunyuan_a13b"
    markers = ("<tool_calls>",)
    TAG = "<tool_calls>"
    new_id = staticmethod(call_id)


PARSERS: dict[str, type[ToolParser]] = {
    p.name: p
    for p in (
        HermesParser,
        Llama3JsonParser,
        MistralParser,
        Glm45Parser,
        HarmonyToolParser,
        DeepSeekV3Parser,
        DeepSeekV31Parser,
        MiniMaxM2Parser,
        HunyuanParser,
    )
}  # type: ignore[misc]  # (GLM-4.5's: tool_parser_glm45.py; gpt-oss's: harmony_tools.py;
#                          DeepSeek's: tool_parser_deepseek.py; MiniMax-M2's:
#                          tool_parser_minimax_m2.py)


def detect(template: str | None) -> str | None:
    """The parser a chat template's tool format calls for, when exactly one fits."""
    if not template:
        return None
    found = [name for name, p in PARSERS.items()
             if p.markers and all(m in template for m in p.markers[:1])]  # fmt: skip
    if "llama3_json" in found and "<|python_tag|>" not in template:
        found.remove("llama3_json")
    if "glm45" in found:  # GLM-4.5's calls open with <tool_call> too, then key/value tags
        found.remove("hermes")
    if "hunyuan_a13b" in found and "hermes" in found:  # <tool_calls> holds <tool_call>
        found.remove("hermes")
    return found[0] if len(found) == 1 else None


class ToolStream(CallStream):
    """Incremental parsing of one choice's text into OpenAI chat deltas: the calls are JSON
    objects (`_objects`, `_read_call`) at the parser's `call_depth`."""

    hold_space = True  # whitespace before a call is not content

    def _call_deltas(self, region: str) -> list[dict[str, Any]]:
        deltas = []
        for i, (a, b) in enumerate(_objects(region, self.parser.call_depth)):
            part = _read_call(region[a:b] if b is not None else region[a:], b is not None)
            if part.name is None or not part.has_args:  # a call starts once both are written
                break
            index = slot(self, i, part.name, deltas)
            if index is None:  # dropped: the calls after it read on
                continue
            state, args = self.calls[index], part.args
            if args.startswith('"'):  # arguments written as a JSON string: sent once whole
                if not (part.args_done and state["sent"] == 0):
                    continue
                try:
                    args = json.loads(args)
                except ValueError:
                    continue
                state["sent"] = -1
            elif len(args) <= state["sent"]:
                continue
            deltas.append(
                {"index": index, "function": {"arguments": args[max(state["sent"], 0) :]}}
            )
            state["sent"] = len(args) if state["sent"] >= 0 else -1
        return deltas
