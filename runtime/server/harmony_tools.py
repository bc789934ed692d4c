"""gpt-oss's tool calls (`pagoda serve --tool-call-parser openai --reasoning-parser
openai_gptoss`, vLLM's names).

gpt-oss calls a function with a harmony message addressed to it, on the commentary channel::

    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

(the recipient may also stand before ``<|channel|>``, as gpt-oss's template writes past calls).
``<|call|>`` ends the generation: gpt-oss's `generation_config.json` lists it among the EOS ids
beside ``<|return|>``. The harmony splitter (`harmony.py`, `HarmonyStream(calls=True)`) reads
the channels: the analysis goes to the reasoning, and each message to a function passes into
the content in one normalized form, ``<|start|>functions.NAME<|message|>ARGS<|call|>``. This
parser turns those into OpenAI `tool_calls`, whole and streamed: a call's id, type and name as
soon as its header is read, then its arguments as they arrive (the body as written, as vLLM's
`openai` parser returns it: the ``json`` constraint is the model's promise, not checked here).
The other text is content. Without `parallel_tool_calls`, calls after the first are dropped, and
so is a call to a function the request's tools do not list (OpenAI never returns one).

`tool_choice` `required` or a named function: a structural tag holds the reply to an optional
analysis and one call in this form, its markers named by token id (`tool_markers.py`).
Results sent back as `role: tool` messages render through gpt-oss's own template (its
``<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…`` turns).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pagoda.runtime.server.harmony import CALL_END, CALL_OPEN, MESSAGE
from pagoda.runtime.server.tool_call import KnownNames, ToolCall, call_id, prefix_overlap

NAME = "openai"


def described(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as gpt-oss's chat template takes it: with a `description` (OpenAI's is optional;
    the template writes ``"// " + tool.description`` and fails where there is none)."""
    fn = tool.get("function", {})
    return tool if "description" in fn else {**tool, "function": {**fn, "description": ""}}


class HarmonyToolParser(KnownNames):
    """`tool_parsers.ToolParser`'s interface (listed in its PARSERS) over the harmony splitter's
    normalized calls (not the model's raw text)."""

    name = NAME
    markers: ClassVar[tuple[str, ...]] = ()  # never chosen by `detect`: named with the flag
    new_id = staticmethod(call_id)

    def parse(self, text: str, parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
        stream = self.stream(parallel)
        delta = stream.feed(text, final=True)
        calls = [ToolCall(c["name"], c["arguments"], c["id"]) for c in stream.calls]
        return delta.get("content") or None, calls

    def stream(self, parallel: bool = True) -> HarmonyToolStream:
        return HarmonyToolStream(parallel, self.known)


class HarmonyToolStream:
    """One choice's normalized harmony content → OpenAI chat deltas (`ToolStream`'s interface)."""

    def __init__(self, parallel: bool = True, known: Any = None) -> None:
        self.parallel = parallel
        self.known = known or (lambda name: True)  # a function the request's tools list
        self.pending = ""  # held back: a marker's beginning, or a call header not yet whole
        self.in_call = False
        self.dropped = False  # inside a call dropped without parallel_tool_calls
        self.calls: list[dict[str, Any]] = []  # per call: id, name, arguments so far
        self.headers = 0  # calls read, those dropped too

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def read(self) -> bool:
        """Whether a call has been read (sent, or dropped: `tool_call.py`'s rules)."""
        return self.headers > 0

    def feed(self, delta: str, final: bool = False) -> dict[str, Any]:
        """The OpenAI `delta` for this much more text ({} when nothing can be sent yet)."""
        buf, self.pending = self.pending + delta, ""
        content: list[str] = []
        deltas: list[dict[str, Any]] = []
        while buf:
            if not self.in_call:
                at = buf.find(CALL_OPEN)
                if at < 0:
                    keep = 0 if final else prefix_overlap(buf, CALL_OPEN)
                    content.append(buf[: len(buf) - keep])
                    self.pending = buf[len(buf) - keep :]
                    break
                content.append(buf[:at])
                head = buf.find(MESSAGE, at)
                if head < 0:
                    self.pending = "" if final else buf[at:]
                    break
                self._open(buf[at + len(CALL_OPEN) : head], deltas)
                buf = buf[head + len(MESSAGE) :]
                continue
            end = buf.find(CALL_END)
            stop = end if end >= 0 else len(buf) - (0 if final else prefix_overlap(buf, CALL_END))
            self._arguments(buf[:stop], deltas)
            if end < 0:
                self.pending = buf[stop:]
                break
            self.in_call, buf = False, buf[end + len(CALL_END) :]
        out: dict[str, Any] = {}
        if text := "".join(content):
            out["content"] = text
        if deltas:
            out["tool_calls"] = deltas
        return out

    def _open(self, name: str, deltas: list[dict[str, Any]]) -> None:
        self.in_call, self.headers = True, self.headers + 1
        self.dropped = (bool(self.calls) and not self.parallel) or not self.known(name)
        if self.dropped:
            return
        call = {"id": call_id(), "name": name, "arguments": ""}
        self.calls.append(call)
        deltas.append({"index": len(self.calls) - 1, "id": call["id"], "type": "function",
                       "function": {"name": name, "arguments": ""}})  # fmt: skip

    def _arguments(self, text: str, deltas: list[dict[str, Any]]) -> None:
        if not text or self.dropped:
            return
        self.calls[-1]["arguments"] += text
        index = len(self.calls) - 1
        if deltas and deltas[-1]["index"] == index:  # one delta per call per feed
            deltas[-1]["function"]["arguments"] += text
        else:
            deltas.append({"index": index, "function": {"arguments": text}})
