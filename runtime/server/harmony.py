"""gpt-oss's harmony replies (`pagoda serve --reasoning-parser openai_gptoss`, vLLM's name).

gpt-oss writes its reply as messages on channels, each a header and a body between special
tokens (its chat template ends the prompt with ``<|start|>assistant``)::

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>

The analysis channel's bodies are the reasoning (`reasoning_content`, `reasoning`), every other
channel's (final; a commentary preamble) the content; headers and markers are dropped. The
markers are special tokens, so such replies are decoded with them (`chat.py` sets
``skip_special_tokens`` false). An output that does not open with a harmony marker (a model that
does not write the format) is content as written.

With tool calls in play (`--tool-call-parser openai`, `harmony_tools.py`) a message addressed to
a function (``to=functions.NAME`` in its header) is a call: its header and body pass into the
content as one normalized piece, ``<|start|>functions.NAME<|message|>ARGS<|call|>``, which the
tool parser reads (the model's own markers never reach the content, so the form is
unambiguous); other recipients' messages stay content.

`HarmonyStream` reads a reply as it streams, with `reasoning.ReasoningStream`'s interface: it
holds back at most a header or a marker's beginning, scans only new text, and records where each
analysis body lies in the output so that `reasoning_tokens` counts its tokens. Structured outputs
are not applied after the analysis (`chat.py` refuses them with this parser); the grammar of
`tool_choice` required or named holds the whole reply, channels included (`tool_markers.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
OPENERS = (CHANNEL, "<|start|>")  # what a harmony reply (or its next message) begins with
ENDS = ("<|end|>", "<|return|>", "<|call|>")  # what ends a message's body
REASONING = "analysis"
CALL_OPEN, CALL_END = "<|start|>functions.", "<|call|>"  # a call's normalized form (`feed`)
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


def recipient(header: str) -> str | None:
    """The function a message header addresses (``<|channel|>commentary to=functions.f
    <|constrain|>json`` → f), None where it addresses none."""
    m = _RECIPIENT.search(header)
    return m.group(1) if m else None


def template_message(message: dict) -> dict:
    """A client's message as gpt-oss's chat template reads it: an assistant turn's reasoning
    (`reasoning_content`, or vLLM's `reasoning`) as `thinking`, which the template writes back
    as the analysis before that turn's tool call (and drops elsewhere, as harmony does)."""
    if message.get("role") != "assistant" or "thinking" in message:
        return message
    thought = message.get("reasoning_content")
    return message if thought is None else {**message, "thinking": thought}


def _channel(header: str) -> str:
    """The channel a message header names (``<|start|>assistant to=functions.f<|channel|>
    commentary json`` → commentary), "" where it names none."""
    at = header.rfind(CHANNEL)
    if at < 0:
        return ""
    words = header[at + len(CHANNEL) :].split("<|", 1)[0].split()
    return words[0] if words else ""


def _held(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper beginning of one of `markers`."""
    for n in range(min(max(map(len, markers)) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


class HarmonyStream:
    """One choice's harmony text → (reasoning, content) pieces, fed delta by delta."""

    __slots__ = ("calls", "channel", "fed", "in_body", "in_call", "pending", "plain", "spans",
                 "thinking")  # fmt: skip
    # a whole reply without analysis text: reasoning None, as vLLM's `parse_chat_output`
    no_reasoning_is_none = True

    def __init__(self, calls: bool = False) -> None:
        self.calls = calls  # a message to a function is a call (in its normalized form)
        self.in_call = False  # inside such a message's body
        self.thinking = True  # (`ReasoningStream`'s flag: the output is read, not passed on)
        self.plain: bool | None = None  # the output is not harmony (None: not known yet)
        self.pending = ""  # held back: the output's undecided start, a header, a marker's start
        self.in_body = False
        self.channel = ""
        self.fed = 0  # characters of output fed so far
        self.spans: list[list[int]] = []  # [begin, end) of each analysis body in the output

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of `text` after what came before; `final`: the output ends
        here (nothing is held back; an unfinished header is dropped)."""
        self.fed += len(text)
        buf, self.pending = self.pending + text, ""
        base = self.fed - len(buf)  # where `buf` begins in the output
        if self.plain is None:
            start = buf.lstrip()
            if start.startswith(OPENERS):
                self.plain = False
            elif not final and any(o.startswith(start) for o in OPENERS):
                self.pending = buf  # whitespace, or a marker's beginning
                return "", ""
            else:
                self.plain = True
        if self.plain:
            return "", buf
        reasoning: list[str] = []
        content: list[str] = []
        pos = 0
        while pos < len(buf):
            if not self.in_body:  # a header: up to <|message|>
                at = buf.find(MESSAGE, pos)
                if at < 0:
                    self.pending = "" if final else buf[pos:]
                    break
                header = buf[pos:at]
                self.channel, self.in_body, pos = _channel(header), True, at + len(MESSAGE)
                name = recipient(header) if self.calls else None
                self.in_call = name is not None
                if self.in_call:
                    content.append(f"{CALL_OPEN}{name}{MESSAGE}")
                elif self.channel == REASONING:
                    self.spans.append([base + pos, self.fed])
                continue
            found = [(at, m) for m in ENDS if (at := buf.find(m, pos)) >= 0]
            if found:
                end, marker = min(found)
                after = end + len(marker)
            else:  # the body goes on: keep back what may begin an end marker
                end = after = len(buf) - (0 if final else _held(buf[pos:], ENDS))
            reads = self.channel == REASONING and not self.in_call
            (reasoning if reads else content).append(buf[pos:end])
            if reads:
                self.spans[-1][1] = base + end
            if self.in_call and found:  # the call ends with its message
                content.append(CALL_END)
                self.in_call = False
            if found:
                self.in_body, pos = False, after
            else:
                self.pending, pos = buf[end:], len(buf)
        if final and self.in_call:  # cut off inside a call's arguments
            content.append(CALL_END)
            self.in_call = False
        return "".join(reasoning), "".join(content)

    def reasoning_tokens(self, ids: Sequence[int], text_of: Callable[[int], str]) -> int:
        """How many of `ids` (the reply's tokens, each adding `text_of(t)` to its text) begin
        inside an analysis body."""
        n = at = 0
        for t in ids:
            n += any(begin <= at < end for begin, end in self.spans)
            at += len(text_of(t))
        return n
