"""`pagoda serve`: flags (named like vLLM's where they mean the same) → ServerConfig (HTTP) and
one EngineConfig (`launch.preflight`, with the tuned profile applied) → uvicorn.

The flags, their choices and defaults come from `pagoda.runtime.options`, the contract the
operator renders container args from. `build_parser()` imports neither torch nor uvicorn, so the
operator (and its tests) can parse those args with the real parser.

Start-up order: flags are validated, the model is resolved and its config read *before* the HTTP
server binds, so a bad `--model` or an impossible flag combination exits 2 with one line on
stderr. Loading the weights happens after the bind (`/health` answers, `/ready` is 503 until
warm); a failure there exits 1, also with one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

# Before torch loads libgomp: OpenMP threads that spin at barriers while another process holds
# a core make a CPU step 10-20x slower on shared or CPU-limited nodes (measured on 2 busy cores:
# 2.3 s vs 0.1 s a step at batch 32); passive waiting costs little when the cores are free.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pagoda.runtime import options
from pagoda.runtime.options import ENGINE_FLAGS, SERVER_FLAGS, Flag
from pagoda.runtime.server.config import ServerConfig

DESCRIPTION = "Run the OpenAI-compatible inference server."


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every flag that has a meaningful default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        switch = action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction)
        if "%(default)" in text or action.default in (None, argparse.SUPPRESS) or switch:
            return text
        return f"{text} (default: %(default)s)"


def _add(group: argparse._ActionsContainer, f: Flag) -> None:
    kw: dict[str, Any] = {"default": f.default, "help": argparse.SUPPRESS if f.hidden else f.help}
    if f.kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction
    elif f.kind == "switch":
        kw["action"] = "store_true"
    else:
        kw.update(type=f.type, choices=f.choices, metavar=f.metavar)
        if f.kind == "multi":
            kw["nargs"] = "+"
    group.add_argument(f.name, **kw)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every `pagoda serve` flag, from `options` (engine flags first, then the HTTP side)."""
    p.formatter_class = DefaultsHelpFormatter
    engine = p.add_argument_group("engine")
    for f in ENGINE_FLAGS.values():
        _add(engine, f)
    server = p.add_argument_group("server")
    for f in SERVER_FLAGS.values():
        _add(server, f)


def build_parser() -> argparse.ArgumentParser:
    """The real `pagoda serve` parser (no torch, no uvicorn import)."""
    p = argparse.ArgumentParser(prog="pagoda serve", description=DESCRIPTION)
    add_arguments(p)
    return p


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The HTTP side's flags → validated ServerConfig (ValueError names the bad flag)."""
    return ServerConfig(
        model=args.model,
        served_model_names=tuple(args.served_model_name or ()),
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get(options.API_KEY_ENV) or None,
        max_queue_len=args.max_queue_len,
        max_request_bytes=args.max_request_bytes,
        drain_timeout=args.drain_timeout,
        enable_debug_endpoints=args.enable_debug_endpoints,
        log_level=args.log_level,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from pagoda.runtime.server.launch import preflight, serve

    try:
        cfg = server_config(args)
        engine_kwargs = options.engine_kwargs(vars(args))
        engine_cfg, profile = preflight(
            cfg, engine_kwargs, args.tuned_profile, args.tuned_profile_mismatch
        )
    except ValueError as e:  # a ProfileError too: refused profiles exit 2 with one line
        print(f"pagoda serve: error: {' '.join(str(e).split())[:1000]}", file=sys.stderr)
        return 2
    return serve(cfg, engine_cfg, profile)
