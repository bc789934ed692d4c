"""FastAPI app: OpenAI routes, health/readiness, Prometheus metrics, optional debug endpoints.

Client disconnects are watched explicitly (streaming and not): the moment the socket closes, the
request is aborted and its KV blocks go back to the pool, instead of generating to the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics
from pagoda.runtime.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)
from pagoda.runtime.server.serving import Job, OpenAIServing
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)


class EventStream(StreamingResponse):
    """SSE response that stops (and calls `on_close`) as soon as the client disconnects."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sender, watcher):
                t.cancel()
            results = await asyncio.gather(sender, watcher, return_exceptions=True)
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
        err = results[0]
        if isinstance(err, Exception) and not isinstance(err, OSError) and not watcher.done():
            raise err


async def until_disconnect(raw: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """Await `work` unless the client goes away first: (finished, result)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return False, None
    return True, task.result()


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(cfg: ServerConfig, engine: AsyncEngine, metrics: ServerMetrics) -> FastAPI:
    serving = OpenAIServing(engine, cfg.served_model_names)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="Pagoda", version="0.1.0", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.config = engine, metrics, cfg

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(APIError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}"))

    def authorize(raw: Request) -> None:
        if cfg.api_key is None:
            return
        scheme, _, token = raw.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            token.strip().encode(), cfg.api_key.encode()
        ):
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")

    async def run(raw: Request, job: Job) -> Response:
        serving.submit(job)
        if job.stream:
            return EventStream(serving.stream_response(job), on_close=lambda: serving.abort(job))
        try:
            finished, body = await until_disconnect(raw, serving.full_response(job))
        finally:
            serving.abort(job)  # no-op when finished; frees blocks at once otherwise
        if not finished:
            return Response(status_code=499)  # nobody is listening
        return JSONResponse(body)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        authorize(raw)
        req = parse_request(await raw.body(), CompletionRequest)
        return await run(raw, serving.prepare_completion(req))

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        authorize(raw)
        req = parse_request(await raw.body(), ChatCompletionRequest)
        return await run(raw, serving.prepare_chat(req))

    @app.get("/v1/models")
    async def models(raw: Request) -> dict[str, Any]:
        authorize(raw)
        core = engine.core
        data = [
            {
                "id": name,
                "object": "model",
                "created": started,
                "owned_by": "pagoda",
                "root": cfg.model,
                "max_model_len": core.max_model_len if core is not None else None,
            }
            for name in cfg.served_model_names
        ]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.dead:
            return JSONResponse({"status": "dead", "error": repr(engine.error)}, status_code=503)
        return JSONResponse({"status": "ok" if engine.ready else "loading"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if engine.dead:
            return JSONResponse({"status": "dead"}, status_code=503)
        if engine.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not engine.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if cfg.enable_debug_endpoints:

        @app.get("/debug/engine")
        async def debug_engine() -> dict[str, Any]:
            """Block-pool integrity and stats, checked on the engine thread between steps."""

            def probe(core: EngineCore) -> dict[str, Any]:
                core.check_integrity()
                return dataclasses.asdict(core.stats())

            try:
                stats = await engine.run_in_engine(probe)
            except Exception as e:
                raise APIError(500, f"integrity check failed: {e!r}", code="integrity") from e
            return {
                "integrity": "ok",
                "stats": stats,
                "in_flight": engine.num_in_flight,
                "queued": engine.num_queued,
            }

    return app
