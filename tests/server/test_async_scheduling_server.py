"""`pagoda serve --async-scheduling` end to end: concurrent streaming and non-streaming clients,
stop strings and a client that disconnects mid-stream; every text equals the offline engine's
(without async scheduling) and the server keeps serving."""

from __future__ import annotations

import asyncio

import openai
import pytest
from pagoda.runtime import SamplingParams
from server_testlib import MAX_MODEL_LEN, ServerProcess

MODEL = "smollm2-135m"
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPTS = [
    "The history of computing is a story of",
    "Rivers carve valleys",
    "A short list of fruits:",
    "Once upon a time",
    "The capital of France is",
    "1, 2, 3,",
]


@pytest.fixture(scope="module")
def async_server():
    srv = ServerProcess(
        "--async-scheduling", "--kv-cache-memory", "64MiB",
        "--max-model-len", str(MAX_MODEL_LEN), "--log-level", "warning",
    )  # fmt: skip
    srv.wait_ready()
    yield srv
    srv.stop()


async def _complete(client, prompt: str, stream: bool, **kw) -> str:
    if not stream:
        r = await client.completions.create(model=MODEL, prompt=prompt, **kw)
        return r.choices[0].text
    text = ""
    async for chunk in await client.completions.create(
        model=MODEL, prompt=prompt, stream=True, **kw
    ):
        text += chunk.choices[0].text if chunk.choices else ""
    return text


async def _disconnect_early(client) -> None:
    stream = await client.completions.create(
        model=MODEL, prompt="Tell me a long story.", max_tokens=200, temperature=0, stream=True
    )
    async for _ in stream:
        break
    await stream.close()


async def test_concurrent_clients_equal_offline(async_server, offline):
    client = openai.AsyncOpenAI(base_url=f"{async_server.base}/v1", api_key="x", max_retries=0)
    kws = [dict(max_tokens=24, temperature=0, stop=["\n"] if i % 2 else None) for i in range(6)]
    got = await asyncio.gather(
        _disconnect_early(client),
        *(_complete(client, p, i % 3 == 0, **kw) for i, (p, kw) in enumerate(zip(PROMPTS, kws))),
    )
    params = [SamplingParams(max_tokens=24, temperature=0, stop=kw["stop"] or []) for kw in kws]
    want = offline.generate(PROMPTS, params)  # one batch, as the server's (greedy: invariant)
    for prompt, out, text in zip(PROMPTS, want, got[1:]):
        assert text == out.outputs[0].text, prompt
    again = await _complete(client, PROMPTS[0], False, max_tokens=24, temperature=0)
    assert again == got[1]  # still serving, same answer
