"""Leaving a tensor-parallel group (gloo on the CPU): a start that fails midway, or a group a rank
left, must not leave the process's default group behind, or the next `LLM(...)` in the same
process fails with "trying to initialize the default process group twice"."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.engine import core
from pagoda.runtime.engine.executor import free_port

CPU = torch.device("cpu")
ARGS = dict(tensor_parallel_size=2, dtype="float32", kv_cache_memory=1 << 24, max_model_len=64)


def join_alone() -> TPGroup:
    return TPGroup.join(0, 1, "127.0.0.1", free_port(), CPU)


@pytest.mark.parametrize("broken", [False, True])
def test_a_closed_group_leaves_room_for_a_new_one(broken: bool) -> None:
    join_alone().close(broken=broken)
    assert not dist.is_initialized()
    group = join_alone()  # the second start in one process
    assert group.agree_min(3) == 3
    group.close()
    assert not dist.is_initialized()


def test_a_rendezvous_that_fails_midway_leaves_no_group(monkeypatch) -> None:
    def gone(*args, **kwargs):
        raise RuntimeError("connection reset by peer")

    monkeypatch.setattr(dist, "new_group", gone)
    with pytest.raises(RuntimeError, match="connection reset"):
        join_alone()
    assert not dist.is_initialized()


def test_a_start_that_fails_after_the_model_is_built_leaves_the_group(tmp_path, monkeypatch):
    """Rank 0 fails once both ranks built their runners (here: its scheduler); the other rank
    stops, and a second engine of two ranks starts in the same process."""
    make_tiny_model(tmp_path, "Llama")

    def fail(*args, **kwargs):
        raise RuntimeError("scheduler failed")

    with monkeypatch.context() as m:
        m.setattr(core, "Scheduler", fail)
        with pytest.raises(RuntimeError, match="scheduler failed"):
            LLM(str(tmp_path), **ARGS)
    assert not dist.is_initialized()
    with LLM(str(tmp_path), **ARGS) as llm:
        executor = llm.engine.executor
        (rank1,) = executor.procs.values()
        rank1.kill()  # a rank gone: the group is broken, and still left on close
        deadline = time.monotonic() + 10
        while executor.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert executor.failure is not None
    assert not dist.is_initialized()
