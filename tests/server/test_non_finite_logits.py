"""A request whose logits turn non-finite mid-generation (a row poisoned with NaN by the runner's
`logits_hook`, then sampled by the real sampler) gets a 500 with an OpenAI-style body, or, when
streamed, an error event and `[DONE]`; a request beside it in the same batches is answered 200.
The real engine (embedded model) on its thread, the real app, over httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics

BAD = [2, 17, 9, 80]  # the prompt whose row is poisoned at its third token
GOOD = [1, 504, 3295]


@pytest.fixture(scope="module")
def core():
    from pagoda.runtime.config import EngineConfig

    c = EngineCore(EngineConfig.create("smollm2-135m", max_model_len=256,
                                       kv_cache_memory=16 << 20))  # fmt: skip

    def poison(reqs, logits):
        for i, r in enumerate(reqs):
            if r.prompt_token_ids == BAD and r.num_output_tokens == 2:
                with torch.inference_mode():
                    logits[i] = float("nan")

    c.runner.logits_hook = poison
    return c


async def _serve(core, calls):
    m = ServerMetrics("smol")
    engine = AsyncEngine(lambda: core, observer=m)
    engine.start()
    await asyncio.wait_for(engine.wait_started(), 30)
    app = create_app(ServerConfig(model="smollm2-135m"), engine, m)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await asyncio.gather(*(call(client) for call in calls))
    finally:
        engine.stop()


def _body(prompt, **kw):
    return {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **kw}


def test_non_finite_logits_are_a_500_and_the_batch_mate_is_served(core):
    async def post(client, prompt):
        return await client.post("/v1/completions", json=_body(prompt))

    bad, good = asyncio.run(_serve(core, [lambda c: post(c, BAD), lambda c: post(c, GOOD)]))
    assert bad.status_code == 500, bad.text
    err = bad.json()["error"]
    assert err["code"] == "non_finite_logits" and "non-finite logits" in err["message"]
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["finish_reason"] == "length"
    assert good.json()["usage"]["completion_tokens"] == 6
    core.check_integrity()
    assert not core.has_unfinished_requests()


def test_a_streamed_request_gets_an_error_event_then_done(core):
    async def stream(client, prompt):
        async with client.stream("POST", "/v1/completions",
                                 json=_body(prompt, stream=True)) as r:  # fmt: skip
            return r.status_code, [line async for line in r.aiter_lines() if line]

    (code, bad), (_, good) = asyncio.run(
        _serve(core, [lambda c: stream(c, BAD), lambda c: stream(c, GOOD)])
    )
    assert code == 200  # the headers went out before the logits turned
    assert bad[-1] == "data: [DONE]"
    last = json.loads(bad[-2].removeprefix("data: "))
    assert last["error"]["code"] == "non_finite_logits"
    texts = [json.loads(e.removeprefix("data: "))["choices"][0] for e in bad[:-2]]
    assert "".join(t["text"] for t in texts)  # the text of the two tokens before it
    assert all(t["finish_reason"] is None for t in texts)
    assert good[-1] == "data: [DONE]"
    assert json.loads(good[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
