"""vLLM's tokenizer endpoints over HTTP, asked as lm-evaluation-harness 0.4.13's remote tokenizer
asks (`lm_eval.utils.RemoteTokenizer` / `check_remote_tokenizer_support`: its default
`tokenizer_backend=auto` uses them when `/tokenizer_info` has `eos_token` and `/tokenize` returns
`tokens`), against transformers' tokenizer of the same tiny checkpoint; and the 400s."""

from __future__ import annotations

import httpx
import pytest
from hf_oracle import make_tiny_llama
from server_testlib import ServerProcess

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(path)
    srv = ServerProcess("--model", str(path), "--device", "cpu", "--dtype", "float32",
                        "--kv-cache-memory", "8MiB", "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        yield transformers.AutoTokenizer.from_pretrained(path), srv
    finally:
        srv.stop()


def test_lm_eval_remote_tokenizer_probe_and_calls(tiny):
    hf, srv = tiny
    info = httpx.get(f"{srv.base}/tokenizer_info", timeout=30)
    assert info.status_code == 200, info.text
    info = info.json()
    assert info["eos_token"] == "w2" and info["bos_token"] == "w1" and info["pad_token"] is None
    assert info["chat_template"].startswith("{% for m in messages %}")
    text = "w5 w17 w299 w0"
    r = httpx.post(f"{srv.base}/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    ids = hf(text, add_special_tokens=False).input_ids
    assert r.json()["tokens"] == ids and r.json()["count"] == len(ids)
    assert r.json()["max_model_len"] == 512
    r = httpx.post(f"{srv.base}/detokenize", json={"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": hf.decode(ids)}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [5, 300]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/tokenize", {"prompt": "w5", "messages": []}, "prompt"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": [{"role": "nobody", "content": "w5"}]}, "messages[0].role"),
        ("/tokenize", {"messages": "w5"}, "messages"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 3},
            "max_tokens",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "w5"}], "chat_template_kwargs": {"nope": 1}},
            "chat_template_kwargs.nope",
        ),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "w5", "model": "nope"}, "model"),
    ],
)
def test_bad_tokenizer_requests(tiny, path, body, param):
    r = httpx.post(f"{tiny[1].base}{path}", json=body, timeout=30)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_chat_messages_are_what_chat_completions_feeds_the_engine(tiny):
    """vLLM's `TokenizeChatRequest`: the rendered conversation's ids, as transformers'
    `apply_chat_template(tokenize=True)` gives them and as many as a chat request's
    `usage.prompt_tokens`; `return_token_strs` as `convert_ids_to_tokens` (both forms)."""
    hf, srv = tiny
    messages = [{"role": "system", "content": "w7 w8"}, {"role": "user", "content": "w10 w299"}]
    r = httpx.post(f"{srv.base}/tokenize", json={"messages": messages, "return_token_strs": True})
    assert r.status_code == 200, r.text
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = getattr(ids, "input_ids", ids)
    assert r.json() == {"count": len(ids), "max_model_len": 512, "tokens": ids,
                        "token_strs": hf.convert_ids_to_tokens(ids)}  # fmt: skip
    chat = httpx.post(f"{srv.base}/v1/chat/completions", timeout=60,
                      json={"messages": messages, "max_tokens": 1})  # fmt: skip
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == len(ids), chat.text
    r = httpx.post(f"{srv.base}/tokenize", json={"prompt": "w5 w6", "return_token_strs": True})
    assert r.json()["token_strs"] == ["w5", "w6"]
    long = " ".join(["w9"] * 600)  # counted, not refused (vLLM's too): the count says it
    r = httpx.post(f"{srv.base}/tokenize", json={"prompt": long}, timeout=30)
    assert r.status_code == 200 and r.json()["count"] == 600, r.text


def test_tool_choice_shapes_the_chat_prompt_as_chat_completions_does(tiny):
    """`tool_choice` is taken (`none` leaves the tool prompt out where Pagoda writes it): the
    count is a chat request's `usage.prompt_tokens` with the same tool fields."""
    srv = tiny[1]
    messages = [{"role": "user", "content": "w10 w299"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    counts = {}
    for choice in ("none", "required"):
        fields = {"messages": messages, "tools": [tool], "tool_choice": choice}
        r = httpx.post(f"{srv.base}/tokenize", json=fields, timeout=30)
        assert r.status_code == 200, r.text
        counts[choice] = r.json()["count"]
    # ("required" is not asked of chat: this vocabulary cannot write the call grammar's text)
    chat = httpx.post(
        f"{srv.base}/v1/chat/completions",
        timeout=60,
        json={"messages": messages, "tools": [tool], "tool_choice": "none", "max_tokens": 1},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == counts["none"]
    plain = httpx.post(f"{srv.base}/tokenize", json={"messages": messages}, timeout=30).json()
    assert counts["none"] == plain["count"] < counts["required"]
