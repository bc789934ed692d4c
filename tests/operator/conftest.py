"""Fixtures for the operator tests: an API-server emulator on loopback and a running operator."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock
import pytest
from faulty_emulator import FaultyEmulator
from operator_harness import TEST_AGENT, RunningOperator, load_crd, write_kubeconfig
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.spec.config import OperatorConfig


@pytest.fixture
async def emulator(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FaultyEmulator]:
    """The API-server emulator; faults are off unless a test injects them."""
    emu = FaultyEmulator()
    emu.resources.load_bundled()
    emu.declare_crd(load_crd())
    async with emu, kmock.Server(emu, host="127.0.0.1") as server:
        emu.port = server.port
        emu.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.port)
        monkeypatch.setenv("KUBECONFIG", str(emu.kubeconfig))
        yield emu


@pytest.fixture
async def kube(emulator: FaultyEmulator) -> AsyncIterator[KubeApi]:
    """An API client for the test itself (its requests are told apart by the user agent)."""
    api = KubeApi(user_agent=TEST_AGENT, request_timeout_s=5)
    await api.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=load_crd()
    )
    yield api
    await api.close()


@pytest.fixture
async def start_operator(kube: KubeApi) -> AsyncIterator[Callable[..., Awaitable[RunningOperator]]]:
    started: list[RunningOperator] = []

    async def start(**overrides: Any) -> RunningOperator:
        settings = {
            "http_host": "127.0.0.1",
            "http_port": 0,
            "request_timeout_s": 5.0,
            "resync_interval_s": 300.0,
            "pin_models": False,  # no Hub here: test_model_pin.py turns it on with a local one
        }
        op = RunningOperator(OperatorConfig(**{**settings, **overrides}))
        started.append(op)
        await op.start()
        return op

    yield start
    for op in started:
        await op.shutdown()
