"""A tiny embedding model's engine and the real app in front of it (imported by the pooling
API tests; not a conftest): the engine core is built once per test file, and each `serve`
starts the engine on its thread and sends the calls over httpx's ASGI transport."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
from embed_testlib import make_embedding_model
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics

NAME = "tiny-embed"
Call = Callable[[openai.AsyncOpenAI, httpx.AsyncClient], Awaitable[Any]]


def embedding_core(path, **config_json) -> tuple[Any, EngineCore]:
    """A tiny random Qwen3 in Qwen3-Embedding's layout (LAST, normalized; `--runner auto`
    makes it a pooling engine) at `path`: (transformers' model, the engine core)."""
    model = make_embedding_model(path, "Qwen3", "LAST", **config_json)
    core = EngineCore(EngineConfig.create(str(path), dtype="float32", device="cpu",
                                          max_model_len=32, num_blocks_override=32,
                                          max_num_batched_tokens=16, max_num_seqs=8))  # fmt: skip
    return model, core


async def serve(core: EngineCore, calls: list[Call]) -> tuple[list[Any], ServerMetrics]:
    """Each call's result, in order (the `openai` SDK and raw httpx on the app's /v1)."""
    m = ServerMetrics(NAME)
    engine = AsyncEngine(lambda: core, observer=m)
    engine.start()
    await asyncio.wait_for(engine.wait_started(), 30)
    app = create_app(ServerConfig(model="m", served_model_names=(NAME,)), engine, m)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as http:
            client = openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=http,
                                        max_retries=0)  # fmt: skip
            return [await call(client, http) for call in calls], m
    finally:
        engine.stop()
