"""What `pagoda serve`'s API process runs once the start-up checks pass: the engine (its own
process, or a thread), the FastAPI app, uvicorn until drained.

Torch-free, as the engine process's client and the app are: with the engine in its own process
(the default) the checks run there too (`EngineProcClient.preflight`), and this process holds
only their plain-data result, a `ServePlan`, so it never imports torch, Triton or the model
code (~1.8 s of CPU and its memory at every start; vLLM v1 keeps its API server light the same
way). `--no-engine-process` checks and loads in this process (`launch.serve`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.server.config import ServerConfig

log = logging.getLogger("pagoda.serve")


@dataclass(frozen=True)
class ServePlan:
    """What the API process needs of the checked configuration (`EngineConfig` and the tuned
    profile stay where torch is)."""

    max_num_seqs: int
    tuned_profile: tuple[str, str, str] | None = None  # device, model, created (for /metrics)


def prepare() -> None:
    """Import what `serve` will (uvicorn, FastAPI, the app, the engine's client side): called
    while the engine process imports torch and runs the start-up checks, so that the app is
    built and answers `/health` while the model loads."""
    import uvicorn  # noqa: F401
    from pagoda.runtime.engine import async_engine  # noqa: F401
    from pagoda.runtime.server import api, draining, metrics  # noqa: F401


def serve(
    cfg: ServerConfig,
    plan: ServePlan,
    factory: Callable[[], Any] | None,
    sockets: list[socket.socket] | None = None,
    engine_client: Any = None,
    on_engine: Callable[[Any], None] | None = None,
) -> int:
    """Serve on `sockets` (bound here from `cfg` when None) until drained; the exit code.
    `factory`: the core factory (None when `engine_client.preflight` has the engine process
    load what it checked); `engine_client`: the engine process, spawned by the caller;
    `on_engine`: told the `AsyncEngine` once built (before the model loads)."""
    import uvicorn
    from pagoda.runtime.engine.async_engine import AsyncEngine
    from pagoda.runtime.server.api import create_app
    from pagoda.runtime.server.connections import guarded_protocol
    from pagoda.runtime.server.draining import DrainingServer
    from pagoda.runtime.server.listen import bind_sockets, bound_port, start_listening
    from pagoda.runtime.server.metrics import ServerMetrics

    metrics = ServerMetrics(cfg.served_model_name)
    if plan.tuned_profile is not None:
        metrics.set_tuned_profile(*plan.tuned_profile)
    engine = AsyncEngine(
        factory,
        max_queue_len=cfg.max_queue_len,
        max_seqs_per_request=cfg.max_seqs_per_request,
        max_num_seqs=plan.max_num_seqs,
        observer=metrics,
        engine_process=cfg.engine_process,
        log_level=cfg.log_level,
        engine_client=engine_client,
    )
    if on_engine is not None:
        on_engine(engine)
    metrics.watch_admission(engine.admission)
    engine.preload()  # on the engine thread, the model loads while the app is built
    if sockets is None:
        sockets = bind_sockets(cfg.host, cfg.port)
        start_listening(sockets, cfg.host)
    app = create_app(cfg, engine, metrics)
    uv_cfg = uvicorn.Config(
        app,
        host=cfg.host,
        port=bound_port(sockets),
        http=guarded_protocol(
            cfg.max_connections, cfg.header_timeout, cfg.body_timeout, cfg.send_timeout
        ),
        log_level=cfg.log_level,
        access_log=cfg.log_level == "debug",
        timeout_graceful_shutdown=5,
    )
    log.info("listening on http://%s:%d (the model loads now)", cfg.host, bound_port(sockets))
    server = DrainingServer(uv_cfg, engine, cfg)
    server.run(sockets=sockets)
    return server.exit_code
