"""Stored responses (`store: true`, OpenAI's default): in the API process's memory, bounded,
least recently used dropped first, as vLLM's (nothing survives a restart, and replicas do not
share them: a client continuing a conversation with `previous_response_id` must reach the
replica that answered, or send the conversation as input items).

Each entry holds the response's JSON (what `GET /v1/responses/{id}` answers) and the chat
messages of its conversation (input, then output; not its instructions), which a response
naming it as `previous_response_id` continues.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.server.protocol import APIError, shorten

MAX_RESPONSES = 4096
MAX_BYTES = 256 << 20  # the responses' JSON and their conversations' text, together


@dataclass(frozen=True)
class StoredResponse:
    body: bytes  # the response object as JSON
    messages: list[dict[str, Any]]  # its conversation as chat messages (no instructions)
    size: int  # bytes counted against MAX_BYTES


class ResponseStore:
    """Responses by id; safe to use from the request-preparing threads and the event loop."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, body: bytes, messages: list[dict[str, Any]],
            message_bytes: int) -> None:  # fmt: skip
        """Store a response (`message_bytes`: its conversation's size, roughly), dropping the
        least recently used past the bounds; one larger than the whole bound is not kept."""
        entry = StoredResponse(body, messages, len(body) + message_bytes)
        with self._lock:
            self._drop(response_id)
            if entry.size > self.max_bytes:
                return
            self._entries[response_id] = entry
            self._bytes += entry.size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response (now the most recently used); a 404 in OpenAI's shape if none."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
                return entry
        raise not_found(response_id, param)

    def delete(self, response_id: str) -> None:
        with self._lock:
            if self._drop(response_id):
                return
        raise not_found(response_id, None)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None


def not_found(response_id: str, param: str | None) -> APIError:
    what = "Previous response" if param == "previous_response_id" else "Response"
    return APIError(404, f"{what} with id '{shorten(response_id, 100)}' not found.", param=param,
                    code="previous_response_not_found" if param else "not_found")  # fmt: skip
