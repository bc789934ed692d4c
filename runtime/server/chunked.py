"""A streamed response's body chunks written without h11's state machine (uvicorn's h11 protocol).

Why: each SSE event of a stream is one ASGI `http.response.body` message, and uvicorn's h11
protocol passes every one through `h11.Connection.send(Data)`: event checks, the state
machine's transitions and a writer that frames the chunk, ~6 us of Python per event on a busy
2-core Xeon and about half of the ASGI send path's cost per streamed token (cProfile of the API
process under 32 streaming clients, docs/benchmarks.md). In the middle of a chunked body h11
changes no state and only frames the bytes (`ChunkedWriter.send_data`: the length in hex, CRLF,
the data, CRLF; nothing for empty data), so `ChunkedBodyCycle` writes that framing itself. The
response's start, its last message, HEAD requests, other framings (a Content-Length, an
HTTP/1.0 client's close-delimited body) and a paused transport go through uvicorn and h11 as
before, as does every cycle where an h11 or uvicorn release has renamed what this reads. uvicorn's httptools protocol writes chunks the same way; httptools is not a dependency.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import RequestResponseCycle

try:  # h11's private writer: if a release renames it, every cycle keeps uvicorn's own send
    from h11._writers import ChunkedWriter
except ImportError:  # pragma: no cover - depends on the installed h11
    ChunkedWriter = None

# what the fast path reads of uvicorn's cycle; a cycle lacking any keeps uvicorn's own send
_CYCLE_ATTRS = ("response_started", "response_complete", "disconnected", "flow", "conn",
                "transport", "scope")  # fmt: skip


class ChunkedBodyCycle(RequestResponseCycle):
    """uvicorn's request/response cycle with the body fast path (module docstring)."""

    async def send(self, message):  # type: ignore[no-untyped-def]  # uvicorn's signature
        if (
            message["type"] == "http.response.body"
            and message.get("more_body", False)
            and self.response_started
            and not self.response_complete
            and not self.disconnected
            and not self.flow.write_paused
            and type(getattr(self.conn, "_writer", None)) is ChunkedWriter  # h11's framing
            and self.scope["method"] != "HEAD"
        ):
            body = message.get("body", b"")
            if body:
                self.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
            return
        await super().send(message)


def speed_up(cycle: object) -> None:
    """Give a cycle uvicorn has just made (its task not started yet) the fast path."""
    if (
        ChunkedWriter is not None
        and type(cycle) is RequestResponseCycle
        and all(hasattr(cycle, a) for a in _CYCLE_ATTRS)
    ):
        cycle.__class__ = ChunkedBodyCycle
