"""A parsed tool call (OpenAI's shape) and the helpers every tool-call parser shares
(`tool_parsers.py`, `tool_parser_glm45.py`, `tool_parser_deepseek.py`, `harmony_tools.py`): among
them the streams' common part (`CallStream`).

Two rules every parser keeps, so that a streamed response and a whole one agree:

* A call to a function the request's `tools` do not list is no call (OpenAI never returns one;
  a client dispatching on the name has nothing to run): it is dropped, its text neither content
  nor a call, and the calls after it are read on, numbered densely (OpenAI's `index` counts the
  calls sent: 0, 1, ...). The stream checks the name before it sends the call's first delta,
  so nothing is sent that the whole response lacks (`KnownNames`; gpt-oss's the same,
  `harmony_tools.py`). Without `parallel_tool_calls` the first call sent is the only one.
* The whole response is the stream's (`parsed`): its content and calls are what the stream
  sends for the whole text (so whitespace before a call, which a stream holds back, is not
  content; whitespace leading the content is). Once a call's id and name have been sent it
  stays a call, with the arguments text written, even where the output then ends (max_tokens:
  `finish_reason` is `length`, as OpenAI reports a call cut short) or the text stops being a
  call; OpenAI's own arguments are the model's text, not checked either.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=call_id)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip


def tool_names(tools: list[dict[str, Any]] | None) -> frozenset[str] | None:
    """The function names of a request's tools (OpenAI's shape); None: any name (no request)."""
    if tools is None:
        return None
    return frozenset((t.get("function") or {}).get("name", "") for t in tools)


class KnownNames:
    """`for_request` and `known` of a parser: the request's tool names, the only calls read."""

    names: frozenset[str] | None = None  # None: any name (a parser made without a request)

    @classmethod
    def for_request(cls, tools: list[dict[str, Any]]) -> Any:
        """The parser of one request with these tools (OpenAI's shape)."""
        parser = cls()
        parser.names = tool_names(tools)
        return parser

    def known(self, name: str) -> bool:
        return self.names is None or name in self.names


def parsed(parser: Any, text: str, parallel: bool) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output: what its stream sends for the whole of `text`
    (module docstring), the content None where empty. Output in which no call is read (one sent
    or one dropped) is all content, as written."""
    stream = parser.stream(parallel)
    out = stream.feed(text, final=True)
    if not stream.read:
        return text, []
    calls: list[ToolCall] = []
    for d in out.get("tool_calls", []):
        if "id" in d:
            calls.append(ToolCall(d["function"]["name"], "", d["id"]))
        calls[d["index"]].arguments += d["function"].get("arguments", "")
    return out.get("content") or None, calls


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# arrays and objects nested deeper than this are no value (json.loads's own bound is the
# interpreter's recursion limit, which other imports raise: torch._dynamo's, for one)
MAX_DEPTH = 512
_OPENERS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]')


def too_deep(text: str) -> bool:
    """Whether `text` nests arrays or objects past `MAX_DEPTH` (brackets inside strings not
    counted)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for m in _OPENERS.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
    return False


def json_value(text: str, *, rewritten: bool = False) -> Any:
    """The JSON value of a model's `text`; ValueError where it is none: what json.loads
    refuses, NaN and Infinity (which it reads, and no strict JSON parser does), nesting past
    `MAX_DEPTH`; `rewritten` (the value is written out again as JSON): a number past a double
    too (read as inf, it would be written as Infinity)."""
    if too_deep(text):
        raise ValueError("nested too deeply")
    try:
        value = json.loads(text, parse_constant=_no_constant)
        if rewritten:
            json.dumps(value, allow_nan=False)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e
    return value


