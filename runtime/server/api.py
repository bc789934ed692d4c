"""FastAPI app: OpenAI routes, health/readiness, Prometheus metrics, optional debug endpoints.

Client disconnects are watched explicitly (streaming and not): the moment the socket closes, the
request is aborted and its KV blocks go back to the pool, instead of generating to the end.
The app talks to the engine only through `AsyncEngine` (never its core).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.options import HEALTH_PATH, METRICS_PATH, READY_PATH
from pagoda.runtime.server.anthropic_messages import MessagesEndpoint, add_count_tokens_route
from pagoda.runtime.server.anthropic_protocol import MESSAGES_PATH, error_shape, messages_path
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.classify import ClassifyRoute
from pagoda.runtime.server.completions import CompletionEndpoint
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.embeddings import EmbeddingsRoute, refuse_generation, refuse_pooling
from pagoda.runtime.server.endpoint import Endpoint, Job
from pagoda.runtime.server.http import ErrorGuard, read_body
from pagoda.runtime.server.lora_adapters import ServedAdapters, add_lora_routes
from pagoda.runtime.server.metrics import ServerMetrics
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.responses import ResponsesEndpoint
from pagoda.runtime.server.responses_routes import add_response_routes
from pagoda.runtime.server.score import SCORE_PATHS
from pagoda.runtime.server.serving import Serving
from pagoda.runtime.server.structured_outputs import StructuredOutputs
from pagoda.runtime.server.tokenize import add_tokenizer_routes
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    """SSE response that stops (and calls `on_close`) as soon as the client disconnects."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
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


HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_response(e: APIError, path: str = "") -> JSONResponse:
    """`e` as JSON: OpenAI's body, or Anthropic's on the Messages API's paths."""
    return JSONResponse(error_shape(path, e), status_code=e.status, headers=e.headers)


