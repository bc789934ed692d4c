"""Reasoning parsers (`pagoda serve --reasoning-parser`, names as vLLM's): the thinking a
reasoning model writes as ``<think> … </think>`` before its answer → the chat message's
`reasoning_content` (and `reasoning`, vLLM's newer name), the rest → `content`.

The parsers read the same markers with vLLM's rules:

* `deepseek_r1` (DeepSeek-R1 and its Llama/Qwen2 distills, QwQ): the output is thinking until
  ``</think>``; a ``<think>`` that opens the output is dropped (newer templates write it into the
  prompt, older models write it themselves). No ``</think>`` (max_tokens hit while thinking):
  all of it is reasoning, `content` is null.
* `qwen3`: the same, and with `chat_template_kwargs: {"enable_thinking": false}` the output is
  all content (the template wrote an empty thinking block into the prompt).

* `glm45` (GLM-4.5, GLM-4.6): the model opens its thinking itself (GLM's template ends the prompt
  at ``<|assistant|>``): an output that opens with ``<think>`` is thinking until ``</think>``
  (to its end without one, as vLLM streams it), one that does not is all content (vLLM's
  rule); `enable_thinking: false` (the template writes ``<think></think>`` into the prompt) is
  all content too.

Either way, where the prompt itself already closed the thinking (the text the template adds for
the reply holds ``</think>`` after its last ``<think>``), the output is all content.

`ReasoningStream` splits text as it streams: it holds back at most the few characters that may
begin a marker and scans only new text, never the whole output again. Tool calls and
structured outputs apply to the content alone (`chat.py`, `after_reasoning`).

`openai_gptoss` reads gpt-oss's harmony channels instead (`harmony.py`: `new_stream`), and
`hunyuan_a13b` strips Hunyuan's `<answer>` tags off the content too (`AnswerStream`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pagoda.runtime.server.harmony import HarmonyStream
from pagoda.runtime.structured.params import StructuredOutputsParams

START, END = "<think>", "</think>"
HARMONY = "openai_gptoss"  # gpt-oss's channels (`harmony.py`)
# Whitespace before an opening `<think>` is dropped with it; past this much, no `<think>` opens
# the output (its text is reasoning as written).
_MAX_LEADING_SPACE = 64
# parsers whose output thinks only when it opens with `<think>`
MUST_OPEN = ("glm45", "hunyuan_a13b")
HUNYUAN = "hunyuan_a13b"  # its answer tags stripped too (`AnswerStream`)


def thinks(parser: str | None, prompt_tail: str, template_kwargs: dict[str, Any] | None) -> bool:
    """Whether a reply starts inside the model's thinking: a parser is configured, qwen3's
    thinking is not switched off, and the prompt's `prompt_tail` (what the chat template adds
    for the reply) does not close a thinking block itself."""
    if parser is None:
        return False
    if parser in ("qwen3", "glm45") and (template_kwargs or {}).get("enable_thinking") is False:
        return False
    closed = prompt_tail.rfind(END)
    return closed < 0 or prompt_tail.rfind(START) > closed


def new_stream(parser: str | None, thinking: bool,
               calls: bool = False) -> ReasoningStream | HarmonyStream:  # fmt: skip
    """A choice's splitter for `parser`'s replies (`thinking`: `thinks`'s answer; `calls`:
    harmony messages to functions are tool calls, `harmony_tools.py`)."""
    if parser == HUNYUAN:
        return AnswerStream(thinking)  # type: ignore[return-value]
    return HarmonyStream(calls) if parser == HARMONY else ReasoningStream(thinking, parser)


def _held(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """One choice's text → (reasoning, content) pieces, fed delta by delta."""

    __slots__ = ("begin_at", "end_at", "fed", "must_open", "opening", "pending", "thinking")
    # a whole reply's reasoning stays what its <think> block holds, "" included (vLLM's parsers)
    no_reasoning_is_none = False

    def __init__(self, thinking: bool, parser: str | None = None) -> None:
        self.thinking = thinking  # still inside the thinking block
        self.opening = thinking  # a `<think>` may still open the output
        self.must_open = parser in MUST_OPEN  # without that `<think>`, the output is content
        self.pending = ""  # text held back: it may begin a marker
        self.fed = 0  # characters of output fed so far
        self.begin_at = 0  # where in the output the thinking begins (after a `<think>`)
        self.end_at: int | None = None  # where in the output `</think>` begins, once seen

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of `text` after what came before; `final`: the output ends
        here (nothing is held back)."""
        if not self.thinking:
            return "", text
        self.fed += len(text)
        buf = self.pending + text  # always the output's last len(buf) characters
        self.pending = ""
        if self.opening:
            body = buf.lstrip()
            if body.startswith(START):
                buf, self.opening = body[len(START) :], False
                self.begin_at = self.fed - len(buf)
            elif not final and START.startswith(body) and len(buf) <= _MAX_LEADING_SPACE:
                self.pending = buf  # whitespace, or a beginning of `<think>`
                return "", ""
            else:
                self.opening = False
                if self.must_open:  # the model did not think: all of it is content
                    self.thinking = False
                    return "", buf
        at = buf.find(END)
        if at >= 0:
            self.thinking, self.end_at = False, self.fed - len(buf) + at
            return buf[:at], buf[at + len(END) :]
        keep = 0 if final else _held(buf, END)
        self.pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], ""


def split(text: str, stream: ReasoningStream) -> tuple[str | None, str | None]:
    """A whole output's (reasoning, content), as vLLM's parsers answer, fed to a new `stream`:
    reasoning None when the reply does not think (gpt-oss's: when it has no analysis text, as
    vLLM's harmony reading); content None when nothing follows the thinking."""
    if hasattr(stream, "split"):  # Hunyuan's (`AnswerStream`)
        return stream.split(text)
    if not stream.thinking:
        return None, text
    reasoning, content = stream.feed(text, final=True)
    if stream.no_reasoning_is_none:  # gpt-oss: no (or an empty) analysis is None, as vLLM's
        return reasoning or None, content or None
    if not stream.thinking and stream.end_at is None:  # glm45's output that did not think
        return None, content or None
    return reasoning, content or None


def reasoning_tokens(ids: Sequence[int], stream: ReasoningStream | None, end_id: int | None,
                     text_of: Callable[[int], str]) -> int:  # fmt: skip
    """How many of a reply's tokens `ids` are thinking (OpenAI's `reasoning_tokens`): those
    between an opening `<think>` and `</think>` (to the end while `stream` never saw it), by
    where each token's text (`text_of`) begins; the marker is found by its token `end_id`
    where it is one (Qwen3's and DeepSeek-R1's vocabularies). None without thinking."""
    if isinstance(stream, HarmonyStream):
        return stream.reasoning_tokens(ids, text_of)
    if stream is None or not (stream.thinking or stream.end_at is not None):
        return 0
    stop, end_at = len(ids), stream.end_at
    if end_at is not None and end_id is not None and end_id in ids:
        stop, end_at = list(ids).index(end_id), None
    at = n = 0
    for t in ids[:stop]:
        if end_at is not None and at >= end_at:
            break
        n += at >= stream.begin_at
        at += len(text_of(t))
    return n


def after_reasoning(spec: StructuredOutputsParams) -> StructuredOutputsParams:
    """`spec` applied only once the thinking ends, as vLLM applies a grammar: free text (an
    optional opening `<think>`, then anything up to `</think>`), then `spec`'s own grammar
    from the first character after the marker; a structural tag (xgrammar's `any_text` ends at
    the first `</think>`). The thinking is not constrained, except that it cannot end the
    output (EOS there is masked: a reply must reach its answer or max_tokens)."""
    from pagoda.runtime.structured.compiler import spec_grammar

    grammar = spec_grammar(spec)  # ParamError naming the spec's field when it is invalid
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "regex", "pattern": r"([ \t\r\n]*<think>)?"},
                {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": END},
                {"type": "grammar", "grammar": str(grammar)},
            ],
        },
    }
    return StructuredOutputsParams(
        structural_tag=json.dumps(tag, ensure_ascii=False),
        field=spec.field,
        asked=spec.asked or spec.kind,  # the metrics count what the client asked for
    )


