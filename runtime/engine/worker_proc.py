"""A rank other than 0: load this rank's part of the model, then run the forward of every step
rank 0 broadcasts (`step_channel.py`) until it says stop. No scheduler, no sampler, no requests.

A worker never outlives rank 0: on rank 0's node it watches its parent process and exits when
that is gone; on another node (`pagoda serve --node-rank R`) a closed connection fails its next
collective. Any error exits the process non-zero, which rank 0's watch sees (`executor.py`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch
from pagoda.runtime.config import EngineConfig

log = logging.getLogger(__name__)
PARENT_POLL_S = 0.2


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank of a node needs to join the group (picklable: spawn sends it)."""

    config: EngineConfig
    address: str
    port: int
    max_model_len: int  # rank 0's, before the KV cache caps it
    parent_pid: int  # exit when this process is gone (0: do not watch)
    log_level: int = logging.INFO


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """A rank's device: on CUDA the node's GPU of its local rank, else the CPU."""
    device = config.torch_device()
    if device.type != "cuda":
        return device
    local = rank % config.parallel.ranks_per_node
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != pid:
            os._exit(3)  # rank 0 is gone: nothing is left to wait for


def share_cpu(config: EngineConfig) -> None:
    """Ranks on one CPU share its cores (each rank's OpenMP pool would otherwise take all)."""
    if config.torch_device().type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        torch.set_num_threads(max(1, (cores or 1) // config.parallel.ranks_per_node))


def run_worker(spec: WorkerSpec, rank: int) -> None:
    """The process target of rank `rank` (> 0)."""
    logging.basicConfig(
        level=spec.log_level, format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s"
    )
    if spec.parent_pid:
        threading.Thread(target=_watch_parent, args=(spec.parent_pid,), daemon=True).start()
    try:
        serve_steps(spec, rank)
    except BaseException:
        log.exception("tensor-parallel rank %d failed", rank)
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # skip interpreter teardown (and a group teardown racing rank 0's exit)


def serve_steps(spec: WorkerSpec, rank: int) -> None:
    """Join, build this rank's runner, run steps until rank 0 stops."""
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.warmup import warm_kernels
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.worker.model_runner import ModelRunner
    from pagoda.runtime.worker.step_channel import StepChannel

    config = spec.config
    share_cpu(config)
    size = config.parallel.tensor_parallel_size
    tp = TPGroup.join(rank, size, spec.address, spec.port, rank_device(config, rank))
    loaded = load_model(config.model)
    check(loaded.config, size)
    runner = ModelRunner(config, loaded, spec.max_model_len, tp)
    del loaded
    # as EngineCore: the context is capped to what the (agreed) KV cache holds
    limit = min(spec.max_model_len, runner.num_blocks * config.cache.block_size)
    runner.capture_cuda_graphs(config.scheduler.max_num_seqs, limit)
    sched = config.scheduler
    warm_kernels(runner, max_num_seqs=sched.max_num_seqs, max_model_len=limit,
                 max_num_batched_tokens=sched.max_num_batched_tokens)  # fmt: skip
    channel = StepChannel.of(runner)
    steps = 0
    while (step := channel.receive()) is not None:
        runner.forward_step(*step)
        steps += 1
    log.info("rank %d: stopped after %d steps", rank, steps)
    tp.close()


def serve_node(config: EngineConfig) -> int:
    """`pagoda serve --node-rank R` (R > 0): run this node's ranks, headless, until rank 0
    stops them; the exit code (non-zero when any rank failed).

    SIGTERM does not stop them: Kubernetes sends it to every pod of a group at once, while the
    leader first drains (`--drain-timeout`), and its in-flight steps need these ranks; rank 0
    stops them once it has drained (the pod's grace period is the leader's, which covers it).
    """
    import multiprocessing
    import signal

    def hold(signum: int, frame: object) -> None:
        log.info("SIGTERM: this node's ranks run until rank 0 stops them (it drains first)")

    signal.signal(signal.SIGTERM, hold)  # a handler, not SIG_IGN: spawned ranks get the default

    par = config.parallel
    spec = WorkerSpec(config, par.address, par.master_port, _node_max_model_len(config), 0,
                      logging.getLogger().getEffectiveLevel())  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    first = par.node_rank * par.ranks_per_node
    procs = [
        ctx.Process(target=run_worker, args=(spec, r), name=f"pagoda-tp-{r}", daemon=True)
        for r in range(first, first + par.ranks_per_node)
    ]
    for p in procs:
        p.start()
    code = 0
    for p in procs:  # one rank failing fails the group: rank 0 sees it and stops the rest
        p.join()
        code = code or (p.exitcode or 0)
    return code


def _node_max_model_len(config: EngineConfig) -> int:
    """What rank 0 computes: --max-model-len, or the model's context."""
    if config.scheduler.max_model_len is not None:
        return config.scheduler.max_model_len
    from pagoda.runtime.model.loader import read_model_config

    return read_model_config(config.model).context_length
