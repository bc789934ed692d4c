"""Hunyuan's replies (`--reasoning-parser hunyuan_a13b`, vLLM's name; Hunyuan-A13B and the
dense Hunyuan 0.5B-7B instruct models)::

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

from __future__ import annotations

from pagoda.runtime.server.reasoning import ReasoningStream, _held

NAME = "hunyuan_a13b"
ANSWER, ANSWER_END = "<answer>", "</answer>"


class AnswerStream:
    """One choice's text → (reasoning, content) pieces, fed delta by delta (module docstring)."""

    no_reasoning_is_none = True

    def __init__(self, thinking: bool) -> None:
        self.inner = ReasoningStream(thinking, NAME)
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
