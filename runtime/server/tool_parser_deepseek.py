"""DeepSeek's tool calls (`--tool-call-parser deepseek_v3|deepseek_v31`, vLLM's names). After
optional text, one block of calls, each with its name and its arguments' JSON text:

    deepseek_v3:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                  ```json
                  {"city": "Paris"}
                  ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    deepseek_v31: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"city": "Paris"}
                  <｜tool▁call▁end｜><｜tool▁calls▁end｜>

(V3.1 has no newline before its end marker.) As vLLM's parsers: the content is the text before
the block as written (None when empty), each call's arguments the text between its markers,
not checked. Output in which no call's header is whole stays content; a call to a function
the request's tools lack is dropped and the calls after it read on; a call cut short is
reported as streamed (`tool_call.py`'s rules).

Streaming sends a call's id and name once its header is whole (V3: through the line
```` ```json ````), then its arguments as they arrive, holding back only what may begin the
call's end: the pieces join to the whole response's. Never chosen by `tools.detect` (both
templates write the same first marker): named with the flag. `tool_choice` required or a
named function: a grammar writes the block, its markers as tokens (`tool_markers.py`).
"""

from __future__ import annotations

from typing import ClassVar

from pagoda.runtime.server.tool_call import (
    KnownNames,
    ScannedCallStream,
    StartTag,
    ToolCall,
    call_id,
    parsed,
    prefix_overlap,
)

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekV3Parser(StartTag, KnownNames):
    """`tool_parsers.ToolParser`'s interface (listed in its PARSERS) over DeepSeek-V3's calls."""

    name = "deepseek_v3"
    markers: ClassVar[tuple[str, ...]] = ()  # never chosen by `detect`: named with the flag
    TAG = CALLS_BEGIN
    new_id = staticmethod(call_id)
    args_open = "\n```json\n"  # between the name and the arguments
    args_close = "\n```" + CALL_END

    def header(self, head: str) -> str | None:
        """The call's name from its header (the text after CALL_BEGIN, up to the arguments)."""
        _, sep, name = head.partition(SEP)  # V3: the call's type ("function") before SEP
        return name.strip() if sep else None

    def scan(self, region: str) -> list[tuple[str, str, bool]]:
        """The calls in `region` (the text after CALLS_BEGIN) so far, those to functions the
        request's tools lack too (the stream drops them): (name, arguments text so far,
        closed), up to the first whose header is not yet whole."""
        calls: list[tuple[str, str, bool]] = []
        pos = 0
        while True:
            begin = region.find(CALL_BEGIN, pos)
            if begin < 0:
                break
            start = begin + len(CALL_BEGIN)
            opened = region.find(self.args_open, start)
            if opened < 0:
                break  # the header is still being written
            name = self.header(region[start:opened])
            if not name:
                break
            body = opened + len(self.args_open)
            close = region.find(self.args_close, body)
            if close < 0:
                held = prefix_overlap(region[body:], self.args_close)
                calls.append((name, region[body : len(region) - held], False))
                break
            calls.append((name, region[body:close], True))
            pos = close + len(self.args_close)
        return calls

    def parse(self, text: str, parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
        return parsed(self, text, parallel)

    def stream(self, parallel: bool = True) -> DeepSeekStream:
        return DeepSeekStream(self, parallel)


class DeepSeekV31Parser(DeepSeekV3Parser):
    """DeepSeek-V3.1's calls: the name, then SEP, then the arguments up to the call's end."""

    name = "deepseek_v31"
    args_open = SEP
    args_close = CALL_END

    def header(self, head: str) -> str | None:
        return head.strip() or None


class DeepSeekStream(ScannedCallStream):
    """Incremental `DeepSeekV3Parser` output as OpenAI chat deltas: content up to
    `CALLS_BEGIN`, then each call's arguments as they arrive."""
