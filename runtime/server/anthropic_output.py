"""A Messages API reply written from chat's: the message's content blocks (a whole reply at
once), or its stream's events from chat's deltas; the stop reason and usage as Anthropic
reports them.

Blocks come in the order the reply writes them: a `thinking` block for a reasoning model's
thinking (its `signature` empty: nothing is signed here), a `text` block, a `tool_use` block per
call (`input`: the call's arguments; arguments that are not a JSON object, as a call cut short
by max_tokens, give `{}` in a whole reply, while a stream has sent their text as it came).
Usage is Anthropic's: `input_tokens` the prompt's tokens not read from the prefix cache,
`cache_read_input_tokens` those that were (their sum is chat's `prompt_tokens`).
"""

from __future__ import annotations

import json
from typing import Any

from pagoda.runtime.server.protocol import APIError

# chat's finish reason → Anthropic's stop reason (`stop`: end_turn, or stop_sequence)
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
# a stream delta's kind → (its block's type, the block as it starts, the delta's type, its key)
TEXT_BLOCKS = {
    "reasoning": ("thinking", {"type": "thinking", "thinking": "", "signature": ""},
                  "thinking_delta", "thinking"),
    "content": ("text", {"type": "text", "text": ""}, "text_delta", "text"),
}  # fmt: skip


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole reply's chat message as content blocks."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning"):
        blocks.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": _input(call["function"]["arguments"])})  # fmt: skip
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_of(finish_reason: str | None, stop_reason: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of chat's finish reason and the stop that ended it (a stop
    string, or the token id of an end of turn). A reply aborted in the engine (the server
    draining past its timeout) has no Anthropic stop reason: a 503."""
    if finish_reason == "abort":
        raise APIError(503, "the reply was cut short: the server is shutting down",
                       code="aborted")  # fmt: skip
    if finish_reason == "stop" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    return STOP_REASONS.get(finish_reason or "", "end_turn"), None


def usage_of(chat: dict[str, Any]) -> dict[str, int]:
    cached = chat["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": chat["prompt_tokens"] - cached,
            "output_tokens": chat["completion_tokens"], "cache_read_input_tokens": cached}  # fmt: skip


def message(job_id: str, model: str, content: list[dict[str, Any]], stop: tuple[Any, Any],
            usage: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    return {"id": job_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": usage}  # fmt: skip


class StreamBlocks:
    """The content-block events of one streamed reply, from chat's deltas."""

    def __init__(self) -> None:
        self.count = 0  # blocks started
        self._open: str | None = None  # the kind of the block being written
        self._calls: dict[int, int] = {}  # chat's tool-call index → its block's index

    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat delta (`reasoning`, `content`, `tool_calls`, in that order)."""
        events: list[dict[str, Any]] = []
        for kind in TEXT_BLOCKS:
            if delta.get(kind):
                _, start, delta_type, key = TEXT_BLOCKS[kind]
                if self._open != kind:
                    self._start(kind, dict(start), events)
                events.append(self._delta({"type": delta_type, key: delta[kind]}))
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            if call["index"] not in self._calls:  # a call's first delta: its id and name
                block = {"type": "tool_use", "id": call["id"], "name": function["name"],
                         "input": {}}  # fmt: skip
                self._start(f"call {call['index']}", block, events)
                self._calls[call["index"]] = self.count - 1
            if function.get("arguments"):
                events.append(self._delta({"type": "input_json_delta",
                                           "partial_json": function["arguments"]}))  # fmt: skip
        return events

    def close(self) -> list[dict[str, Any]]:
        """The event that ends the block being written (none if no block was started)."""
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self.count - 1}]

    def _start(self, kind: str, block: dict[str, Any], events: list[dict[str, Any]]) -> None:
        events += self.close()
        events.append({"type": "content_block_start", "index": self.count, "content_block": block})
        self.count += 1
        self._open = kind

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.count - 1, "delta": delta}
