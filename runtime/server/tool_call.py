"""A parsed tool call (OpenAI's shape) and the helpers every tool-call parser shares
(`tool_parsers.py`, `tool_parser_glm45.py`, `tool_parser_deepseek.py`)."""

from __future__ import annotations

import json
import re
import uuid
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


class ScannedCallStream:
    """Incremental output of a parser that reads its calls by scanning the text after its marker
    (GLM-4.5's, DeepSeek's), as OpenAI chat deltas (`tool_parsers.ToolStream`'s interface): the
    content up to the marker, then each call's id and name once and its arguments as they grow.
    The parser gives `_start`, `_held`, `marker_text`, `parse`, `new_id` and `scan(region,
    parallel)`: per call so far (name, arguments text so far, closed)."""

    def __init__(self, parser: Any, parallel: bool = True) -> None:
        self.parser, self.parallel = parser, parallel
        self.text = ""
        self.content_sent = 0
        self.region: int | None = None
        self.calls: list[dict[str, Any]] = []  # per call: its id, argument characters sent

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def content_end(self, text: str) -> int:
        """Where the content sent so far may end: before a marker that may be beginning, or
        before the marker once seen."""
        p = self.parser
        if self.region is None:
            return len(text) - p._held(text)
        return self.region - len(p.marker_text(text, self.region))

    def arguments(self, region: str) -> list[tuple[str, str]]:
        """(name, arguments text so far) of each call in `region`."""
        return [(name, args) for name, args, _ in self.parser.scan(region, self.parallel)]

    def feed(self, delta: str, final: bool = False) -> dict[str, Any]:
        self.text += delta
        p, text, out = self.parser, self.text, {}
        if self.region is None:
            self.region = p._start(text, final)
        if final and not self.calls and not p.parse(text, self.parallel)[1]:
            end = len(text)  # no call after all: content
        else:
            end = self.content_end(text)
        if end > self.content_sent:
            out["content"] = text[self.content_sent : end]
            self.content_sent = end
        if self.region is not None and end < len(text):
            deltas = []
            for i, (name, args) in enumerate(self.arguments(text[self.region :])):
                if i == len(self.calls):
                    self.calls.append({"id": p.new_id(), "sent": 0})
                    deltas.append({"index": i, "id": self.calls[i]["id"], "type": "function",
                                   "function": {"name": name, "arguments": ""}})  # fmt: skip
                state = self.calls[i]
                if len(args) > state["sent"]:
                    deltas.append({"index": i, "function": {"arguments": args[state["sent"] :]}})
                    state["sent"] = len(args)
            if deltas:
                out["tool_calls"] = deltas
        return out
