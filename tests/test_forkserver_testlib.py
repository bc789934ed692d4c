"""The tests' forked children (tests/forkserver_testlib.py): which processes fork from the server
and which are spawned as `pagoda serve` spawns them. Nothing is started here."""

from __future__ import annotations

import os

import pytest
import torch
from forkserver_testlib import ForkedContext
from pagoda.runtime.engine import core_client, executor
from pagoda.runtime.engine.core_proc import run_engine_core
from pagoda.runtime.engine.worker_proc import run_worker

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA machines spawn all")


def kind(ctx: ForkedContext, target) -> str:
    return ctx.Process(target=target, args=(None, 1))._start_method


def test_ranks_and_the_engine_process_fork_only_in_the_sessions_environment(monkeypatch):
    ctx = ForkedContext()
    assert kind(ctx, run_worker) == kind(ctx, run_engine_core) == "forkserver"
    assert kind(ctx, print) == "spawn"  # any other child: as the product starts it
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # pytest's own: still forked
    assert kind(ctx, run_worker) == "forkserver"
    monkeypatch.setenv("TRITON_INTERPRET", "0" if os.environ.get("TRITON_INTERPRET") else "1")
    assert kind(ctx, run_worker) == kind(ctx, run_engine_core) == "spawn"  # read at import
    assert (ctx.forked, ctx.spawned) == (3, 3)


def test_the_session_forks_unless_told_to_spawn():
    if os.environ.get("PAGODA_TEST_SPAWN_RANKS") == "1":
        assert executor.rank_context()._name == core_client.engine_context()._name == "spawn"
    else:
        assert isinstance(executor.rank_context(), ForkedContext)
        assert core_client.engine_context() is executor.rank_context()
