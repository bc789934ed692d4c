"""`pagoda serve`: flags (named like vLLM's where they mean the same) → ServerConfig → uvicorn.

SIGTERM/SIGINT start a drain instead of uvicorn's immediate stop: /ready turns 503, new
requests get 503, in-flight requests run for up to --drain-timeout seconds, then the process
exits 0. A second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from types import FrameType

# Before torch loads libgomp: OpenMP threads that spin at barriers while another process holds
# a core make a CPU step 10-20x slower on shared or CPU-limited nodes (measured on 2 busy cores:
# 2.3 s vs 0.1 s a step at batch 32); passive waiting costs little when the cores are free.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import uvicorn
from pagoda.runtime.config import DEFAULT_MODEL, EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.server.config import ServerConfig, parse_size

log = logging.getLogger("pagoda.serve")
DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp32": "float32"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--model", default=DEFAULT_MODEL, help="built-in name, GGUF file or HF directory")
    a("--served-model-name", nargs="+", default=None, help="name(s) clients use (default: --model)")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", *DTYPE_ALIASES])
    a("--device", default="auto", help="auto, cpu or cuda[:N]")
    a("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    a("--seed", type=int, default=0, help="engine seed (per-request `seed` overrides)")
    a("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    a("--max-num-seqs", type=int, default=None, help="requests in one batch")
    a("--max-num-batched-tokens", type=int, default=None, help="token budget of one step")
    a("--block-size", type=int, default=None, help="KV-cache block size in tokens")
    bool_flag = argparse.BooleanOptionalAction
    a("--enable-prefix-caching", action=bool_flag, default=None)
    a("--enable-chunked-prefill", action=bool_flag, default=None)
    a("--kv-cache-memory", default=None, help="KV-cache budget, e.g. 512MiB or 2G")
    a("--max-queue-len", type=int, default=512, help="waiting requests before 503 + Retry-After")
    a("--api-key", default=os.environ.get("PAGODA_API_KEY"), help="or env PAGODA_API_KEY")
    a("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM")
    a("--enable-debug-endpoints", action="store_true", help="GET /debug/engine (tests only)")
    a("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def engine_args(args: argparse.Namespace) -> dict[str, object]:
    """Only the flags the user set: everything else keeps the engine's own defaults."""
    out: dict[str, object] = {
        "dtype": DTYPE_ALIASES.get(args.dtype, args.dtype),
        "device": args.device,
        "attention_backend": args.attention_backend,
        "seed": args.seed,
    }
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(args, name) is not None:
            out[name] = getattr(args, name)
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        if getattr(args, name) is not None:
            out[name] = getattr(args, name)
    if args.kv_cache_memory is not None:
        out["kv_cache_memory"] = parse_size(args.kv_cache_memory)
    return out


def run(args: argparse.Namespace) -> int:
    from pagoda.runtime.engine.core import EngineCore
    from pagoda.runtime.server.api import create_app
    from pagoda.runtime.server.metrics import ServerMetrics

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = ServerConfig(
            model=args.model,
            served_model_names=tuple(args.served_model_name or ()),
            host=args.host,
            port=args.port,
            api_key=args.api_key or None,
            max_queue_len=args.max_queue_len,
            drain_timeout=args.drain_timeout,
            enable_debug_endpoints=args.enable_debug_endpoints,
            log_level=args.log_level,
            engine_args=engine_args(args),
        )
        engine_cfg = EngineConfig.create(cfg.model, **cfg.engine_args)
    except ValueError as e:
        print(f"pagoda serve: error: {e}", file=sys.stderr)
        return 2
    metrics = ServerMetrics(cfg.served_model_name)
    engine = AsyncEngine(
        lambda: EngineCore(engine_cfg), max_queue_len=cfg.max_queue_len, observer=metrics
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


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose exit signals drain the engine first; exits 1 if loading fails."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, cfg: ServerConfig) -> None:
        super().__init__(config)
        self.engine, self.cfg = engine, cfg
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False
        self._tasks: list[asyncio.Task] = []  # keep references: tasks are weakly held

    async def serve(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks.append(self._loop.create_task(self._watch_startup()))
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (main thread). Unlike uvicorn's, it does not re-raise the signal."""
        if self._drain_requested or self._loop is None:
            self.should_exit = True
            self.force_exit = self.force_exit or sig == signal.SIGINT
            return
        self._drain_requested = True
        self._loop.call_soon_threadsafe(self._begin_drain, signal.Signals(sig).name)

    def _begin_drain(self, name: str) -> None:
        self._tasks.append(asyncio.ensure_future(self._drain(name)))

    async def _drain(self, name: str) -> None:
        log.info("%s: draining (up to %.0f s)", name, self.cfg.drain_timeout)
        aborted = await self.engine.drain(self.cfg.drain_timeout)
        if aborted:
            log.warning("drain timeout: aborted %d request(s)", aborted)
        self.should_exit = True

    async def _watch_startup(self) -> None:
        engine = self.engine
        while not (engine.ready or engine.dead or self.should_exit):
            await asyncio.sleep(0.1)
        if engine.ready:
            names = ", ".join(self.cfg.served_model_names)
            url = f"http://{self.cfg.host}:{self.config.port}/v1"
            log.info("ready: OpenAI API at %s serving %s (metrics at /metrics)", url, names)
        elif engine.dead:
            log.error("engine failed to start: %r", engine.error)
            self.exit_code = 1
            self.should_exit = True
