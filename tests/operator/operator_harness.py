"""The operator tests' harness: paths, kubeconfig, polling, and the operator run in a thread."""

from __future__ import annotations

import asyncio
import copy
import functools
import pathlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from pagoda.operator import main
from pagoda.operator.spec.config import OperatorConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "inferenceservice.yaml"
ISVC = "serving.pagoda.dev/v1alpha1/inferenceservices"
DEPLOY = "apps/v1/deployments"
TEST_AGENT = "pagoda-tests/1"


@functools.cache
def _parsed_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())  # ~0.1-0.4 s of pure-Python YAML: once


def load_crd() -> dict[str, Any]:
    """The InferenceService CRD, a copy of its one parse per session (callers may change it)."""
    return copy.deepcopy(_parsed_crd())


def write_kubeconfig(path: pathlib.Path, port: int) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "tester", "namespace": "default"},
            }
        ],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def wait_for(
    check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(interval)


class RunningOperator:
    """`main.serve` in a thread with its own event loop, as `pagoda operator` runs it.

    (Kopf cancels every task created in its loop after it started, so it must not share the
    test's loop, which hosts the emulator.)
    """

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.http_port: int | None = None
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._frozen = threading.Event()
        self.thread = threading.Thread(target=self._run, name="operator", daemon=True)

    def _run(self) -> None:
        def http_started(port: int) -> None:
            self.http_port = port

        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await main.serve(
                self.config, stop_flag=self.stop, ready_flag=self.ready,
                on_http_started=http_started,
            )  # fmt: skip

        try:
            asyncio.run(serve())
        except BaseException as e:  # reported by start()/shutdown()
            self.error = e

    async def start(self, timeout: float = 15.0) -> None:
        self.thread.start()
        await wait_for(
            lambda: self.ready.is_set() or not self.thread.is_alive(),
            timeout,
            what="operator ready",
        )
        if not self.thread.is_alive():
            raise AssertionError(f"the operator exited during startup: {self.error!r}")

    def freeze(self) -> None:
        """Hang the operator's event loop, as a crashed process or a lost node: no request, no
        keep-alive, no goodbye (its peering record stays until it expires). `shutdown` thaws."""
        assert self.loop is not None
        self._frozen.clear()
        self.loop.call_soon_threadsafe(self._frozen.wait)

    async def shutdown(self, timeout: float = 45.0) -> None:
        self._frozen.set()
        self.stop.set()
        await wait_for(lambda: not self.thread.is_alive(), timeout, what="operator stopped")
        if self.error is not None:
            raise AssertionError(f"the operator failed: {self.error!r}")
