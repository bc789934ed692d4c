"""What the HTTP layer guarantees under hostile requests (docs/reliability.md): 415 for non-JSON
bodies, 413 over --max-request-bytes, a responsive event loop while large bodies are refused,
request schemas in /openapi.json, and a JSON 500 that keeps the connection for the next request."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from pagoda.runtime.options import DEFAULT_MAX_REQUEST_BYTES
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics
from server_testlib import free_port

pytestmark = pytest.mark.e2e
COMP = "/v1/completions"


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.base, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"]
)
def test_cors_simple_content_types_are_415(http, ctype):
    """Browsers send these cross-origin without a preflight: refuse them before parsing."""
    r = http.post(
        COMP, content=b'{"prompt": "x", "max_tokens": 1}', headers={"Content-Type": ctype}
    )
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type"
    ok = http.post(COMP, content=b'{"prompt": "x", "max_tokens": 1}',
                   headers={"Content-Type": "application/json; charset=utf-8"})  # fmt: skip
    assert ok.status_code == 200, ok.text


def test_openapi_describes_request_bodies(http):
    doc = http.get("/openapi.json").json()
    for path, model in (("/v1/completions", "CompletionRequest"),
                        ("/v1/chat/completions", "ChatCompletionRequest"),
                        ("/v1/messages", "MessagesRequest")):  # fmt: skip
        body = doc["paths"][path]["post"]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}"
        schema = doc["components"]["schemas"][model]
        assert "max_tokens" in schema["properties"] and "temperature" in schema["properties"]
    assert "ChatMessage" in doc["components"]["schemas"]  # nested models resolve too


def test_an_oversize_body_awaiting_100_continue_is_refused_unsent(server):
    """curl sends `Expect: 100-continue` above 1 MiB: the 413 comes instead of the 100, so the
    50 MB is never uploaded, and the connection closes (the body it announced is not coming)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                     b"Content-Length: 52428800\r\n\r\n")  # fmt: skip
        data = b""
        while chunk := sock.recv(65536):  # until the server closes
            data += chunk
    assert data.startswith(b"HTTP/1.1 413 "), data[:200]
    assert b"request_too_large" in data and b"connection: close" in data.lower()


