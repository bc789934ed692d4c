"""The server with LoRA adapters (`--enable-lora --lora-modules a1=...`) on a tiny Llama with
PEFT-format adapters, the real engine on its thread and the real app over httpx's ASGI transport:
`model` picks the adapter (the offline engine's tokens with the same adapter: the engine itself
is held to peft in tests/runtime/lora), /v1/models lists adapters under the base, an unknown name
is a 404, adapters load and unload at run time (a bad one is a 400, the server unharmed), the
metrics name the adapters. The checkpoint and adapters are written directly (no transformers, no
peft, no server process: a few seconds)."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.lora_config import LoRAConfig
from pagoda.runtime.server.api import create_app
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.metrics import ServerMetrics
from server_testlib import ROOT

sys.path.insert(0, str(ROOT / "tests/runtime/lora"))
from lora_testlib import ALL, write_adapter, write_llama

PROMPT = [5, 17, 42, 9, 88, 3, 61, 27]
STEPS = 5
ENGINE = dict(dtype="float32", max_lora_rank=8, max_loras=2, kv_cache_memory=4 << 20,
              max_model_len=64, max_num_seqs=4)  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-serve")
    write_llama(root / "base")
    write_adapter(root / "a1", 8, 16, ALL, seed=1)
    write_adapter(root / "a2", 4, 8, ["q_proj", "v_proj", "o_proj", "down_proj"], seed=2)
    llm = LLM(str(root / "base"), enable_lora=True, **ENGINE)
    loras = {"base": None, "a1": LoRARequest("a1", 1, str(root / "a1")),
             "a2": LoRARequest("a2", 2, str(root / "a2"))}  # fmt: skip
    p = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([PROMPT] * 3, p, use_tqdm=False, lora_request=list(loras.values()))
    refs = {name: o.outputs[0].token_ids for name, o in zip(loras, outs)}
    assert refs["a1"] != refs["base"] != refs["a2"]  # the test can tell them apart
    return root, refs


def _complete(client: httpx.AsyncClient, model: str):
    body = {"model": model, "prompt": PROMPT, "max_tokens": STEPS, "temperature": 0,
            "ignore_eos": True, "logprobs": 0}  # fmt: skip
    return client.post("/v1/completions", json=body)


def _tokens(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]  # the word-level vocabulary's "wN"
    return [int(t.strip().removeprefix("w")) for t in tokens]


def test_serve_selects_loads_and_unloads_adapters(ckpt, monkeypatch):
    root, refs = ckpt
    monkeypatch.setenv("PAGODA_ALLOW_RUNTIME_LORA_UPDATING", "true")
    base = str(root / "base")
    lora = LoRAConfig(2, 8, lora_modules=(f"a1={root / 'a1'}",))
    core = EngineCore(EngineConfig.create(base, lora=lora, **ENGINE))

    async def run() -> None:
        m = ServerMetrics("tiny")
        engine = AsyncEngine(lambda: core, observer=m)
        engine.start()
        await asyncio.wait_for(engine.wait_started(), 60)
        app = create_app(ServerConfig(model=base, lora=lora), engine, m)
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                await _checks(c, root, refs, base)
        finally:
            engine.stop()

    asyncio.run(run())
    core.check_integrity()


async def _checks(c: httpx.AsyncClient, root, refs, base: str) -> None:
    models = (await c.get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == [base, "a1"]
    assert models[1]["parent"] == base and models[1]["root"] == str(root / "a1")
    assert (await c.get("/v1/models/a1")).json()["parent"] == base
    assert _tokens(await _complete(c, base)) == refs["base"]
    assert _tokens(await _complete(c, "a1")) == refs["a1"]
    r = await _complete(c, "a2")  # not loaded yet
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    bad = await c.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nope"})
    assert bad.status_code == 400 and "not a LoRA adapter directory" in bad.text
    a2 = {"lora_name": "a2", "lora_path": str(root / "a2")}
    assert (await c.post("/v1/load_lora_adapter", json=a2)).status_code == 200
    assert (await c.post("/v1/load_lora_adapter", json=a2)).status_code == 400  # loaded already
    both = await asyncio.gather(_complete(c, "a2"), _complete(c, "a1"), _complete(c, base))
    assert [_tokens(r) for r in both] == [refs["a2"], refs["a1"], refs["base"]]
    metrics = (await c.get("/metrics")).text
    assert 'pagoda:lora_requests_info{max_lora="2"' in metrics
    assert (await c.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})).status_code == 200
    assert (await _complete(c, "a2")).status_code == 404
    gone = await c.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})
    assert gone.status_code == 404
    assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == [base, "a1"]


def test_load_routes_exist_only_when_allowed(ckpt, monkeypatch):
    """Without PAGODA_ALLOW_RUNTIME_LORA_UPDATING the routes are not there (404, as vLLM)."""
    monkeypatch.delenv("PAGODA_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    from fastapi.testclient import TestClient

    root, _ = ckpt
    app = create_app(ServerConfig(model="m", lora=LoRAConfig()), AsyncEngine(lambda: None),
                     ServerMetrics("m"))  # fmt: skip
    r = TestClient(app).post(
        "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(root)}
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
