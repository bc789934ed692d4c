"""Slow and idle clients (docs/reliability.md): a connection that never completes its headers
or its body is closed within --header-timeout / --body-timeout, and --max-connections caps the
open sockets, while /health keeps answering. The real app and protocol on uvicorn, with a
model-free engine core and short timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import h11
import pytest
import uvicorn
from fastapi.responses import StreamingResponse
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.server import chunked
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.connections import guarded_protocol
from pagoda.runtime.server.listen import bind_sockets, bound_port, start_listening
from pagoda.runtime.server.metrics import ServerMetrics
from test_async_engine import FakeCore

HEADER_TIMEOUT = 0.6
BODY_TIMEOUT = 0.8
SEND_TIMEOUT = 0.8
CAP = 6
RESERVE = 2  # connections beyond the cap that may only send a probe
GRACE = min(1.0, HEADER_TIMEOUT / 2)  # connections younger than this are not evicted
SLACK = 1.5  # the deadline plus this much, on a busy 2-core machine


@pytest.fixture
def server(request):
    header_timeout = getattr(request, "param", {}).get("header_timeout", HEADER_TIMEOUT)
    metrics = ServerMetrics("fake")
    engine = AsyncEngine(FakeCore, observer=metrics)
    app = create_app(ServerConfig(model="fake"), engine, metrics)
    release = threading.Event()

    @app.get("/block")
    async def block() -> dict:  # holds the event loop: connections queue up meanwhile
        time.sleep(0.4)
        return {}

    @app.get("/flood")
    async def flood() -> StreamingResponse:  # a stream that never ends, as fast as it is read
        async def chunks():
            try:
                while True:
                    yield b"x" * 65536
                    await asyncio.sleep(0)
            finally:
                release.flood_closed = time.monotonic()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/hold")
    async def hold() -> dict:  # a request that is being worked on, not a slow client
        while not release.is_set():
            await asyncio.sleep(0.02)
        return {}

    sockets = bind_sockets("127.0.0.1", 0)
    start_listening(sockets, "127.0.0.1")
    config = uvicorn.Config(
        app,
        http=guarded_protocol(CAP, header_timeout, BODY_TIMEOUT, SEND_TIMEOUT, RESERVE),
        log_level="warning",
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    srv.release, srv.engine = release, engine
    srv.port = bound_port(sockets)
    yield srv
    srv.should_exit = True
    thread.join(10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_until_closed(sock: socket.socket, t0: float | None = None) -> tuple[bytes, float]:
    """Everything the server sends until it closes; (bytes, seconds since `t0`, or since now)."""
    t0, data = time.monotonic() if t0 is None else t0, b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - t0


def health(port: int) -> tuple[int, float]:
    t0 = time.monotonic()
    with connect(port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data, _ = read_until_closed(s)
    return int(data.split()[1]), time.monotonic() - t0


def ask(port: int, request: bytes) -> bytes:
    """Send `request` on a new connection; everything the server sends until it closes."""
    with connect(port) as s:
        s.sendall(request)
        return read_until_closed(s)[0]


def hold_every_connection(port: int) -> list[socket.socket]:
    """CAP connections whose requests are being worked on (/hold): none can be evicted."""
    busy = []
    for _ in range(CAP):
        s = connect(port)
        s.sendall(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
        busy.append(s)
    time.sleep(0.3)
    return busy


def assert_refused_at_the_cap(data: bytes) -> None:
    assert data.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in data, data
    assert b"retry-after: 1\r\n" in data.lower()
    ms = int(data.lower().split(b"retry-after-ms: ", 1)[1].split(b"\r\n", 1)[0])
    assert 500 <= ms <= 1500  # spread, as the queue's 503s: no lockstep retries
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "server_error"


def release_held(server, busy: list[socket.socket]) -> None:
    """The held requests finish normally: the cap never closed a working connection."""
    server.release.set()
    for s in busy:
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        s.close()


def in_thread(fn, *args):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


def test_stalled_clients_are_closed_within_the_timeouts_while_health_stays_fast(server):
    port = server.port
    sent = time.monotonic()  # the server's deadlines start after this
    silent = connect(port)
    half_headers = connect(port)
    half_headers.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Ty")
    stalled_body = connect(port)
    stalled_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         b'{"prompt": "')  # fmt: skip
    dripping = connect(port)  # a byte at a time, never quite stalling: the deadline is total
    dripping.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
    waits = {name: in_thread(read_until_closed, s, sent) for name, s in
             (("silent", silent), ("half_headers", half_headers),
              ("stalled_body", stalled_body), ("dripping", dripping))}  # fmt: skip
    probes = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < BODY_TIMEOUT + SLACK:
        with contextlib.suppress(OSError):  # closed: as it should be
            dripping.sendall(b" ")
        probes.append(health(port))
        time.sleep(0.05)
    results = {}
    for name, (thread, out) in waits.items():
        thread.join(5)
        results[name] = out[0]
    data, took = results["silent"]
    assert data == b"" and HEADER_TIMEOUT <= took <= HEADER_TIMEOUT + SLACK, took
    for name, limit in (("half_headers", HEADER_TIMEOUT), ("stalled_body", BODY_TIMEOUT),
                        ("dripping", BODY_TIMEOUT)):  # fmt: skip
        data, took = results[name]
        assert data.startswith(b"HTTP/1.1 408 "), (name, data)
        assert b"request_timeout" in data and limit <= took <= limit + SLACK, (name, took)
    assert all(code == 200 for code, _ in probes)
    print(f"/health while 4 connections stalled: {len(probes)} probes, "
          f"max {max(t for _, t in probes) * 1e3:.1f} ms")  # fmt: skip
    assert max(t for _, t in probes) < 1.0  # never blocked behind a stalled client


def test_a_client_that_stops_reading_is_reset_after_the_send_timeout(server):
    """Its socket full, the response's writes pause: after --send-timeout without progress
    the connection is reset and the response's generator closed (a stream's request is then
    aborted), instead of both being held forever."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.settimeout(10)
    sock.sendall(b"GET /flood HTTP/1.1\r\nHost: t\r\n\r\n")
    t0, closed = time.monotonic(), None
    while closed is None and time.monotonic() - t0 < 10 * SEND_TIMEOUT + SLACK:
        time.sleep(0.05)
        closed = getattr(server.release, "flood_closed", None)
    assert closed is not None, "the stalled response was never cut off"
    assert closed - t0 >= SEND_TIMEOUT, closed - t0
    assert health(server.port)[0] == 200
    data, _ = read_until_closed(sock)  # what the kernel had buffered, then the end
    assert data.startswith(b"HTTP/1.1 200 ")
    sock.close()


