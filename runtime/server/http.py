"""HTTP plumbing that keeps hostile requests away from the handlers.

- `read_body`: 415 unless the body is JSON (so a web page cannot POST here cross-origin without
  a CORS preflight: text/plain and form encodings are refused) and uncompressed (a gzip or
  deflate `Content-Encoding` would otherwise read as invalid UTF-8), 413 over
  `--max-request-bytes`, read in chunks so a large upload never blocks the event loop; a
  declared over-size body is refused before a `100 Continue`, so the client never sends it.
- `ErrorGuard`: an ASGI middleware giving every request an id (`X-Request-Id`), and turning any
  unhandled exception into a well-formed JSON 500 that names the id, logged with it, without
  closing the keep-alive connection (Starlette's own handler re-raises, and uvicorn then drops
  the connection, so a pooled client's next request fails).
"""

from __future__ import annotations

import json
import logging
import re
import uuid

from pagoda.runtime.server.anthropic_protocol import error_shape
from pagoda.runtime.server.protocol import APIError, shorten
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("pagoda.server")
_JSON_TYPE = re.compile(r"^application/(?:[\w.+-]+\+)?json\s*(?:;|$)", re.IGNORECASE)
_REQUEST_ID = re.compile(r"^[\w.:-]{1,64}$")
DRAIN_FACTOR = 16  # an over-size body is read (and dropped) up to this many times the limit


async def read_body(raw: Request, limit: int) -> bytes:
    """The request body, or APIError 415 (not JSON, or compressed) / 413 (over `limit` bytes)."""
    ctype = raw.headers.get("content-type")
    if ctype is not None and not _JSON_TYPE.match(ctype):
        raise APIError(
            415, "request body must be JSON (Content-Type: application/json)",
            code="unsupported_media_type",
        )  # fmt: skip
    encoding = raw.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise APIError(
            415, f"request bodies with Content-Encoding: {shorten(encoding, 40)} are not "
            "supported; send uncompressed JSON", code="unsupported_media_type",
        )  # fmt: skip
    declared = raw.headers.get("content-length", "")
    too_big = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    try:
        if not too_big:
            async for chunk in raw.stream():
                size += len(chunk)
                if size > limit:
                    too_big = True
                    break
                chunks.append(chunk)
    except ClientDisconnect as e:
        raise APIError(400, "client disconnected while sending the body") from e
    if too_big:
        # A client waiting for `100 Continue` (curl, for bodies over 1 MiB) has not sent the
        # body: reading it would send the 100 and have it upload everything just to be refused.
        # It gets the 413 at once, and the connection closes (the unsent body cannot be skipped)
        waiting = raw.headers.get("expect", "").strip().lower() == "100-continue"
        if not waiting:
            await _drain(raw, limit * DRAIN_FACTOR)
        raise APIError(413, f"request body is larger than {limit} bytes", code="request_too_large",
                       headers={"Connection": "close"} if waiting else None)  # fmt: skip
    return b"".join(chunks)


async def _drain(raw: Request, budget: int) -> None:
    """Read and drop what the client still sends (up to `budget`), so it gets our 413 rather
    than a reset while it is still writing."""
    if getattr(raw, "_stream_consumed", True):
        return
    try:
        async for chunk in raw.stream():
            budget -= len(chunk)
            if budget < 0:
                return
    except Exception:  # the client went away: nothing to answer anyway
        return


class ErrorGuard:
    """Request ids and a last-resort JSON 500 for anything a handler did not expect."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or ()).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers") or ())
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            log.exception("request %s %s failed (request id %s)",
                          scope.get("method"), scope.get("path"), request_id)  # fmt: skip
            if started:
                raise  # the response is half sent: only closing the connection is honest
            await self._internal_error(send_with_id, request_id, exc, scope.get("path", ""))

    @staticmethod
    async def _internal_error(send: Send, request_id: str, exc: Exception, path: str) -> None:
        err = APIError(500, f"internal error ({type(exc).__name__}); request id {request_id}",
                       code="internal_error")  # fmt: skip
        body = json.dumps(error_shape(path, err)).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})
