"""The engine's child processes in the tests start from a forkserver that imported it once.

`LLM(..., tensor_parallel_size=2)` starts rank 1 as a spawned process (`engine/executor.py`),
which imports torch and the engine again before it joins the group: ~2.5 s a case on a quiet
2-core box, 6-8 s on a loaded one, over ~80 two-rank cases a run; the engine process of
`AsyncEngine(engine_process=True)` (`engine/core_client.py`) likewise. tests/conftest.py swaps
`executor.rank_context` and `core_client.engine_context` for `ForkedContext`, which forks these
from multiprocessing's forkserver (one per pytest process, started at its first such child,
`preload_names()` imported there). A child forked so is still a process of its own, as a
spawned one is:
- it gets the starting test's working directory and sys.path (multiprocessing sends both with
  each process, as for spawn: what the server did not import, such as the tests' helpers, is
  imported from there) and none of the test process's state (monkeypatches included);
- the server only imported modules (no thread of torch's, no OpenMP pool, no CUDA), so the
  fork copies nothing running;
- it watches the server as its parent (`WorkerSpec.parent_pid`, the engine process's
  `parent_pid`), and the server exits when this process does, so a child still never
  outlives its test process.
The environment is the one thing a fork gets from the server instead: the session's, and some
modules read variables at import (TRITON_INTERPRET decides how kernels are decorated). So a
test that changed os.environ since the session started gets a spawned child, as before, and so
does everything on a CUDA machine (a process that touched CUDA must not fork; spawn is the
product's way there). PAGODA_TEST_SPAWN_RANKS=1 spawns every child (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import pkgutil

# Variables set during the session (by pytest per test; by torch once Triton's cache is used),
# read by nothing at import: a child forked while they differ gets the test process's values.
IGNORED = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
# What a rank or the engine process imports before it serves a step (its runner, the loader,
# the families' modules and the kernels, imported by name or walked below).
PRELOAD = (
    "torch",
    "numpy",
    "safetensors.torch",
    "tokenizers",
    "jinja2",
    "triton",
    "zmq",
    "pagoda.runtime.engine.core",
    "pagoda.runtime.engine.core_proc",
    "pagoda.runtime.engine.worker_proc",
    "pagoda.runtime.distributed.group",
    "pagoda.runtime.distributed.layout",
    "pagoda.runtime.engine.warmup",
    "pagoda.runtime.model.loader",
    "pagoda.runtime.worker.model_runner",
    "pagoda.runtime.worker.step_channel",
)
WALKED = (
    "pagoda.kernels",
    "pagoda.runtime.attention",
    "pagoda.runtime.cpu",
    "pagoda.runtime.model",
    "pagoda.runtime.quantization",
    "pagoda.runtime.sampling",
    "pagoda.runtime.worker",
)


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in IGNORED}


def preload_names() -> list[str]:
    """`PRELOAD`, then every module of the `WALKED` packages (a child imports the ones its
    model needs; importing a module only defines it: the registry imports families by name)."""
    names = list(PRELOAD)
    for package in WALKED:
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.iter_modules(path, package + ".")]
    return names


def _check(ignored: dict[str, str | None], engine: str) -> None:
    """The test process's values of `IGNORED`, and its engine: the server imported `pagoda`
    through its own sys.path (multiprocessing gives the server the interpreter's, without the
    test process's additions), which must find the same checkout."""
    import pagoda.runtime

    if pagoda.runtime.__file__ != engine:
        raise RuntimeError(f"the forkserver imported {pagoda.runtime.__file__}, not {engine}")
    for k, v in ignored.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _rank(ignored: dict[str, str | None], engine: str, spec, rank: int) -> None:
    """Rank `rank`'s process, watching the forkserver (its parent) instead of the test process,
    whose child it is not; the server leaves when the test process does."""
    from pagoda.runtime.engine.worker_proc import run_worker

    _check(ignored, engine)
    run_worker(dataclasses.replace(spec, parent_pid=os.getppid()), rank)


def _engine_core(ignored: dict[str, str | None], engine: str, in_addr, out_addr, parent_pid, *rest):
    """The engine process, watching the forkserver as `_rank` does."""
    from pagoda.runtime.engine.core_proc import run_engine_core

    _check(ignored, engine)
    run_engine_core(in_addr, out_addr, os.getppid(), *rest)


class ForkedContext:
    """What `executor.rank_context()` and `core_client.engine_context()` return in the tests:
    its `Process` forks the child from the forkserver when the environment is the session's,
    else spawns it."""

    def __init__(self) -> None:
        self.environment = _environment()  # the session's
        self.spawn = multiprocessing.get_context("spawn")
        self.forkserver: multiprocessing.context.BaseContext | None = None
        self.forked = self.spawned = 0

    def _server(self) -> multiprocessing.context.BaseContext | None:
        import torch

        if _environment() != self.environment or torch.cuda.is_available():
            return None
        if self.forkserver is None:
            self.forkserver = multiprocessing.get_context("forkserver")
            self.forkserver.set_forkserver_preload(preload_names())
        return self.forkserver

    def Process(self, target, args, **kwargs):  # multiprocessing's name
        import pagoda.runtime
        from pagoda.runtime.engine.core_proc import run_engine_core
        from pagoda.runtime.engine.worker_proc import run_worker

        wrapper = {run_worker: _rank, run_engine_core: _engine_core}.get(target)
        server = self._server() if wrapper is not None else None
        if server is None:
            self.spawned += 1
            return self.spawn.Process(target=target, args=args, **kwargs)
        self.forked += 1
        ignored = {k: os.environ.get(k) for k in IGNORED}
        args = (ignored, pagoda.runtime.__file__, *args)
        return server.Process(target=wrapper, args=args, **kwargs)
