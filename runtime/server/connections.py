"""Slow and idle clients: read deadlines and a cap on open connections (docs/reliability.md).

uvicorn arms no timer on a new connection, so a client that connects and sends nothing, or
half a request line, or a body one byte a minute, holds a socket (a file descriptor) forever;
about twenty thousand of them exhaust the process's descriptors. uvicorn's `limit_concurrency`
answers 503 only once a request has arrived, which such a client never completes.

`guarded_protocol` returns uvicorn's h11 protocol with four rules:

- **headers**: the request line and headers must arrive within ``header_timeout`` seconds of the
  connection opening, or of the first byte of a later request on a keep-alive connection
  (between requests uvicorn's own keep-alive timeout closes an idle connection);
- **body**: the whole body must arrive within ``body_timeout`` seconds of the headers;
- **cap**: with ``max_connections`` open, a new connection closes the oldest one still waiting
  for its headers, else the oldest one still sending its body (a stalled client loses its
  place before a working one), if it has waited at least ``min(1 s, header_timeout / 2)`` (one
  younger has not had time to send: a burst of connections must not reset each other);
  otherwise it joins a **reserve** of ``probe_reserve`` connections that may only send a probe
  (``GET /health``, ``/ready`` or ``/metrics``: with every connection working on a request,
  the kubelet's liveness probe must not fail and restart a healthy pod, killing every stream,
  and Prometheus must still scrape the load the autoscaler reacts to). A reserve connection's
  request line decides: a probe is answered (with ``connection: close``), anything else gets
  the cap's 503. With the reserve full, its oldest connection still waiting for its request
  makes room by the same rule, else the new one is answered 503 and closed;
- **reading**: a response the client stops reading (the socket's buffers full, so writing is
  paused) is cut off once it has made no progress for ``send_timeout`` seconds (nginx's
  `send_timeout`): the connection is reset, so a stream's request is aborted and its KV
  blocks freed, and the connection and its unsent bytes no longer count against the cap.
  uvicorn has no such timer: a reader that stalls holds its socket, and what is left to send,
  forever.

Its request/response cycles write a streamed body's chunks without h11's state machine
(`chunked.py`).

A connection that breaks a deadline gets ``408 Request Timeout`` (if it had sent anything) and is
closed. Requests whose body has arrived are never timed out: generating a long answer is not a
slow client.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import struct
import termios
from typing import Any, ClassVar

import h11
from pagoda.runtime.options import HEALTH_PATH, METRICS_PATH, PROBE_RESERVE, READY_PATH
from pagoda.runtime.server.chunked import speed_up
from pagoda.runtime.server.protocol import retry_headers
from uvicorn.protocols.http.h11_impl import H11Protocol

_HEAD, _BODY, _BUSY = "head", "body", "busy"
# what a connection beyond the cap may ask (the module docstring): the request line's target
# without its query; GET only, as the kubelet and Prometheus send
PROBES = frozenset(path.encode() for path in (HEALTH_PATH, READY_PATH, METRICS_PATH))
MAX_REQUEST_LINE = 8192  # a reserve connection's request line must fit (h11 allows 16 KiB heads)


def _response(status: int, reason: str, message: str, code: str) -> bytes:
    kind = "server_error" if status >= 500 else "invalid_request_error"  # OpenAI's types
    body = json.dumps({"error": {"message": message, "type": kind,
                                 "param": None, "code": code}}).encode()  # fmt: skip
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n")  # fmt: skip
    if status == 503:  # spread like the queue's 503s: the refused burst does not return at once
        head += "".join(f"{k.lower()}: {v}\r\n" for k, v in retry_headers(1).items())
    return head.encode() + b"\r\n" + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and a connection cap (module docstring)."""

    max_connections = 1024
    probe_reserve = PROBE_RESERVE  # connections beyond the cap that may only send a probe
    reserved: ClassVar[set[GuardedH11Protocol]] = set()  # those open (one set per server's class)
    header_timeout = 10.0
    body_timeout = 30.0
    send_timeout = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _HEAD
        self._since = 0.0  # when the phase began (the eviction order of waiting connections)
        self._got_bytes = False  # in this phase
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False  # answered 503 at the cap: input is drained until closed
        self._stalled: asyncio.TimerHandle | None = None  # writing paused: the send deadline
        self._unsent = 0  # bytes waiting to be sent when the deadline was armed
        self._reserve = False  # beyond the cap: may only send a probe
        self._line: bytearray | None = None  # a reserve connection's bytes until its request line

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._enter(_HEAD, self.header_timeout)
        if len(self.connections) - len(self.reserved) <= self.max_connections:
            return  # the reserve's connections are not the cap's
        if self._evict_one(self.connections):
            return
        if len(self.reserved) < self.probe_reserve or self._evict_one(self.reserved):
            self._reserve, self._line = True, bytearray()
            self.reserved.add(self)
        else:
            self._refuse(self._over_the_cap())

    def _over_the_cap(self, why: str = "") -> bytes:
        return _response(503, "Service Unavailable",
                         f"too many open connections ({self.max_connections}); retry later{why}",
                         "too_many_connections")  # fmt: skip

    def _refuse(self, answer: bytes) -> None:
        """Answer and close the sending side, then drain what the client sends for up to a
        second before closing: closing a socket with its request unread resets it, and the
        client (already writing its request) then sees an error instead of the 503."""
        self._cancel()
        self._phase, self._refused = _BUSY, True
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(1.0, self.transport.close)

    def eof_received(self) -> bool | None:
        if self._refused:
            self.transport.close()
            return None
        return super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # drained, unread
        if self._line is not None and not (data := self._screen(data)):
            return
        if self._phase == _BUSY and self.conn.their_state is h11.IDLE:
            self._enter(_HEAD, self.header_timeout)  # the next request on a kept-alive connection
        self._got_bytes = True
        super().data_received(data)
        self._follow()

    def _screen(self, data: bytes) -> bytes:
        """A reserve connection's bytes until its request line: a probe's are passed on (with
        ``connection: close`` added, so that the connection closes once it is answered), then
        everything after them; anything else is answered 503 (and drained). b"" while the
        line is incomplete."""
        assert self._line is not None
        self._line += data
        self._got_bytes = True  # a 408 at the header deadline, as any half-sent request
        line, crlf, rest = bytes(self._line).lstrip(b"\r\n").partition(b"\r\n")
        if not crlf:
            if len(self._line) > MAX_REQUEST_LINE:
                self._refuse(self._over_the_cap())
            return b""
        self._line = None
        method, _, rest_of_line = line.partition(b" ")
        target = rest_of_line.partition(b" ")[0]
        if method != b"GET" or target.partition(b"?")[0] not in PROBES:
            self.reserved.discard(self)  # as any refused connection, drained for up to 1 s
            self._refuse(self._over_the_cap(
                "; beyond it only GET /health, /ready and /metrics are answered"))  # fmt: skip
            return b""
        return line + crlf + b"connection: close\r\n" + rest

    def handle_events(self) -> None:
        super().handle_events()
        speed_up(self.cycle)  # a new request's cycle: chunks written directly (chunked.py)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reserved.discard(self)
        self._cancel()
        self._unstall()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._arm_send()

    def _arm_send(self) -> None:
        self._unsent = self._unsent_bytes()
        self._stalled = self.loop.call_later(self.send_timeout, self._send_expired)

    def _unsent_bytes(self) -> int:
        """What the client has not received yet: the transport's buffer and the socket's send
        queue (TIOCOUTQ: the kernel takes more from the transport only once a third of its
        buffer, up to MiBs, is free, so a client reading steadily can leave the transport's
        part unchanged for seconds)."""
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        try:
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        except (AttributeError, OSError, ValueError):  # no socket, or not Linux
            return unsent
        return unsent + struct.unpack("i", queued)[0]

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _send_expired(self) -> None:
        """`send_timeout` s with writing paused: if the client read nothing meanwhile, reset
        the connection (`close` would wait for the unsent bytes to flush, which they never
        do); a client still reading (a large response, slowly) gets another period."""
        self._stalled = None
        if self._unsent_bytes() < self._unsent:
            self._arm_send()
        else:
            self.transport.abort()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    # -- deadlines ---------------------------------------------------------------------------
    def _follow(self) -> None:
        """Move to the phase h11's state says the request is in."""
        if self.transport is None or self.transport.is_closing():
            self._cancel()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._phase != _HEAD:  # between requests: uvicorn's keep-alive timer governs
                self._enter(_HEAD, None)
            elif self._deadline is None and self._got_bytes:
                self._arm(self.header_timeout)
        elif state is h11.SEND_BODY:
            if self._phase != _BODY:
                self._enter(_BODY, self.body_timeout)
        elif self._phase != _BUSY:
            self._enter(_BUSY, None)

    def _enter(self, phase: str, timeout: float | None) -> None:
        self._cancel()
        self._phase, self._since, self._got_bytes = phase, self.loop.time(), False
        if timeout is not None:
            self._arm(timeout)

    def _arm(self, timeout: float) -> None:
        self._deadline = self.loop.call_later(timeout, self._expire)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, evicted: bool = False) -> None:
        """Close at a missed deadline, or (`evicted`) to make room at the connection cap."""
        self._deadline = None
        if self._phase == _BUSY or self.transport.is_closing():
            return
        if self._phase == _HEAD and not self._got_bytes:
            self._close(None)  # nothing sent: nothing to answer
        elif self._phase == _BODY and self.cycle is not None and self.cycle.response_started:
            self._close(None)  # answered already (a 413 while the upload went on)
        else:
            what = "headers" if self._phase == _HEAD else "body"
            limit = self.header_timeout if self._phase == _HEAD else self.body_timeout
            why = (f"had not arrived when the server's {self.max_connections} connections were "
                   "all taken and this one had waited longest" if evicted
                   else f"did not arrive within {limit:g} s")  # fmt: skip
            self._close(_response(408, "Request Timeout", f"the request {what} {why}",
                                  "request_timeout"))  # fmt: skip

    def _close(self, answer: bytes | None) -> None:
        self._cancel()
        self._phase = _BUSY
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()

    # -- the cap -----------------------------------------------------------------------------
    def _evict_one(self, among: set[GuardedH11Protocol]) -> bool:
        """Close the connection of the cap (`among` its connections) or of the reserve (`among`
        the reserve) that has waited longest for its headers (not this one), else the one that
        has waited longest for its body: at the cap, stalled uploads must not turn every
        newcomer (the liveness probe included) into a 503."""
        # one that opened a moment ago has not had time to send: closing it would reset a
        # client that is about to (a burst of connections); the newcomer gets 503 instead
        settled = self.loop.time() - min(1.0, self.header_timeout / 2)
        reserve = among is self.reserved
        waiting = [c for c in among
                   if getattr(c, "_phase", _BUSY) != _BUSY and c._since <= settled
                   and c._reserve is reserve and c is not self]  # fmt: skip
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: (c._phase != _HEAD, c._since))  # headers first
        oldest._expire_now()
        return True

    def _expire_now(self) -> None:
        self._cancel()
        self._expire(evicted=True)
        self.connections.discard(self)  # counted out now; connection_lost follows
        self.reserved.discard(self)


def guarded_protocol(
    max_connections: int,
    header_timeout: float,
    body_timeout: float,
    send_timeout: float = GuardedH11Protocol.send_timeout,
    probe_reserve: int = GuardedH11Protocol.probe_reserve,
) -> type[GuardedH11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)` with these limits."""
    attrs = {"max_connections": max_connections, "header_timeout": header_timeout,
             "body_timeout": body_timeout, "send_timeout": send_timeout,
             "probe_reserve": probe_reserve, "reserved": set()}  # fmt: skip
    return type("PagodaHTTPProtocol", (GuardedH11Protocol,), attrs)
