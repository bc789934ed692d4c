"""Rank 0's side of a tensor-parallel group (vLLM's multiprocessing executor, in small): start
this node's other ranks as processes, join the group with them, watch that they stay alive, and
stop them when the engine closes.

Failure model: a rank that exits (a crash, an OOM kill, `kill -9`) is seen at once through its
process sentinel; the watch records the error and calls `on_failure` (the server's: `/health`
turns 503, streams fail, the server exits non-zero), and `EngineCore` refuses to step again
(`check`). A rank on another node (`--nnodes`) is not a child: its death closes its sockets,
which fails rank 0's next collective at once on gloo, or after PAGODA_TP_TIMEOUT_S on NCCL.
The other ranks watch rank 0 in turn (`worker_proc.py`): nothing is left running or waiting.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import socket
import threading
from collections.abc import Callable

import torch
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.engine.worker_proc import WorkerSpec, rank_device, run_worker, share_cpu

log = logging.getLogger(__name__)
STOP_GRACE_S = 5.0  # how long ranks get to leave after "stop" before they are killed


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def rank_context() -> multiprocessing.context.BaseContext:
    """How this node's other ranks start: spawned (never a fork of a process that may hold CUDA
    or an OpenMP pool). The tests fork them from a server that imported the engine once
    (tests/forkserver_testlib.py)."""
    return multiprocessing.get_context("spawn")


class TensorParallelFailure(RuntimeError):
    """A rank of the group is gone: the engine cannot run another step."""


class Executor:
    """Starts ranks 1 .. ranks_per_node - 1 and joins the group as rank 0 (`group`)."""

    def __init__(
        self,
        config: EngineConfig,
        max_model_len: int,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        par = config.parallel
        self.on_failure = on_failure
        self.failure: BaseException | None = None
        self._closing = False
        local = par.nnodes == 1  # one node: rendezvous on loopback, on a port free now
        address = "127.0.0.1" if local else par.address
        port = free_port() if local else par.master_port
        spec = WorkerSpec(
            config, address, port, max_model_len, os.getpid(), log.getEffectiveLevel()
        )
        ctx = rank_context()
        self.procs = {
            rank: ctx.Process(
                target=run_worker, args=(spec, rank), name=f"pagoda-tp-{rank}", daemon=True
            )
            for rank in range(1, par.ranks_per_node)
        }
        for p in self.procs.values():
            p.start()
        self._threads = torch.get_num_threads()
        share_cpu(config)
        self._watch = threading.Thread(
            target=self._watch_ranks, name="pagoda-tp-watch", daemon=True
        )
        self._watch.start()
        device = rank_device(config, 0)
        try:
            self.group = TPGroup.join(0, par.tensor_parallel_size, address, port, device)
        except Exception as e:
            self.close()
            raise self.failure or e from None

    def _watch_ranks(self) -> None:
        sentinels = {p.sentinel: rank for rank, p in self.procs.items()}
        while not self._closing and sentinels:
            for s in multiprocessing.connection.wait(list(sentinels), timeout=0.5):
                if self._closing:
                    return
                rank = sentinels.pop(s)
                p = self.procs[rank]
                p.join(1.0)  # reap it: its exit code names a kill (-9) or a crash (1)
                self.fail(TensorParallelFailure(
                    f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
                ))  # fmt: skip
                return

    def fail(self, exc: BaseException) -> None:
        """Record that the group is broken and tell the engine's owner (from any thread)."""
        if self.failure is not None:
            return
        self.failure = exc
        log.error("%s: the engine stops", exc)
        if self.on_failure is not None:
            self.on_failure(exc)

    def check(self) -> None:
        """Raise the group's failure, if any (before a step, which would wait on a dead rank)."""
        if self.failure is not None:
            raise self.failure

    def close(self, channel=None) -> None:
        """Stop the other ranks (through `channel` when the group still works), then leave."""
        if self._closing:
            return
        self._closing = True
        if channel is not None and self.failure is None:
            try:
                channel.stop()
            except Exception:  # a rank went away meanwhile: it is killed below
                log.debug("could not send stop to the ranks", exc_info=True)
        for p in self.procs.values():
            p.join(STOP_GRACE_S if self.failure is None else 0.1)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        torch.set_num_threads(self._threads)
        if hasattr(self, "group"):  # a broken group is aborted (no wait on a dead rank)
            self.group.close(broken=self.failure is not None)
