"""A response's `output` items, written from chat's reply: the whole message at once or its
stream's deltas, and the stream events each step makes (OpenAI's order and shapes).

The items come in the order the reply writes them: a `reasoning` item for a reasoning model's
thinking, a `message` item for text (one `output_text` part, no annotations), a `function_call`
item per call. A full response is built the way a stream is (`feed_message` feeds the chat
message as one delta), so both give the same items. Events carry no sequence number (the
stream numbers them as it sends them).
"""

from __future__ import annotations

import uuid
from typing import Any

# item kind → (id prefix, the part its text goes in, the delta and done events of that text)
TEXT_ITEMS = {
    "message": ("msg", "output_text", "response.output_text.delta", "response.output_text.done"),
    "reasoning": ("rs", "reasoning_text", "response.reasoning_text.delta",
                  "response.reasoning_text.done"),
}  # fmt: skip


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    """The output items of one response, built from chat's reply."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written (the last one)
        self._text: list[str] = []  # the open text item's pieces
        self._calls: dict[int, dict[str, Any]] = {}  # chat's tool-call index → its item

    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat delta (`reasoning`, `content`, `tool_calls`, in that order)."""
        events: list[dict[str, Any]] = []
        if delta.get("reasoning"):
            self._write("reasoning", delta["reasoning"], events)
        if delta.get("content"):
            self._write("message", delta["content"], events)
        for call in delta.get("tool_calls") or ():
            self._call(call, events)
        return events

    def feed_message(self, message: dict[str, Any]) -> None:
        """A full response's chat message, as one delta."""
        calls = [{"index": i, **c} for i, c in enumerate(message.get("tool_calls") or ())]
        self.feed({"reasoning": message.get("reasoning"), "content": message.get("content"),
                   "tool_calls": calls})  # fmt: skip

    def close(self, status: str) -> list[dict[str, Any]]:
        """The events that end the item being written (`status`: completed or incomplete); a
        reply with no output at all gets an empty message (the SDK's `output_text` is "")."""
        events: list[dict[str, Any]] = []
        if not self.items:
            self._open_text("message", events)
        self._end(events, status)
        return events

    def _start(self, item: dict[str, Any], events: list[dict[str, Any]]) -> int:
        self._end(events, "completed")
        self.items.append(item)
        self._open = item
        index = len(self.items) - 1
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": dict(item)})  # fmt: skip
        return index

    def _write(self, kind: str, text: str, events: list[dict[str, Any]]) -> None:
        item = self._open
        if item is None or item["type"] != kind:
            item = self._open_text(kind, events)
        self._text.append(text)
        event = {"type": TEXT_ITEMS[kind][2], "item_id": item["id"],
                 "output_index": len(self.items) - 1, "content_index": 0, "delta": text}  # fmt: skip
        if kind == "message":
            event["logprobs"] = []
        events.append(event)

    def _open_text(self, kind: str, events: list[dict[str, Any]]) -> dict[str, Any]:
        prefix, part = TEXT_ITEMS[kind][:2]
        if kind == "message":
            item = {"id": item_id(prefix), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}  # fmt: skip
        else:
            item = {"id": item_id(prefix), "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}  # fmt: skip
        index = self._start(item, events)
        self._text = []
        events.append({"type": "response.content_part.added", "item_id": item["id"],
                       "output_index": index, "content_index": 0, "part": _part(part, "")})  # fmt: skip
        return item

    def _call(self, call: dict[str, Any], events: list[dict[str, Any]]) -> None:
        function = call.get("function") or {}
        item = self._calls.get(call["index"])
        if item is None:  # a call's first delta carries its id and name
            item = {"id": item_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": call["id"], "name": function["name"], "arguments": ""}  # fmt: skip
            self._start(item, events)
            self._calls[call["index"]] = item
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append({"type": "response.function_call_arguments.delta",
                           "item_id": item["id"], "output_index": self.items.index(item),
                           "delta": function["arguments"]})  # fmt: skip

    def _end(self, events: list[dict[str, Any]], status: str) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index = len(self.items) - 1
        item["status"] = status
        if item["type"] == "function_call":
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "name": item["name"],
                           "arguments": item["arguments"]})  # fmt: skip
        else:
            _, part, _, done_event = TEXT_ITEMS[item["type"]]
            text = "".join(self._text)
            done = {"type": done_event, "item_id": item["id"], "output_index": index,
                    "content_index": 0, "text": text}  # fmt: skip
            if item["type"] == "message":
                done["logprobs"] = []
            item["content"] = [_part(part, text)]
            events.append(done)
            events.append({"type": "response.content_part.done", "item_id": item["id"],
                           "output_index": index, "content_index": 0,
                           "part": _part(part, text)})  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": item})  # fmt: skip


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": kind, "text": text}


def as_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages that continue its conversation: one assistant
    message holding its text, its calls and its thinking (`reasoning_content`)."""
    text = "".join(i["content"][0]["text"] for i in items if i["type"] == "message")
    thought = "".join(i["content"][0]["text"] for i in items if i["type"] == "reasoning")
    calls = [{"id": i["call_id"], "type": "function",
              "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in items if i["type"] == "function_call"]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thought:
        message["reasoning_content"] = thought
    return [message]


def usage(chat: dict[str, Any]) -> dict[str, Any]:
    """Chat's usage as the Responses API's."""
    details = chat.get("completion_tokens_details") or {}
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
        "total_tokens": chat["total_tokens"],
    }
