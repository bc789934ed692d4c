"""Start-up of `pagoda serve`: check everything checkable before binding, then run uvicorn.

Split from `cli.py` because this side imports torch and uvicorn; the parser must not.
"""

from __future__ import annotations

import dataclasses

import uvicorn
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.model.loader import read_model_config
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.draining import DrainingServer
from pagoda.runtime.tune.profile import TunedProfile


def preflight(cfg: ServerConfig) -> EngineConfig:
    """Validate the flags against each other and the model's config; ValueError on failure.

    Reads the model's metadata (not its weights), so an unknown `--model` or a flag combination
    the model makes impossible fails before the HTTP server starts.
    """
    engine_cfg = EngineConfig.create(cfg.model, **cfg.engine_args)
    model_cfg = read_model_config(cfg.model)
    sched = engine_cfg.scheduler
    # what EngineCore will do with the model's context length (re-runs the scheduler's checks)
    dataclasses.replace(
        sched, max_model_len=sched.max_model_len or model_cfg.max_position_embeddings
    )
    return engine_cfg


def serve(cfg: ServerConfig, engine_cfg: EngineConfig, profile: TunedProfile | None = None) -> int:
    """Bind, load the model on the engine thread, serve until drained; the exit code.

    The engine factory warms up every kernel variant the configured shapes reach before the
    engine reports ready, so `/ready` turns 200 only when no JIT compile is left to pay.
    """
    from pagoda.runtime.engine.core import EngineCore
    from pagoda.runtime.server.api import create_app
    from pagoda.runtime.server.metrics import ServerMetrics
    from pagoda.runtime.tune.warmup import warm_up

    metrics = ServerMetrics(cfg.served_model_name)
    if profile is not None:
        metrics.set_tuned_profile(profile.device, profile.model, profile.created)
    engine = AsyncEngine(
        lambda: warm_up(EngineCore(engine_cfg)), max_queue_len=cfg.max_queue_len, observer=metrics
    )
    app = create_app(cfg, engine, metrics)
    uv_cfg = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        access_log=cfg.log_level == "debug",
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(uv_cfg, engine, cfg)
    server.run()
    return server.exit_code
