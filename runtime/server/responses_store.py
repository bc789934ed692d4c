"""Stored responses (`store: true`, OpenAI's default): in the API process's memory, bounded,
least recently used dropped first, as vLLM's (nothing survives a restart, and replicas do not
share them: a client continuing a conversation with `previous_response_id` must reach the
replica that answered, or send the conversation as input items).

Each entry holds the response's JSON (what `GET /v1/responses/{id}` answers), its input items
(what `GET /v1/responses/{id}/input_items` lists) and the chat messages of its conversation
(input, then output; not its instructions), which a response naming it as
`previous_response_id` continues. A background response's entry also holds its run
(`responses_background.py`): its status as it goes, and its stream events where it was created
with `stream`; those events count toward the bound as they come. A response still running is
never dropped (it would run on with nowhere to go): finished ones are dropped first, and a
running one's bytes count until it ends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pagoda.runtime.server.protocol import APIError, shorten

if TYPE_CHECKING:
    from pagoda.runtime.server.responses_background import BackgroundRun

MAX_RESPONSES = 4096
MAX_BYTES = 256 << 20  # the responses' JSON, input items, conversations and events, together


@dataclass(frozen=True)
class StoredResponse:
    body: bytes  # the response object as JSON
    messages: list[dict[str, Any]]  # its conversation as chat messages (no instructions)
    size: int  # bytes counted against MAX_BYTES
    items: tuple[dict[str, Any], ...] = ()  # its input items, as OpenAI lists them
    run: BackgroundRun | None = None  # a background response's run

    @property
    def running(self) -> bool:
        return self.run is not None and not self.run.done


class ResponseStore:
    """Responses by id; safe to use from the request-preparing threads and the event loop."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response_id: str, body: bytes, messages: list[dict[str, Any]],
            message_bytes: int, items: tuple[dict[str, Any], ...] = (),
            run: BackgroundRun | None = None) -> None:  # fmt: skip
        """Store a response (`message_bytes`: its conversation's and its items' size, roughly),
        dropping the least recently used finished ones past the bounds; one larger than the
        whole bound is not kept."""
        entry = StoredResponse(body, messages, len(body) + message_bytes, items, run)
        with self._lock:
            self._drop(response_id)
            if entry.size > self.max_bytes and not entry.running:
                return
            self._entries[response_id] = entry
            self._bytes += entry.size
            self._bound()

    def update(self, response_id: str, body: bytes | None = None,
               messages: list[dict[str, Any]] | None = None, grow: int = 0) -> None:  # fmt: skip
        """A background response's entry as its run goes on: its JSON now, its conversation
        once it ends, `grow` more bytes (its events); nothing where it was deleted."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None:
                return
            new = replace(entry, body=entry.body if body is None else body,
                          messages=entry.messages if messages is None else messages,
                          size=entry.size + grow + len(body or entry.body) - len(entry.body))  # fmt: skip
            self._entries[response_id] = new
            self._bytes += new.size - entry.size
            if not new.running and new.size > self.max_bytes:
                self._drop(response_id)
            self._bound()

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response (now the most recently used); a 404 in OpenAI's shape if none."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
                return entry
        raise not_found(response_id, param)

    def delete(self, response_id: str) -> StoredResponse:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None and self._drop(response_id):
                return entry
        raise not_found(response_id, None)

    def _bound(self) -> None:
        """Drop the least recently used finished responses past the bounds."""
        while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
            victim = next((k for k, e in self._entries.items() if not e.running), None)
            if victim is None:  # only running ones: they stay until they end
                return
            self._drop(victim)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None


def not_found(response_id: str, param: str | None) -> APIError:
    what = "Previous response" if param == "previous_response_id" else "Response"
    return APIError(404, f"{what} with id '{shorten(response_id, 100)}' not found.", param=param,
                    code="previous_response_not_found" if param else "not_found")  # fmt: skip