def prefix_overlap(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class StartTag:
    """`_start`, `marker_text` and `_held` of a format whose calls begin after one fixed tag,
    `TAG` (Hermes', Mistral's, GLM-4.5's, DeepSeek's, ...): the text up to it is content, and
    an output's end that could still become it is held back."""

    TAG: ClassVar[str]

    def _start(self, text: str, final: bool) -> int | None:
        i = text.find(self.TAG)
        return None if i < 0 else i + len(self.TAG)

    def marker_text(self, text: str, start: int) -> str:
        return self.TAG

    def _held(self, text: str) -> int:
        return prefix_overlap(text, self.TAG)


class CallStream(ABC):
    """One choice's text → OpenAI chat deltas, the part every parser's stream shares
    (`tool_parsers.ToolStream`, `ScannedCallStream`): the content up to the call marker, then
    the calls (`_call_deltas`, the parser's own: each call's id and name once, its arguments as
    they grow; `slot` drops those not sent). The parser gives `_start`, `_held` and
    `marker_text`; `hold_space`: whitespace before a call is not content (held until more
    content follows), as the parser's `parse` strips it."""

    hold_space = False

    def __init__(self, parser: Any, parallel: bool = True) -> None:
        self.parser, self.parallel = parser, parallel
        self.text = ""
        self.content_sent = 0  # characters of content sent
        self.region: int | None = None  # where the call region starts, once known
        self.calls: list[dict[str, Any]] = []  # per call sent: its id, argument characters sent
        self.slots: list[int | None] = []  # per call read: its index among those sent, or None

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def read(self) -> bool:
        """Whether a call has been read (sent, or dropped: `tool_call.py`'s rules)."""
        return bool(self.slots)

    def content_end(self, text: str) -> int:
        """Where the content sent so far may end: before a marker that may be beginning, or
        before the marker once seen."""
        p = self.parser
        if self.region is None:
            end = len(text) - p._held(text)
        else:
            end = self.region - len(p.marker_text(text, self.region))
        if self.hold_space:
            end = max(end, self.content_sent)
            while end > self.content_sent and text[end - 1].isspace():
                end -= 1
        return end

    def feed(self, delta: str, final: bool = False) -> dict[str, Any]:
        """The OpenAI `delta` for this much more text ({} when nothing can be sent yet); with
        `final`, everything left (text that never became a call is content after all)."""
        self.text += delta
        p, text, out = self.parser, self.text, {}
        if self.region is None:
            self.region = p._start(text, final)
        deltas = [] if self.region is None else self._call_deltas(text[self.region :])
        end = len(text) if final and not self.read else self.content_end(text)
        if end > self.content_sent:  # (no call after all: all content)
            out["content"] = text[self.content_sent : end]
            self.content_sent = end
        if deltas:
            out["tool_calls"] = deltas
        return out

    @abstractmethod
    def _call_deltas(self, region: str) -> list[dict[str, Any]]:
        """The deltas of the calls read in `region` (the text from the marker on) since the
        last feed; each stream reads its parser's calls."""


class ScannedCallStream(CallStream):
    """A parser that reads its calls by scanning the text after its marker (GLM-4.5's,
    DeepSeek's): its `scan(region)` gives, per call read so far, (name, arguments text so far,
    closed); its `known` and `new_id` name and number them."""

    def arguments(self, region: str) -> list[tuple[str, str]]:
        """(name, arguments text so far) of each call in `region`."""
        return [(name, args) for name, args, _ in self.parser.scan(region)]

    def _call_deltas(self, region: str) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for i, (name, args) in enumerate(self.arguments(region)):
            index = slot(self, i, name, deltas)
            if index is None:
                continue
            state = self.calls[index]
            if len(args) > state["sent"]:
                deltas.append({"index": index, "function": {"arguments": args[state["sent"] :]}})
                state["sent"] = len(args)
        return deltas


def slot(stream: Any, i: int, name: str, deltas: list[dict[str, Any]]) -> int | None:
    """The index among the calls sent of a `stream`'s `i`th call read (named `name`), None
    where it is dropped (a function the request's tools lack, or a call after the first
    without `parallel`); a call read for the first time that is sent gets its id and name
    delta in `deltas`. The stream has `parser` (`known`, `new_id`), `parallel`, `calls` (per
    call sent: {"id", "sent"}) and `slots` (per call read: its index or None)."""
    if i == len(stream.slots):
        keep = stream.parser.known(name) and (stream.parallel or not stream.calls)
        stream.slots.append(len(stream.calls) if keep else None)
        if keep:
            call = {"id": stream.parser.new_id(), "sent": 0}
            stream.calls.append(call)
            deltas.append({"index": len(stream.calls) - 1, "id": call["id"], "type": "function",
                           "function": {"name": name, "arguments": ""}})  # fmt: skip
    return stream.slots[i]