def test_a_kept_alive_connection_gets_the_header_deadline_for_its_next_request(server):
    with connect(server.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # the headers, then the JSON body
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        s.sendall(b"GET /health HTTP/1.1\r\nHo")  # and then nothing
        data, took = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 408 ") and took <= HEADER_TIMEOUT + SLACK, (data, took)


def test_connection_cap_closes_the_oldest_waiting_then_refuses_with_503(server):
    port = server.port
    idle = [connect(port) for _ in range(CAP)]
    time.sleep(GRACE + 0.1)
    code, _ = health(port)  # over the cap: the oldest idle connection makes room
    assert code == 200
    idle[0].settimeout(5)
    assert read_until_closed(idle[0])[0] == b""
    for s in idle:
        s.close()
    time.sleep(0.2)
    busy = hold_every_connection(port)  # requests being worked on are never closed for one
    assert_refused_at_the_cap(ask(port, b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"))
    release_held(server, busy)


def test_probes_are_answered_at_the_cap_and_anything_else_gets_503(server):
    """With every connection working on a request, the kubelet's probes (and Prometheus's
    scrape) are answered from the reserve beyond the cap, so a pod busy with legitimate
    streams is not restarted; any other request there gets the cap's 503."""
    port = server.port
    busy = hold_every_connection(port)
    probe = b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n"  # kept alive, as far as the client asks
    for path in (b"/health", b"/ready", b"/metrics", b"/ready?verbose=1"):
        data = ask(port, probe % path)  # the server closes it once answered
        assert data.startswith(b"HTTP/1.1 200 "), (path, data)
        assert b"\r\nconnection: close\r\n" in data.lower(), data
    body = json.dumps({"model": "fake", "prompt": [1, 2], "max_tokens": 2}).encode()
    for request in (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
        b"POST /health HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",  # GET only
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
    ):
        data = ask(port, request)
        assert_refused_at_the_cap(data)
        assert b"only GET /health, /ready and /metrics" in data, data
    refused = []  # refused, left open (drained for a second): they leave the reserve at once
    for _ in range(RESERVE):
        refused.append(connect(port))
        refused[-1].sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(0.1)
    assert health(port)[0] == 200
    for s in refused:
        assert s.recv(65536).startswith(b"HTTP/1.1 503 ")
        s.close()
    server.engine.draining = True  # as `drain` sets it: /ready says so at the cap too
    data = ask(port, probe % b"/ready")
    assert data.startswith(b"HTTP/1.1 503 ") and b'"draining"' in data, data
    assert ask(port, probe % b"/health").startswith(b"HTTP/1.1 200 ")
    release_held(server, busy)


@pytest.mark.parametrize("server", [{"header_timeout": 3.0}], indirect=True)  # a 1 s grace
def test_the_probe_reserve_is_bounded(server):
    """RESERVE probes still sending their heads fill the reserve: one more is refused (they
    are too young to close); once they have waited past the grace period the oldest makes
    room for a new probe, as at the cap."""
    port = server.port
    busy = hold_every_connection(port)
    held = []
    for _ in range(RESERVE):
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n")  # the blank line comes later
        held.append(s)
    assert_refused_at_the_cap(ask(port, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"))
    time.sleep(1.1)
    assert health(port)[0] == 200
    held[0].settimeout(5)
    data, _ = read_until_closed(held[0])  # the oldest made room, with a 408
    assert data.startswith(b"HTTP/1.1 408 ") and b"connections were all taken" in data, data
    for s in held[1:]:
        s.sendall(b"\r\n")
        s.settimeout(5)
        assert read_until_closed(s)[0].startswith(b"HTTP/1.1 200 ")
        s.close()
    held[0].close()
    release_held(server, busy)


def test_the_open_file_limit_is_raised_for_the_connection_cap_or_refused():
    resource = pytest.importorskip("resource")
    from pagoda.runtime.server.listen import FD_MARGIN, ensure_fd_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 4 * FD_MARGIN:
        pytest.skip(f"hard open-file limit {hard}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_MARGIN + 100, hard))
        assert ensure_fd_limit(100) == 100
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 2 * 100 + FD_MARGIN  # raised
        with pytest.raises(ValueError, match=f"--max-connections {hard} needs at least"):
            ensure_fd_limit(hard)  # cannot fit under the hard limit
        assert ensure_fd_limit(hard, adjustable=True) == hard - FD_MARGIN  # the default shrinks
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_stalled_uploads_at_the_cap_lose_their_place_so_health_stays_200(server):
    """A client filling every slot with uploads it never finishes is a slow client too: a new
    connection (the liveness probe) closes the longest-waiting upload instead of getting 503,
    which would make /health fail while the engine is fine."""
    port = server.port
    uploads = []
    for _ in range(CAP):
        s = connect(port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")  # fmt: skip
        uploads.append(s)
        time.sleep(0.02)
    time.sleep(GRACE + 0.1)
    code, took = health(port)
    assert code == 200 and took < 1.0, (code, took)
    uploads[0].settimeout(5)
    data, _ = read_until_closed(uploads[0])  # the oldest upload made room, with a 408
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert b"connections were all taken" in data, data  # why, not a deadline it did not miss
    for s in uploads:
        s.close()


def test_a_client_refused_at_the_cap_reads_its_503_even_after_sending_its_request(server):
    """Real clients send the request as soon as they connect: the refusal must still arrive as
    a 503 (the server drains what it is sent), not as a connection reset."""
    port = server.port
    busy = []
    for _ in range(CAP - 1):
        s = connect(port)
        s.sendall(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
        busy.append(s)
    time.sleep(0.3)
    blocker = connect(port)  # the last slot; the next connections are over the cap
    blocker.sendall(b"GET /block HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(0.1)  # the loop is blocked: the newcomers' requests arrive before it refuses them
    refused = []
    for _ in range(5):
        s = connect(port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 20000\r\n"
                  b"Content-Type: application/json\r\n\r\n" + b" " * 20000)  # fmt: skip
        refused.append(s)
    answers = []
    for s in refused:
        try:
            answers.append(read_until_closed(s)[0][:12])
        except OSError as e:
            answers.append(repr(e).encode())
        s.close()
    blocker.close()
    server.release.set()
    for s in busy:
        s.close()
    assert answers == [b"HTTP/1.1 503"] * 5, answers


def test_a_burst_of_new_connections_at_the_cap_does_not_close_each_other(server):
    """Connections that opened a moment ago have not had time to send: a newcomer at the cap
    gets 503 + Retry-After rather than closing one of them (which its client would see as a
    reset), a probe is answered from the reserve beyond the cap; once they have waited past
    the grace period they make room as stalled clients."""
    port = server.port
    fresh = [connect(port) for _ in range(CAP)]
    assert_refused_at_the_cap(ask(port, b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert health(port)[0] == 200
    fresh[0].sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert read_until_closed(fresh[0])[0].startswith(b"HTTP/1.1 200 ")
    time.sleep(GRACE + 0.2)
    assert health(port)[0] == 200  # the oldest still silent one is a slow client by now
    for s in fresh:
        s.close()


def _stream(port: int, version: str) -> tuple[bytes | None, bytes]:
    """A streamed completion over a raw socket (HTTP/`version`): (its Transfer-Encoding, its
    body) as h11 reads them."""
    body = json.dumps({"model": "fake", "prompt": [1, 2], "max_tokens": 5, "stream": True})
    head = (f"POST /v1/completions HTTP/{version}\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    with connect(port) as s:
        s.sendall((head + body).encode())
        raw, _ = read_until_closed(s)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/v1/completions",
                            headers=[("Host", "t"), ("Content-Length", str(len(body)))]))  # fmt: skip
    client.send(h11.Data(data=body.encode()))
    client.send(h11.EndOfMessage())
    client.receive_data(raw)
    client.receive_data(b"")
    data = []
    while (event := client.next_event()) not in (h11.PAUSED, h11.NEED_DATA):
        if isinstance(event, h11.Response):
            framing = dict(event.headers).get(b"transfer-encoding")
        elif isinstance(event, h11.Data):
            data.append(bytes(event.data))
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            break
    return framing, b"".join(data)


def test_streamed_chunks_are_framed_without_h11s_state_machine(server, monkeypatch):
    """Issue 40: a stream's SSE events are written as chunks by `chunked.ChunkedBodyCycle`
    (h11's `Connection.send(Data)` took ~6 us an event); an HTTP/1.1 client reads the same
    chunked body, an HTTP/1.0 client still gets h11's close-delimited one."""
    data_events = []
    send = h11.Connection.send

    def counting(self, event):
        if self.our_role is h11.SERVER and isinstance(event, h11.Data) and event.data:
            data_events.append(event)
        return send(self, event)

    monkeypatch.setattr(h11.Connection, "send", counting)
    deadline = time.monotonic() + 10  # the test before fills the connection cap: wait for room
    while health(server.port)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    for version, framing, via_h11 in (("1.1", b"chunked", False), ("1.0", None, True)):
        data_events.clear()
        got, body = _stream(server.port, version)
        events = [e for e in body.split(b"\n\n") if e]
        assert got == framing and events[-1] == b"data: [DONE]"
        texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]]
        assert "".join(texts) == "xxxxx"
        assert bool(data_events) == via_h11
    # an h11 release without the private writer: uvicorn's own send, the same body
    monkeypatch.setattr(chunked, "ChunkedWriter", None)
    data_events.clear()
    got, body = _stream(server.port, "1.1")
    assert got == b"chunked" and data_events and body.endswith(b"data: [DONE]\n\n")