def create_app(cfg: ServerConfig, engine: AsyncEngine, metrics: ServerMetrics) -> FastAPI:
    structured = StructuredOutputs(
        cfg.served_model_name,
        metrics.registry,
        cache_bytes=cfg.grammar_cache_bytes,
        timeout_s=cfg.grammar_compile_timeout,
        engine_here=not cfg.engine_process,
    )
    serving = Serving(engine, structured=structured)

    async def prepare_grammars() -> None:
        """Once ready, make the grammar compiler (xgrammar's import and a vocabulary scan,
        a few seconds) so that the first constrained request does not wait for it."""
        try:
            await engine.wait_started()
            await structured.compiler(engine.loaded_info())
        except Exception:  # the engine failed (reported elsewhere) or is shutting down
            return

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        warm = asyncio.ensure_future(prepare_grammars())
        try:
            yield
        finally:
            warm.cancel()
            await endpoints["/v1/responses"].runs.close()  # background responses: cancelled
            engine.stop()
            serving.close()

    app = FastAPI(title="Pagoda", version="0.1.0", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.config = engine, metrics, cfg
    app.add_middleware(ErrorGuard)

    @app.exception_handler(APIError)
    async def _api_error(raw: Request, e: APIError) -> JSONResponse:
        return error_response(e, raw.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(raw: Request, e: StarletteHTTPException) -> JSONResponse:
        """Starlette's own refusals (no such path, wrong method) in OpenAI's error shape."""
        message, code = str(e.detail), HTTP_ERROR_CODES.get(e.status_code)
        if code is not None:  # name what was asked for: "Not Found: POST /v1/nope"
            message = f"{message}: {raw.method} {raw.url.path}"
        err = APIError(e.status_code, message, code=code, headers=e.headers)
        return error_response(err, raw.url.path)

    endpoints = {
        "/v1/completions": CompletionEndpoint(
            cfg.served_model_names, engine.admission.max_seqs_per_request
        ),
        "/v1/chat/completions": ChatEndpoint(
            cfg.served_model_names,
            cfg.tool_call_parser,
            cfg.allow_chat_special_tokens,
            cfg.reasoning_parser,
        ),
        "/v1/responses": ResponsesEndpoint(
            cfg.served_model_names,
            cfg.tool_call_parser,
            cfg.allow_chat_special_tokens,
            cfg.reasoning_parser,
        ),
        MESSAGES_PATH: MessagesEndpoint(
            cfg.served_model_names,
            cfg.tool_call_parser,
            cfg.allow_chat_special_tokens,
            cfg.reasoning_parser,
        ),
    }
    adapters = ServedAdapters(cfg.lora, cfg.served_model_names)  # LoRA: `model` names them
    for e in endpoints.values():
        e.adapters = adapters
    add_openai_routes(app, cfg, serving, endpoints)
    add_response_routes(app, endpoints["/v1/responses"], authorizer(cfg))
    add_lora_routes(app, adapters, engine, authorizer(cfg))
    add_count_tokens_route(app, serving, endpoints[MESSAGES_PATH], authorizer(cfg),
                           cfg.max_request_bytes)  # fmt: skip
    resolve = endpoints["/v1/completions"].resolve_model
    paths = {"/v1/embeddings": EmbeddingsRoute, "/classify": ClassifyRoute} | SCORE_PATHS
    routes = {cls: cls(serving, resolve) for cls in set(paths.values())}  # (one id counter each)
    add_pooling_routes(app, cfg, {path: routes[cls] for path, cls in paths.items()})
    add_unserved_routes(app, authorizer(cfg))
    add_tokenizer_routes(app, serving, endpoints["/v1/chat/completions"], authorizer(cfg),
                         endpoints["/v1/completions"].resolve_model, cfg.max_request_bytes)  # fmt: skip
    add_probe_routes(app, engine, metrics)
    if cfg.enable_debug_endpoints:
        add_debug_routes(app, engine)
    install_request_schemas(app, endpoints)
    return app


def authorizer(cfg: ServerConfig) -> Callable[[Request], None]:
    """401 unless the request carries the API key (timing-safe comparison); no-op without one.
    The key is a bearer token, or Anthropic's `x-api-key` header on the Messages API's paths."""

    def authorize(raw: Request) -> None:
        if cfg.api_key is None:
            return
        scheme, _, token = raw.headers.get("authorization", "").partition(" ")
        given = raw.headers.get("x-api-key")
        if given is not None and messages_path(raw.url.path):
            scheme, token = "bearer", given
        bearer = scheme.lower() == "bearer" and bool(token.strip())  # a token was given
        if not bearer or not secrets.compare_digest(token.strip().encode(), cfg.api_key.encode()):
            # RFC 6750 §3: the scheme to use, and invalid_token when a bearer token was wrong
            challenge = 'Bearer error="invalid_token"' if bearer else "Bearer"
            raise APIError(401, "invalid or missing API key", code="invalid_api_key",
                           headers={"WWW-Authenticate": challenge})  # fmt: skip

    return authorize


def add_openai_routes(
    app: FastAPI, cfg: ServerConfig, serving: Serving, endpoints: dict[str, Endpoint]
) -> None:
    authorize, started = authorizer(cfg), int(time.time())

    async def run(raw: Request, job: Job) -> Response:
        serving.submit(job)
        detached = job.endpoint.detach(serving, job)  # a background response runs on its own
        if isinstance(detached, bytes):
            return Response(detached, media_type="application/json")
        if detached is not None:  # its events, followed: the client leaving ends only this
            return EventStream(detached, on_close=lambda: None)
        if job.stream:
            events = job.endpoint.stream(serving, job)
            return EventStream(events, on_close=lambda: serving.abort(job))
        try:
            finished, body = await until_disconnect(raw, serving.full_response(job))
        finally:
            serving.abort(job)  # no-op when finished; frees blocks at once otherwise
        if not finished:
            return Response(status_code=499)  # nobody is listening
        return Response(body, media_type="application/json")

    def route(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        api = API_NAMES[endpoint.request_model.__name__]

        async def handle(raw: Request) -> Response:
            authorize(raw)
            info = serving.engine.info
            if info is not None and info.runner == "pooling":
                raise refuse_generation(api)
            body = await read_body(raw, cfg.max_request_bytes)
            return await run(raw, await serving.prepare(endpoint, body))

        return handle

    for path, endpoint in endpoints.items():
        app.add_api_route(path, route(endpoint), methods=["POST"], name=path)

    def card(name: str) -> dict[str, Any]:
        info = serving.engine.info
        return {"id": name, "object": "model", "created": started, "owned_by": "pagoda",
                "root": cfg.model, "max_model_len": info.max_model_len if info else None}  # fmt: skip

    @app.get("/v1/models")
    async def models(raw: Request) -> dict[str, Any]:
        authorize(raw)
        data = [card(name) for name in cfg.served_model_names]
        return {"object": "list", "data": data + endpoints["/v1/completions"].adapters.cards(card)}

    @app.get("/v1/models/{name:path}")
    async def model(raw: Request, name: str) -> dict[str, Any]:
        """OpenAI's model retrieval (`client.models.retrieve`); 404 naming the model."""
        authorize(raw)
        found = endpoints["/v1/chat/completions"].resolve_model(name)
        adapters = endpoints["/v1/completions"].adapters
        lora = adapters.get(found)
        if lora is not None:
            return card(found) | {"root": lora.lora_path, "parent": adapters.base_names[0]}
        return card(found)


# the generation APIs by request model, as a pooling server names them refusing them
API_NAMES = {"CompletionRequest": "Completions", "ChatCompletionRequest": "Chat Completions",
             "ResponsesRequest": "Responses", "MessagesRequest": "Messages"}  # fmt: skip


def add_pooling_routes(app: FastAPI, cfg: ServerConfig, routes: dict[str, EmbeddingsRoute]) -> None:
    """The pooling server's APIs, a route per path: `POST /v1/embeddings` (`embeddings.py`),
    the score and rerank paths (`score.py`); a generating server's answer is the 400
    `unsupported_api` of the other unserved APIs."""
    authorize = authorizer(cfg)

    def handler(route: EmbeddingsRoute) -> Callable[[Request], Awaitable[Response]]:
        async def handle(raw: Request) -> Response:
            authorize(raw)
            body = await read_body(raw, cfg.max_request_bytes)
            info, req, prompts = await route.prepare(body)
            streams = route.submit(prompts)
            try:
                finished, outs = await until_disconnect(raw, route.collect(streams))
            finally:
                for s in streams:  # no-op when finished; frees blocks at once otherwise
                    route.serving.engine.abort(s.request_id)
            if not finished:
                return Response(status_code=499)  # nobody is listening
            return Response(route.body(req, info, outs), media_type="application/json")

        return handle

    for path, route in routes.items():
        app.add_api_route(path, handler(route), methods=["POST"], include_in_schema=False)


# OpenAI (and vLLM pooling) APIs that a generative server does not serve: the API's name, per path
# (/v1/embeddings, /v1/score, /v1/rerank, ...: `add_pooling_routes`, served by a pooling server)
UNSERVED_APIS = {
    "/pooling": "Pooling",
    "/v1/moderations": "Moderations",
    "/v1/audio/{rest:path}": "Audio",
    "/v1/images/{rest:path}": "Images",
}


def add_unserved_routes(app: FastAPI, authorize: Callable[[Request], None]) -> None:
    """A 400 naming the API (vLLM's answer to a generative model), not a bare 404."""

    def refuse(api: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(raw: Request) -> Response:
            authorize(raw)
            raise refuse_pooling(api)

        return handle

    for path, api in UNSERVED_APIS.items():
        app.add_api_route(path, refuse(api), methods=["POST"], include_in_schema=False)


def add_probe_routes(app: FastAPI, engine: AsyncEngine, metrics: ServerMetrics) -> None:
    """/health: the process works (200 while loading too); /ready: requests will be served."""

    @app.get(HEALTH_PATH)
    async def health() -> JSONResponse:
        if engine.dead:
            return JSONResponse({"status": "dead", "error": repr(engine.error)}, status_code=503)
        return JSONResponse({"status": "ok" if engine.ready else "loading"})

    @app.get(READY_PATH)
    async def ready() -> JSONResponse:
        if engine.dead:
            return JSONResponse({"status": "dead"}, status_code=503)
        if engine.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not engine.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get(METRICS_PATH)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def add_debug_routes(app: FastAPI, engine: AsyncEngine) -> None:
    @app.get("/debug/engine")
    async def debug_engine() -> dict[str, Any]:
        """Block-pool integrity and stats, checked on the engine thread between steps."""
        try:
            snapshot = await engine.check_integrity()
        except Exception as e:
            raise APIError(500, f"integrity check failed: {e!r}", code="integrity") from e
        return {"integrity": "ok", **snapshot}


def install_request_schemas(app: FastAPI, endpoints: dict[str, Endpoint]) -> None:
    """Describe each POST body in /openapi.json with its pydantic model.

    The routes read raw bytes (so that every parse failure is our own 400, not FastAPI's 422),
    which leaves FastAPI unaware of the models: add them to the generated document.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for path, endpoint in endpoints.items():
                model = endpoint.request_model
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
                ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                doc["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": ref}},
                }
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