async def test_health_stays_fast_while_large_bodies_are_refused(server):
    """A 10 MB body (413), a 3 MB prompt (400 before tokenizing) and a 60 kB prompt (tokenized on
    a worker thread, then 400) never hold the event loop: /health answers within 100 ms."""
    big = json.dumps({"prompt": "lorem ipsum " * (10_000_000 // 12)}).encode()
    mid = json.dumps({"prompt": "lorem ipsum " * (3_000_000 // 12)}).encode()
    small = json.dumps({"prompt": "lorem ipsum dolor " * (60_000 // 18)}).encode()
    assert len(big) > DEFAULT_MAX_REQUEST_BYTES > len(mid)
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=server.base, timeout=120) as c, \
               httpx.AsyncClient(base_url=server.base, timeout=5) as probe:  # fmt: skip
        await probe.get("/health")  # connect first: measure answers, not TCP set-up
        sends = [asyncio.ensure_future(c.post(COMP, content=b, headers=headers))
                 for b in (big, mid, small, big)]  # fmt: skip
        latencies = []
        while not all(s.done() for s in sends) or len(latencies) < 10:
            t0 = time.perf_counter()
            assert (await probe.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.01)
        codes = [s.result().status_code for s in sends]
    assert codes == [413, 400, 400, 413], [s.result().text[:200] for s in sends]
    print(
        f"/health during large bodies: {len(latencies)} probes, max {max(latencies) * 1e3:.1f} ms"
    )
    assert max(latencies) < 0.1, sorted(latencies)[-5:]


async def test_health_stays_fast_while_bodies_of_many_objects_are_refused(server):
    """110,000 chat messages, or one message of 120,000 content parts, in under 4 MiB: each
    object validated into a model holds the GIL (and the collector walked every start-up
    object on top), so /health waited 1.0-1.4 s per body. Now more than `MAX_JSON_OBJECTS` is
    a 400 while parsing, and start-up objects are frozen."""
    from pagoda.runtime.server.request_body import MAX_JSON_OBJECTS

    msgs = json.dumps({"messages": [{"role": "user", "content": "hi"}] * 110_000}).encode()
    parts = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}] * 120_000}]}).encode()  # fmt: skip
    assert len(msgs) < DEFAULT_MAX_REQUEST_BYTES and len(parts) < DEFAULT_MAX_REQUEST_BYTES
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=server.base, timeout=120) as c, \
               httpx.AsyncClient(base_url=server.base, timeout=5) as probe:  # fmt: skip
        await probe.get("/health")
        sends = [asyncio.ensure_future(c.post("/v1/chat/completions", content=b,
                                              headers=headers)) for b in (msgs, parts, msgs)]  # fmt: skip
        latencies = []
        while not all(s.done() for s in sends) or len(latencies) < 10:
            t0 = time.perf_counter()
            assert (await probe.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.01)
        few = {"messages": [{"role": "user", "content": "hi"}] * 40, "max_tokens": 1}
        assert (await c.post("/v1/chat/completions", json=few)).status_code == 200
    for s in sends:
        r = s.result()
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "too_many_objects", err
        assert f"more than {MAX_JSON_OBJECTS} JSON objects" in err["message"]
    assert max(latencies) < 0.5, sorted(latencies)[-5:]  # was 1.0-1.4 s (load 8-10)


async def test_a_short_request_is_served_while_one_request_asks_for_thousands(server):
    """Fair sharing: sequences (prompts × n) count, one request may ask for at most half the
    queue, its sequences share the batch round-robin with a reserve for single requests, and
    large bodies are tokenized on their own thread. A 2-token request finishes within 2 s
    while a refused 8,192-sequence request, an admitted 256-sequence one and two 3.7 MB bodies
    of text prompts are handled."""
    refused = {"prompt": [[1, 2, 3, k] for k in range(512)], "n": 16, "max_tokens": 4}
    too_many = {"prompt": [[1, 2, 3, k] for k in range(20)], "n": 16, "max_tokens": 4}
    admitted = {"prompt": [[1, 2, 3, k] for k in range(16)], "n": 16, "max_tokens": 8,
                "ignore_eos": True}  # fmt: skip
    texts = json.dumps({"prompt": ["lorem ipsum dolor sit amet " * 540] * 256, "max_tokens": 1})
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=server.base, timeout=300) as c:

        async def short() -> float:
            t0 = time.perf_counter()
            r = await c.post(COMP, json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t0

        await short()  # warm
        big = [asyncio.ensure_future(c.post(COMP, json=admitted)),
               asyncio.ensure_future(c.post(COMP, json=refused)),
               asyncio.ensure_future(c.post(COMP, json=too_many)),
               *(asyncio.ensure_future(c.post(COMP, content=texts, headers=headers))
                 for _ in range(2))]  # fmt: skip
        await asyncio.sleep(0.5)
        times = []
        for _ in range(3):
            times.append(await short())
            assert not big[0].done(), "the admitted request finished first: nothing was shown"
        results = await asyncio.gather(*big)
    ok, refused_r, too_many_r, *text_rs = results
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 256, ok.text[:300]
    assert refused_r.status_code == 400 and "512 prompts" in refused_r.text, refused_r.text
    assert too_many_r.status_code == 400, too_many_r.text
    assert "20 prompt(s) × n=16 = 320 sequences" in too_many_r.json()["error"]["message"]
    assert all(r.status_code == 400 and "maximum context length" in r.text for r in text_rs)
    print(f"2-token requests beside them: {', '.join(f'{t:.2f} s' for t in times)}")
    assert max(times) < 2.0, times
    async with httpx.AsyncClient(base_url=server.base, timeout=30) as c:
        deadline = time.monotonic() + 30
        while (d := (await c.get("/debug/engine")).json())["in_flight"] or d["queued"]:
            assert time.monotonic() < deadline, d
            await asyncio.sleep(0.1)
        assert d["integrity"] == "ok"


@pytest.fixture
def failing_server():
    """The real app and ErrorGuard on uvicorn, plus one route that raises (nothing else does)."""
    from pagoda.runtime.engine.async_engine import AsyncEngine
    from test_async_engine import FakeCore  # a model-free engine core

    metrics = ServerMetrics("fake")
    app = create_app(ServerConfig(model="fake"), AsyncEngine(FakeCore, observer=metrics), metrics)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("unexpected")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)


def _exchange(sock: socket.socket, path: str) -> tuple[int, dict[str, str], bytes]:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, rest


def test_unexpected_error_is_json_500_logged_with_id_and_keeps_the_connection(
    failing_server, caplog
):
    caplog.set_level(logging.ERROR, logger="pagoda.server")
    with socket.create_connection(("127.0.0.1", failing_server), timeout=10) as sock:
        status, headers, body = _exchange(sock, "/boom")
        assert status == 500 and headers.get("connection") != "close"
        err = json.loads(body)["error"]
        request_id = headers["x-request-id"]
        assert err["type"] == "server_error" and request_id in err["message"]
        assert "unexpected" not in err["message"]  # no internals leak to the client
        status, headers, body = _exchange(sock, "/health")  # same connection
        assert status == 200 and json.loads(body)["status"] in ("ok", "loading")
    assert any(request_id in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        ("CompletionRequest", {"prompt": "Hi", "Max_tokens": 3}, "Max_tokens"),
        ("CompletionRequest", {"prompt": "Hi", "str": 1}, "str"),
        ("CompletionRequest", {"prompt": "Hi", "a[0]": 1}, "a[0]"),
        ("ChatCompletionRequest",
         {"messages": [{"role": "user", "content": "a", "Name": "x"}]}, "messages[0].Name"),
    ],
)  # fmt: skip
def test_an_unknown_field_is_named_whatever_its_spelling(model, body, field):
    """An unknown key starting with a capital (or named like a type) was reported as 'None'."""
    from pagoda.runtime.server import protocol
    from pagoda.runtime.server.request_body import parse_request

    raw = json.dumps({"model": "m", **body}).encode()
    with pytest.raises(protocol.APIError) as err:
        parse_request(raw, getattr(protocol, model))
    assert err.value.param == field and f"'{field}'" in str(err.value.message), err.value.message
