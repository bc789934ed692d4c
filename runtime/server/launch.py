"""Start-up of `pagoda serve`: check everything checkable before binding, then run uvicorn.

Split from `cli.py` because this side imports torch and uvicorn; the parser must not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import uvicorn
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.model.loader import read_model_config
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.draining import DrainingServer
from pagoda.runtime.server.tuned import apply_tuned_profile
from pagoda.runtime.tuned_profile import TunedProfile


def preflight(
    cfg: ServerConfig,
    engine_kwargs: Mapping[str, Any],
    tuned_profile: str | None = None,
    tuned_profile_mismatch: str = "error",
) -> tuple[EngineConfig, TunedProfile | None]:
    """The one `EngineConfig` of this server, and the tuned profile applied to it (if any).

    ValueError (a ProfileError too) when the flags do not fit together, the profile, or the
    model: the model's metadata (not its weights) is read here, so an unknown `--model` or a
    flag combination its context length makes impossible fails before the HTTP server starts.
    """
    profile, kwargs = apply_tuned_profile(
        tuned_profile, model=cfg.model, engine_kwargs=engine_kwargs, mismatch=tuned_profile_mismatch
    )
    if kwargs.get("max_model_len") is None:
        kwargs["max_model_len"] = read_model_config(cfg.model).max_position_embeddings
    else:
        read_model_config(cfg.model)  # an unknown --model fails here, before the bind
    return EngineConfig.create(cfg.model, **kwargs), profile


def serve(cfg: ServerConfig, engine_cfg: EngineConfig, profile: TunedProfile | None = None) -> int:
    """Bind, load the model on the engine thread, serve until drained; the exit code.

    The engine factory warms up every kernel variant the configured shapes reach before the
    engine reports ready, so `/ready` turns 200 only when no JIT compile is left to pay.
    """
    from pagoda.runtime.engine.core import EngineCore
    from pagoda.runtime.engine.warmup import warm_up
    from pagoda.runtime.server.api import create_app
    from pagoda.runtime.server.metrics import ServerMetrics

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
