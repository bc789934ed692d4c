"""CPU per SSE event on the server's send path, side by side in one process: uvicorn's h11
request/response cycle (`h11.Connection.send(Data)` per event) against `ChunkedBodyCycle`
(runtime/server/chunked.py: the chunk's framing written directly), and the event's encoding
(`serving.sse`). A transport that discards what it is given, so only the Python is timed.

    .venv/bin/python -P benchmarks/sse_send.py
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import h11
from pagoda.runtime.server.chunked import ChunkedBodyCycle
from pagoda.runtime.server.serving import sse
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import RequestResponseCycle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine

HEAD = {"id": "cmpl-" + "0" * 32, "object": "text_completion", "created": 1733450000,
        "model": "bench"}  # fmt: skip
EVENT = {**HEAD, "choices": [{"index": 0, "text": " hello", "logprobs": None,
                              "finish_reason": None}]}  # fmt: skip


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle(cls: type) -> RequestResponseCycle:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    conn.next_event(), conn.next_event()  # the request and its end
    tr = _Transport()
    scope = {"method": "POST", "headers": [], "http_version": "1.1", "path": "/"}
    log = logging.getLogger("sse_send")
    return cls(scope=scope, conn=conn, transport=tr, flow=FlowControl(tr), logger=log,
               access_logger=log, access_log=False, default_headers=[],
               message_event=asyncio.Event(), on_response=lambda: None)  # fmt: skip


async def per_event_us(cls: type, n: int) -> float:
    c = _cycle(cls)
    await c.send({"type": "http.response.start", "status": 200, "headers": []})
    msg = {"type": "http.response.body", "body": sse(EVENT), "more_body": True}
    t = time.process_time()
    for _ in range(n):
        await c.send(msg)
    return (time.process_time() - t) / n * 1e6


async def main(n: int = 20000, rounds: int = 3) -> None:
    print(f"machine: {machine()}")
    for _ in range(rounds):
        old = await per_event_us(RequestResponseCycle, n)
        new = await per_event_us(ChunkedBodyCycle, n)
        t = time.process_time()
        for _ in range(n):
            sse(EVENT)
        enc = (time.process_time() - t) / n * 1e6
        print(f"µs CPU per event: send, uvicorn's cycle {old:.2f} / ChunkedBodyCycle {new:.2f}; "
              f"encode (sse) {enc:.2f}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
