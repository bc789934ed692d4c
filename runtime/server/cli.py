"""`pagoda serve`: flags (named like vLLM's where they mean the same) → ServerConfig (HTTP) and
one EngineConfig (`launch.preflight`, with the tuned profile applied) → uvicorn.

The flags, their choices and defaults come from `pagoda.runtime.options`, the contract the
operator renders container args from. `build_parser()` imports neither torch nor uvicorn, so the
operator (and its tests) can parse those args with the real parser.

Start-up order: flags are parsed (a bad value: one line, exit 2), the listening sockets are
bound (a port in use or a foreign host: one line, exit 2, before torch is even imported), then
`launch.preflight` reads the model's metadata and checks every size against the model and this
machine's memory (one line, exit 2). Only then does the model load, behind the already-bound
port (`/health` answers, `/ready` is 503 until warm); a failure there exits 1, also with one
line.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any, NoReturn

# Before torch loads libgomp: OpenMP threads that spin at barriers while another process holds
# a core make a CPU step 10-20x slower on shared or CPU-limited nodes (measured on 2 busy cores:
# 2.3 s vs 0.1 s a step at batch 32); passive waiting costs little when the cores are free.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pagoda.runtime import options
from pagoda.runtime.lora_config import LORA_KWARGS, LoRAConfig
from pagoda.runtime.options import ENGINE_FLAGS, PARALLEL_FLAGS, SERVER_FLAGS, Flag
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.held_logs import held_logs
from pagoda.runtime.server.listen import (
    bind_sockets,
    close_all,
    ensure_fd_limit,
    start_listening,
)
from pagoda.runtime.termination import exit_error

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

    def error(message: str) -> NoReturn:  # one line, like every other start-up error
        fail(ValueError(f"{message} (see `pagoda serve --help`)"))

    p.error = error  # type: ignore[method-assign]
    engine = p.add_argument_group("engine")
    for f in ENGINE_FLAGS.values():
        _add(engine, f)
    server = p.add_argument_group("server")
    for f in SERVER_FLAGS.values():
        _add(server, f)
    distributed = p.add_argument_group("tensor parallelism")
    for f in PARALLEL_FLAGS.values():
        _add(distributed, f)
    _add_model_positional(p, error)


_UNSET = object()  # --model not given (its default is only filled in after parsing)


def _add_model_positional(p: argparse.ArgumentParser, error: Any) -> None:
    """`pagoda serve MODEL` as `vllm serve MODEL`: the model as a positional argument or as
    --model; both given and different is an error (one line, exit 2)."""
    p.add_argument("model_positional", nargs="?", default=argparse.SUPPRESS, metavar="MODEL",
                   help="the model, as --model (either form; not both with different values)")  # fmt: skip
    parse_known_args = p.parse_known_args

    def parse(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        namespace = argparse.Namespace() if namespace is None else namespace
        preset = hasattr(namespace, "model")
        if not preset:
            namespace.model = _UNSET
        namespace, extras = parse_known_args(args, namespace)
        positional = vars(namespace).pop("model_positional", None)
        if namespace.model is _UNSET:
            namespace.model = (
                positional if positional is not None else ENGINE_FLAGS["model"].default
            )
        elif positional is not None and positional != namespace.model:
            error(f"the model is given twice: {positional!r} and --model {namespace.model!r}")
        return namespace, extras

    p.parse_known_args = parse  # type: ignore[method-assign]


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
        max_seqs_per_request=args.max_seqs_per_request,
        max_request_bytes=args.max_request_bytes,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        send_timeout=args.send_timeout,
        drain_timeout=args.drain_timeout,
        enable_debug_endpoints=args.enable_debug_endpoints,
        log_level=args.log_level,
        engine_process=args.engine_process,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        allow_chat_special_tokens=args.allow_chat_special_tokens,
        grammar_compile_timeout=args.grammar_compile_timeout,
        grammar_cache_bytes=_size("grammar_cache_size", args.grammar_cache_size),
        lora=LoRAConfig.from_values(**{k: getattr(args, k) for k in LORA_KWARGS}),
    )


def _size(name: str, text: str) -> int:
    try:
        return options.parse_size(text)
    except ValueError as e:
        raise ValueError(f"{name}: cannot parse size {text!r} (e.g. 256MiB, 1G)") from e


def fail(error: BaseException) -> NoReturn:
    """One line on stderr and the termination message (`runtime/termination.py`); exit 2."""
    sys.exit(exit_error("pagoda serve", error))


def parallelism(args: argparse.Namespace) -> Parallelism:
    """The tensor-parallel flags, validated (ValueError); against the model and this node's
    devices in `launch.preflight`."""
    return Parallelism.from_values(vars(args))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sockets: list = []
    engine = None
    try:
        with held_logs():
            cfg = server_config(args)
            engine_kwargs = options.engine_kwargs(vars(args))
            layout = parallelism(args)
            if layout.is_worker:  # a headless node of a group: no HTTP server
                return serve_worker_node(args, engine_kwargs, layout)
            cfg = fit_connections(cfg)
            sockets = bind_sockets(cfg.host, cfg.port)  # before torch: a port in use is instant
            checks = dict(
                cfg=cfg, engine_kwargs=engine_kwargs, tuned_profile=args.tuned_profile,
                tuned_profile_mismatch=args.tuned_profile_mismatch,
                download_dir=args.download_dir, revision=args.revision, parallel=layout,
            )  # fmt: skip
            if cfg.engine_process:  # checked where torch is: this process never imports it
                from pagoda.runtime.engine.core_client import EngineProcClient
                from pagoda.runtime.engine.core_proc import ByName
                from pagoda.runtime.server.api_process import prepare

                engine = EngineProcClient(cfg.log_level).spawn()
                job = ByName("pagoda.runtime.server.launch", "checked_factory", checks)
                plan = engine.preflight(job, meanwhile=prepare)  # the app imports meanwhile
            else:
                from pagoda.runtime.server.launch import preflight

                engine_cfg, profile = preflight(**checks)
            start_listening(sockets, cfg.host)
    except ValueError as e:  # a ProfileError, KernelConfigError, failed download too
        close_all(sockets)
        stop_engine(engine)
        fail(e)
    except Exception as e:  # a checkpoint or profile that breaks a reader in a way not foreseen
        close_all(sockets)
        stop_engine(engine)
        logging.getLogger("pagoda.serve").debug("start-up check failed", exc_info=True)
        fail(ValueError(f"{type(e).__name__}: {e}"))
    if engine is None:  # the engine on a thread of this process
        from pagoda.runtime.server.launch import serve

        return serve(cfg, engine_cfg, profile, sockets)
    from pagoda.runtime.server.api_process import serve

    return serve(cfg, plan, None, sockets, engine)


def stop_engine(engine: Any) -> None:
    if engine is not None:
        engine.stop(timeout=5)


def serve_worker_node(
    args: argparse.Namespace, engine_kwargs: dict[str, Any], layout: Parallelism
) -> int:
    """`--node-rank R` > 0: this node's ranks of the group, headless, until rank 0 stops them
    (they run the steps it broadcasts); the same checks as node 0 first (exit 2)."""
    from pagoda.runtime.engine.worker_proc import serve_node
    from pagoda.runtime.server.launch import preflight

    cfg = server_config(args)
    try:
        engine_cfg, _ = preflight(
            cfg, engine_kwargs, args.tuned_profile, args.tuned_profile_mismatch,
            download_dir=args.download_dir, revision=args.revision, parallel=layout,
        )  # fmt: skip
    except ValueError as e:
        fail(e)
    return serve_node(engine_cfg)


def fit_connections(cfg: ServerConfig) -> ServerConfig:
    """--max-connections within the open-file limit: the default shrinks to fit (a warning),
    an explicit value that cannot fit is a ValueError."""
    default = options.DEFAULT_MAX_CONNECTIONS
    cap = ensure_fd_limit(cfg.max_connections, adjustable=cfg.max_connections == default)
    if cap == cfg.max_connections:
        return cfg
    logging.getLogger("pagoda.serve").warning(
        "the open-file limit (ulimit -n) holds %d connections, not %d", cap, default
    )
    return dataclasses.replace(cfg, max_connections=cap)
