"""`pagoda serve --enable-lora --lora-modules ...` on a tiny Llama with peft-written adapters:
`model` picks the adapter (peft's greedy tokens), /v1/models lists adapters under the base, an
unknown name is a 404, adapters load and unload at run time (a bad one is a 400, the server
unharmed), the metrics name the adapters."""

from __future__ import annotations

import sys

import httpx
import pytest
from hf_oracle import hf_greedy_plain
from server_testlib import ROOT, TINY_SERVE, ServerProcess

sys.path.insert(0, str(ROOT / "tests/runtime/lora"))
from lora_testlib import ADAPTERS, make_adapter, make_base

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PROMPT = [5, 17, 42, 9, 88, 3, 61, 27]
STEPS = 5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-serve")
    base = make_base(root / "base")
    refs = {"base": hf_greedy_plain(base, PROMPT, STEPS)[0]}
    for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
        model = make_adapter(base, root / name, r, alpha, targets, rslora, seed=i)
        refs[name] = hf_greedy_plain(model, PROMPT, STEPS)[0]
    assert refs["a1"] != refs["base"] != refs["a2"]
    return root, refs


def _complete(srv: ServerProcess, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": STEPS, "temperature": 0,
            "ignore_eos": True, "logprobs": 0}  # fmt: skip
    return srv.post_json("/v1/completions", body)


def _tokens(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]  # the word-level vocabulary's "wN"
    return [int(t.strip().removeprefix("w")) for t in tokens]


def test_serve_selects_loads_and_unloads_adapters(ckpt):
    root, refs = ckpt
    srv = ServerProcess(
        "--model", str(root / "base"), *TINY_SERVE, "--enable-lora", "--max-loras", "2",
        "--max-lora-rank", "8", "--lora-modules", f"a1={root / 'a1'}",
        env={"PAGODA_ALLOW_RUNTIME_LORA_UPDATING": "true"},
    )  # fmt: skip
    try:
        srv.wait_ready()
        base_name = str(root / "base")
        models = httpx.get(f"{srv.base}/v1/models").json()["data"]
        assert [m["id"] for m in models] == [base_name, "a1"]
        assert models[1]["parent"] == base_name and models[1]["root"] == str(root / "a1")
        assert _tokens(_complete(srv, base_name)) == refs["base"]
        assert _tokens(_complete(srv, "a1")) == refs["a1"]
        r = _complete(srv, "a2")  # not loaded yet
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        bad = srv.post_json("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nope"})
        assert bad.status_code == 400 and "not a LoRA adapter directory" in bad.text
        ok = srv.post_json("/v1/load_lora_adapter",
                           {"lora_name": "a2", "lora_path": str(root / "a2")})  # fmt: skip
        assert ok.status_code == 200, ok.text
        again = srv.post_json("/v1/load_lora_adapter",
                              {"lora_name": "a2", "lora_path": str(root / "a2")})  # fmt: skip
        assert again.status_code == 400
        assert _tokens(_complete(srv, "a2")) == refs["a2"]
        assert _tokens(_complete(srv, "a1")) == refs["a1"]
        metrics = httpx.get(f"{srv.base}/metrics").text
        assert 'pagoda:lora_requests_info{max_lora="2"' in metrics
        gone = srv.post_json("/v1/unload_lora_adapter", {"lora_name": "a2"})
        assert gone.status_code == 200
        assert _complete(srv, "a2").status_code == 404
        assert srv.post_json("/v1/unload_lora_adapter", {"lora_name": "a2"}).status_code == 404
        assert [m["id"] for m in httpx.get(f"{srv.base}/v1/models").json()["data"]] == [
            base_name, "a1"]  # fmt: skip
    finally:
        srv.stop()