ANSWER, ANSWER_END = "<answer>", "</answer>"


class AnswerStream:
    """One choice's text → (reasoning, content) pieces, fed delta by delta, for Hunyuan's replies
    (`--reasoning-parser hunyuan_a13b`, vLLM's name; Hunyuan-A13B and the dense Hunyuan 0.5B-7B
    instruct models)::

        <think>
        the thinking
        </think>
        <answer>
        the answer
        </answer>

    as vLLM's hunyuan_a13b parser reads them: the reasoning is the text between the markers
    without the newline after ``<think>`` and the one before ``</think>`` (null when that leaves
    nothing: an empty thinking block); the content is the answer without ``<answer>``, the newline
    after it, the newline before ``</answer>`` and that marker (null when empty). An output that
    does not open with ``<think>`` does not think (`reasoning.MUST_OPEN`); its content loses the
    answer tags too, as does the reply of a prompt whose template closed the thinking itself.

    `AnswerStream` wraps `reasoning.ReasoningStream` (which splits at the markers, holding back
    what may begin one) and trims its two sides as they stream: a newline that ends the reasoning
    so far is held until more reasoning follows, and the content holds back what may begin
    ``</answer>``; text after ``</answer>`` is dropped.
    """

    no_reasoning_is_none = True

    def __init__(self, thinking: bool) -> None:
        self.inner = ReasoningStream(thinking, HUNYUAN)
        self.started = False  # the reasoning's first character seen (its newline dropped)
        self.newline = ""  # a newline held at the end of the reasoning so far
        self.opening = True  # the content may still begin with <answer>
        self.pending = ""  # content held back: it may begin <answer> or </answer>
        self.done = False  # </answer> seen

    # `reasoning.reasoning_tokens` reads these off the splitter
    thinking = property(lambda self: self.inner.thinking)
    begin_at = property(lambda self: self.inner.begin_at)
    end_at = property(lambda self: self.inner.end_at)

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = self.inner.feed(text, final)
        return self._reasoning(reasoning, final or not self.inner.thinking), self._content(
            content, final
        )

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole output's (reasoning, content) (`reasoning.split`), nulls for empty ones."""
        thought, answer = self.feed(text, final=True)
        thinks = self.inner.end_at is not None or self.inner.thinking or bool(thought)
        return (thought or None) if thinks else None, answer or None

    def _reasoning(self, text: str, closing: bool) -> str:
        buf = self.newline + text
        self.newline = ""
        if not self.started and buf:
            self.started = True
            buf = buf.removeprefix("\n")
        if buf.endswith("\n"):
            buf = buf[:-1]
            self.newline = "" if closing else "\n"
        return buf

    def _content(self, text: str, final: bool) -> str:
        if self.done:
            return ""
        buf = self.pending + text
        self.pending = ""
        if self.opening:
            body = buf.lstrip()
            if body.startswith(ANSWER):
                rest = body[len(ANSWER) :]
                if not rest and not final:  # the newline after it may follow
                    self.pending = buf
                    return ""
                buf, self.opening = rest.removeprefix("\n"), False
            elif not final and ANSWER.startswith(body):
                self.pending = buf  # whitespace, or a beginning of <answer>
                return ""
            else:
                self.opening = False
        at = buf.find(ANSWER_END)
        if at >= 0:
            self.done = True
            return buf[:at].removesuffix("\n")
        keep = 0 if final else max(_held(buf, "\n" + ANSWER_END), _held(buf, ANSWER_END))
        self.pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]
