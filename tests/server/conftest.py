"""Fixtures for server tests: a real `pagoda serve` process on a free loopback port.

The main server starts once per session (model loading dominates the cost) with a small KV
cache and context so that start-up and memory stay low; the offline `LLM` used as the oracle
loads while the server process starts.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from server_testlib import MAX_MODEL_LEN, ServerProcess


@pytest.fixture(scope="session")
def server_process() -> Iterator[ServerProcess]:
    srv = ServerProcess(
        "--kv-cache-memory", "96MiB",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--enable-debug-endpoints",
        "--log-level", "warning",
    )  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def server(server_process: ServerProcess) -> ServerProcess:
    server_process.wait_ready()
    return server_process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    """The `openai` SDK on the session's server (no retries: a test sees each answer)."""
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def offline(server_process: ServerProcess):
    """The offline engine with the server's dtype; it loads while the server starts.

    One torch thread (until the session ends): the server process computes beside it.
    """
    import torch
    from pagoda.runtime import LLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LLM("smollm2-135m", max_model_len=MAX_MODEL_LEN, kv_cache_memory=32 << 20)
    torch.set_num_threads(threads)
