"""The LoRA adapters the server serves by name (``--lora-modules``, and with
``PAGODA_ALLOW_RUNTIME_LORA_UPDATING=true`` those loaded at run time), as vLLM's:

- a request's `model` names the base model (a served name) or an adapter;
- ``GET /v1/models`` lists the adapters after the base model, each with ``parent`` = the base
  model's name and ``root`` = its directory;
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` reads and checks the adapter in the
  engine (a bad directory: 400 with the reason, the engine unharmed) and serves it;
  ``POST /v1/unload_lora_adapter {"lora_name"}`` stops serving it. Both exist only with the
  environment variable set (vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), else 404 as any
  unknown path.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request  # (at run time: FastAPI reads the routes' annotations)
from fastapi.responses import PlainTextResponse
from pagoda.runtime.lora_config import LoRAConfig, LoRARequest
from pagoda.runtime.options import LORA_RUNTIME_UPDATING_ENV
from pagoda.runtime.server.protocol import APIError

if TYPE_CHECKING:
    from pagoda.runtime.engine.async_engine import AsyncEngine


class ServedAdapters:
    """Adapter name → `LoRARequest` (ids 1..n for ``--lora-modules``, then increasing)."""

    def __init__(self, config: LoRAConfig | None, base_names: tuple[str, ...]) -> None:
        self.enabled = config is not None
        self.base_names = base_names
        self.by_name: dict[str, LoRARequest] = {}
        for m in () if config is None else config.lora_modules:
            self.by_name[m.lora_name] = m
        self._next_id = len(self.by_name) + 1
        self._lock = threading.Lock()  # prep threads read, the event loop writes

    def get(self, name: str | None) -> LoRARequest | None:
        return None if name is None else self.by_name.get(name)

    def new(self, name: str, path: str) -> LoRARequest:
        """A request for an adapter not served yet (APIError 400 for a taken name)."""
        if name in self.by_name or name in self.base_names:
            raise APIError(400, f"The lora adapter '{name}' has already been loaded.",
                           param="lora_name", code="invalid_request")  # fmt: skip
        with self._lock:
            lora, self._next_id = LoRARequest(name, self._next_id, path), self._next_id + 1
        return lora

    def cards(self, card) -> list[dict[str, Any]]:
        """/v1/models entries of the adapters (`card(name)` is a base model's entry)."""
        parent = self.base_names[0]
        return [card(name) | {"root": lr.lora_path, "parent": lr.base_model_name or parent}
                for name, lr in list(self.by_name.items())]  # fmt: skip


def runtime_updating() -> bool:
    return os.environ.get(LORA_RUNTIME_UPDATING_ENV, "").strip().lower() in ("true", "1")


def _engine_load(request: LoRARequest, core):
    # read off the engine loop's thread, answered once read (module level: it crosses to the
    # engine process)
    return core.load_lora(request)


def _engine_unload(lora_int_id: int, core) -> bool:
    return core.remove_lora(lora_int_id)


async def _body(raw: Request, keys: tuple[str, ...]) -> dict[str, str]:
    try:
        body = json.loads(await raw.body())
    except ValueError as e:
        raise APIError(400, f"request body is not JSON: {e}", code="invalid_request") from e
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_request")
    for key in keys:
        if not isinstance(body.get(key), str) or not body[key]:
            raise APIError(400, f"'{key}' must be a non-empty string", param=key,
                           code="invalid_request")  # fmt: skip
    return body


def add_lora_routes(app: FastAPI, adapters: ServedAdapters, engine: AsyncEngine, authorize) -> None:
    """The load/unload routes, only with the environment variable set (module docstring)."""
    if not runtime_updating():
        return

    def enabled() -> None:
        if not adapters.enabled:
            raise APIError(400, "LoRA adapters are not enabled on this server (--enable-lora)",
                           code="invalid_request")  # fmt: skip

    @app.post("/v1/load_lora_adapter")
    async def load(raw: Request) -> PlainTextResponse:
        authorize(raw)
        enabled()
        body = await _body(raw, ("lora_name", "lora_path"))
        lora = adapters.new(body["lora_name"], body["lora_path"])
        try:
            await engine.run_in_engine(functools.partial(_engine_load, lora))
        except ValueError as e:  # a bad adapter: nothing is served, the engine unharmed
            raise APIError(400, str(e), param="lora_path", code="invalid_request") from e
        adapters.by_name.setdefault(lora.lora_name, lora)
        return PlainTextResponse(f"Success: LoRA adapter '{lora.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(raw: Request) -> PlainTextResponse:
        authorize(raw)
        enabled()
        name = (await _body(raw, ("lora_name",)))["lora_name"]
        lora = adapters.by_name.pop(name, None)
        if lora is None:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.",
                           param="lora_name", code="model_not_found")  # fmt: skip
        await engine.run_in_engine(functools.partial(_engine_unload, lora.lora_int_id))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
