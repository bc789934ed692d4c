"""Every kind of bad input gets an OpenAI-style error naming the field, and none of them
disturbs a request that is streaming at the same time."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_testlib import MAX_MODEL_LEN

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
CHAT, COMP = "/v1/chat/completions", "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f"}}
LONG = "word " * 600  # > --max-model-len 512 tokens

# (id, path, body (dict, or raw bytes), status, param)
# fmt: off
CASES = [
    ("malformed-json", COMP, b'{"model": "x", "prompt": ', 400, None),
    ("not-an-object", COMP, b"[1, 2]", 400, None),
    ("missing-prompt", COMP, {"model": MODEL}, 400, "prompt"),
    ("missing-messages", CHAT, {"model": MODEL}, 400, "messages"),
    ("empty-messages", CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
    ("bad-role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("messages-type", CHAT, {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ("max-tokens-type", COMP, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("temperature-type", CHAT, {"messages": MSGS, "temperature": "hot"}, 400, "temperature"),
    ("stream-type", COMP, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("unknown-model", CHAT, {"model": "gpt-9", "messages": MSGS}, 404, "model"),
    ("unknown-model-completion", COMP, {"model": "gpt-9", "prompt": "x"}, 404, "model"),
    ("prompt-too-long", COMP, {"prompt": LONG}, 400, "prompt"),
    ("messages-too-long", CHAT, {"messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("max-tokens-0", COMP, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max-tokens-neg", CHAT, {"messages": MSGS, "max_tokens": -3}, 400, "max_tokens"),
    ("max-completion-tokens-0", CHAT, {"messages": MSGS, "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("temperature-neg", COMP, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("top-p-0", CHAT, {"messages": MSGS, "top_p": 0}, 400, "top_p"),
    ("top-p-above-1", COMP, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("n-0", COMP, {"prompt": "x", "n": 0}, 400, "n"),
    ("n-too-large", CHAT, {"messages": MSGS, "n": 1000}, 400, "n"),
    ("logprobs-too-many", COMP, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("logprobs-negative", COMP, {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    ("top-logprobs-too-many", CHAT, {"messages": MSGS, "logprobs": True, "top_logprobs": 21},
     400, "top_logprobs"),
    ("top-logprobs-without-logprobs", CHAT, {"messages": MSGS, "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("five-stop-strings", COMP, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("stop-type", CHAT, {"messages": MSGS, "stop": 5}, 400, "stop"),
    # hostile input (issue 14): each of these once produced a 5xx or ran for minutes
    ("deep-nesting", COMP, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("deep-nesting-top", CHAT, b"[" * 5000 + b"]" * 5000, 400, None),
    ("lone-surrogate-prompt", COMP, b'{"prompt": "a\\ud800b"}', 400, "prompt"),
    ("lone-surrogate-chat", CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages[0].content"),
    ("huge-int-literal", COMP, b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, None),
    ("temperature-infinity", COMP, b'{"prompt": "x", "temperature": Infinity}', 400,
     "temperature"),
    ("temperature-1e308", CHAT, {"messages": MSGS, "temperature": 1e308}, 400, "temperature"),
    ("temperature-overflow", COMP, b'{"prompt": "x", "temperature": 1e999}', 400, "temperature"),
    ("top-p-nan", COMP, b'{"prompt": "x", "top_p": NaN}', 400, "top_p"),
    ("max-tokens-1e9", COMP, {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ("max-tokens-2-70", CHAT, {"messages": MSGS, "max_tokens": 2**70}, 400, "max_tokens"),
    ("max-tokens-over-context", COMP, {"prompt": "x", "max_tokens": MAX_MODEL_LEN}, 400,
     "max_tokens"),
    ("max-completion-tokens-over-context", CHAT,
     {"messages": MSGS, "max_completion_tokens": MAX_MODEL_LEN}, 400, "max_completion_tokens"),
    ("top-k-2-70", COMP, {"prompt": "x", "top_k": 2**70}, 400, "top_k"),
    ("seed-2-70", COMP, {"prompt": "x", "seed": 2**70}, 400, "seed"),
    ("token-id-2-70", COMP, {"prompt": [1, 2**70]}, 400, "prompt"),
    ("batch-over-queue-bound", COMP, {"prompt": ["x"] * 600}, 400, "prompt"),
    ("prompt-object", COMP, {"prompt": {"a": 1}}, 400, "prompt"),
    ("prompt-empty-array", COMP, {"prompt": []}, 400, "prompt"),  # OpenAI's minItems 1
    ("prompt-empty-token-list", COMP, {"prompt": [[1], []]}, 400, "prompt"),
    ("message-not-object", CHAT, {"messages": [5]}, 400, "messages[0]"),
    # newer features (hostile wave 3): each of these was a 500 or was silently ignored
    ("tool-call-arguments-deep", CHAT, {"messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 50_000 +
         "]" * 50_000}}]}]}, 400, "messages"),
    ("stream-options-without-stream", CHAT,
     {"messages": MSGS, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("json-schema-with-type-text", CHAT, {"messages": MSGS, "response_format": {
        "type": "text", "json_schema": {"name": "a", "schema": {"type": "integer"}}}}, 400,
     "response_format.json_schema"),
    ("json-schema-with-json-object", COMP, {"prompt": "x", "response_format": {
        "type": "json_object", "json_schema": {"name": "a", "schema": {}}}}, 400,
     "response_format.json_schema"),
    ("parallel-tool-calls-without-tools", CHAT, {"messages": MSGS, "parallel_tool_calls": False},
     400, "parallel_tool_calls"),
    ("max-tokens-disagree", CHAT, {"messages": MSGS, "max_tokens": 2, "max_completion_tokens": 5},
     400, "max_completion_tokens"),
    ("logit-bias-over-100", COMP, {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("logit-bias-nan", COMP, b'{"prompt": "x", "logit_bias": {"5": NaN}}', 400, "logit_bias"),
    ("whitespace-on-a-regex", CHAT, {"messages": MSGS, "structured_outputs": {
        "regex": "a+", "disable_any_whitespace": False}}, 400,
     "structured_outputs.disable_any_whitespace"),
    ("grammar-allows-nothing", CHAT, {"messages": MSGS, "structured_outputs": {
        "grammar": 'root ::= root "a"'}}, 400, "structured_outputs.grammar"),
    ("regex-allows-nothing", COMP, {"prompt": "x", "structured_outputs": {
        "regex": "[^\\x00-\\U0010FFFF]"}}, 400, "structured_outputs.regex"),
    ("schema-name-pattern", CHAT, {"messages": MSGS, "response_format": {"type": "json_schema",
        "json_schema": {"name": "my schema", "schema": {"type": "integer"}}}}, 400,
     "response_format.json_schema.name"),
    ("pattern-lookahead", CHAT, {"messages": MSGS, "response_format": {"type": "json_schema",
        "json_schema": {"name": "a", "schema": {"type": "string", "pattern": "(?!a)."}}}}, 400,
     "response_format.json_schema.schema"),
    ("schema-anchor-ref", CHAT, {"messages": MSGS, "structured_outputs": {"json": {
        "$defs": {"a": {"$anchor": "f", "type": "integer"}}, "$ref": "#f"}}}, 400,
     "structured_outputs.json"),
    ("schema-enum-beside-type", CHAT, {"messages": MSGS, "structured_outputs": {"json": {
        "enum": ["a"], "type": "integer"}}}, 400, "structured_outputs.json"),
    ("json-schema-false", CHAT, {"messages": MSGS, "structured_outputs": {"json": False}}, 400,
     "structured_outputs.json"),
    ("message-unknown-field", CHAT, {"messages": [{"role": "user", "content": "hi", "foo": 1}]},
     400, "messages[0].foo"),
    ("tool-message-without-call-id", CHAT, {"messages": [*MSGS, {"role": "tool", "content": "1"}]},
     400, "messages[1].tool_call_id"),
    ("user-message-without-content", CHAT, {"messages": [{"role": "user"}]}, 400,
     "messages[0].content"),
    ("system-message-null-content", CHAT, {"messages": [{"role": "system", "content": None},
        *MSGS]}, 400, "messages[0].content"),
    ("tool-call-without-id", CHAT, {"messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, 400,
     "messages[1].tool_calls[0].id"),
    ("tool-calls-in-a-user-message", CHAT, {"messages": [{"role": "user", "content": "x",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}]}, 400,
     "messages[0].tool_calls"),
    ("refusal-sent-back", CHAT, {"messages": [*MSGS, {"role": "assistant", "content": "no",
        "refusal": "I will not"}]}, 400, "messages[1].refusal"),
    # the SDK's `parsed` copy is dropped from an assistant message only
    ("parsed-in-a-user-message", CHAT, {"messages": [{"role": "user", "content": "{}",
        "parsed": {}}]}, 400, "messages[0].parsed"),
    # a stop token the model cannot produce would never stop anything
    ("stop-token-id-outside-vocab", COMP, {"prompt": "x", "max_tokens": 1,
        "stop_token_ids": [49152]}, 400, "stop_token_ids"),
    # OpenAI's rule: a tool message answers a call of an earlier assistant message
    ("tool-message-answers-no-call", CHAT, {"messages": [*MSGS, {"role": "tool",
        "tool_call_id": "call_9", "content": "1"}]}, 400, "messages[1].tool_call_id"),
    ("tool-call-id-on-a-user-message", CHAT, {"messages": [{"role": "user", "content": "x",
        "tool_call_id": "c"}]}, 400, "messages[0].tool_call_id"),
    ("reasoning-on-a-user-message", CHAT, {"messages": [{"role": "user", "content": "x",
        "reasoning_content": "r"}]}, 400, "messages[0].reasoning_content"),
    # SmolLM2's template writes no names: a name would be dropped
    ("name-the-template-drops", CHAT, {"messages": [{"role": "user", "content": "x",
        "name": "bob"}]}, 400, "messages[0].name"),
    ("obfuscation-asked", CHAT, {"messages": MSGS, "stream": True,
        "stream_options": {"include_obfuscation": True}}, 400, "stream_options.include_obfuscation"),
    # bans that always hold leaving none of allowed_token_ids: token 0 was drawn, outside them
    ("allowed-all-bad-words", COMP, {"prompt": "x", "max_tokens": 2,
        "allowed_token_ids": [28120, 33662], "bad_words": ["hello"]}, 400, "allowed_token_ids"),
    ("allowed-all-stops-with-min-tokens", COMP, {"prompt": "x", "max_tokens": 3,
        "allowed_token_ids": [2], "min_tokens": 2}, 400, "allowed_token_ids"),
    ("tool-parameters-not-object", CHAT, {"messages": MSGS, "tools": [{"type": "function",
        "function": {"name": "f", "parameters": {"type": "string"}}}]}, 400,
     "tools[0].function.parameters"),
    # tool errors name the field and carry a code, as the other 400s (they had code null)
    ("tool-name-with-a-space", CHAT, {"messages": MSGS, "tools": [{"type": "function",
        "function": {"name": "a b"}}]}, 400, "tools[0].function.name"),
    ("tool-name-twice", CHAT, {"messages": MSGS, "tools": [TOOL, TOOL]}, 400,
     "tools[1].function.name"),
    ("tool-choice-names-no-tool", CHAT, {"messages": MSGS, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, 400, "tool_choice.function.name"),
    ("tool-choice-required-with-a-format", CHAT, {"messages": MSGS, "tools": [TOOL],
        "tool_choice": "required", "response_format": {"type": "json_object"}}, 400,
     "tool_choice"),
    ("tool-parameters-lookahead", CHAT, {"messages": MSGS, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "string", "pattern": "(?=a)a"}}}}}]}, 400,
     "tools[0].function.parameters"),
    ("best-of-other-than-n", COMP, {"prompt": "x", "best_of": 2}, 400, "best_of"),
    ("format-and-structured-outputs", CHAT, {"messages": MSGS, "response_format": {
        "type": "json_object"}, "structured_outputs": {"regex": "a"}}, 400,
     "structured_outputs"),
]
# fmt: on


def send(client: httpx.Client, path: str, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


def check_error(r: httpx.Response, status: int, param: str | None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert len(r.content) < 2000, "client values are echoed truncated"
    assert err["param"] == param and err["message"]
    assert err["code"], "every refusal carries a code (OpenAI's, or vLLM's where it has none)"
    if param:
        assert param.split("[")[0].split(".")[0] in err["message"] or status == 404


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.base, timeout=60) as c:
        yield c


@pytest.mark.parametrize(("path", "body", "status", "param"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_input(http, path, body, status, param):
    check_error(send(http, path, body), status, param)


async def test_bad_inputs_do_not_disturb_a_stream(server):
    async with httpx.AsyncClient(base_url=server.base, timeout=120) as client:
        body = {"model": MODEL, "prompt": "Rivers carve valleys", "max_tokens": 24,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip

        async def stream() -> list[str]:
            async with client.stream("POST", COMP, json=body) as r:
                assert r.status_code == 200
                return [line async for line in r.aiter_lines() if line.startswith("data: ")]

        task = asyncio.ensure_future(stream())
        for _, path, bad, status, param in CASES:
            content = bad if isinstance(bad, bytes) else json.dumps(bad).encode()
            r = await client.post(path, content=content)
            check_error(r, status, param)
        lines = await task
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 24
    assert json.loads(lines[-3][6:])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("path", "api"),
    [("/v1/embeddings", "Embeddings"), ("/v1/rerank", "Rerank"), ("/v2/rerank", "Rerank"),
     ("/score", "Score"), ("/classify", "Classification"), ("/v1/audio/transcriptions", "Audio")],
)  # fmt: skip
def test_unserved_openai_api_is_named(http, path, api):
    """vLLM's answer for a generative model: a 400 naming the API, not a bare 404 (the pooling
    APIs' too, whatever the body)."""
    r = send(http, path, {"model": MODEL, "input": "x"})
    check_error(r, 400, None)
    assert r.json()["error"]["code"] == "unsupported_api"
    assert r.json()["error"]["message"].startswith(f"The model does not support the {api} API: "
                                                   "this server runs generative models")  # fmt: skip


def test_unknown_path_is_an_openai_error(http):
    r = send(http, "/v1/nope", {})
    check_error(r, 404, None)
    assert "POST /v1/nope" in r.json()["error"]["message"]
    assert http.get(COMP).status_code == 405 and http.get(COMP).json()["error"]["code"]


def test_empty_messages_is_openais_empty_array(http):
    """OpenAI's answer to `messages: []` (its minItems 1): code `empty_array`, param messages."""
    r = send(http, CHAT, {"model": MODEL, "messages": []})
    check_error(r, 400, "messages")
    assert r.json()["error"]["code"] == "empty_array"


def test_huge_model_name_is_not_echoed_in_full(http):
    r = send(http, COMP, {"model": "m" * 1_000_000, "prompt": "x"})
    check_error(r, 404, "model")
    assert len(r.content) < 1000 and "more characters" in r.json()["error"]["message"]


def test_escaped_surrogate_pair_is_valid(http):
    """A pair of surrogate escapes is one valid character (U+10000), not a lone surrogate."""
    r = send(http, COMP, b'{"prompt": "\\ud800\\udc00", "max_tokens": 2, "stop_token_ids": [1]}')
    assert r.status_code == 200, r.text


def test_without_max_tokens_completions_get_16_and_chat_what_fits(http):
    """No max_tokens: completions default to 16 (OpenAI's legacy default, vLLM's), so a prompt
    leaving fewer is refused naming max_tokens as vLLM refuses it; chat generates up to the end
    of the context (vLLM's default there)."""
    prompt = [1000] * (MAX_MODEL_LEN - 7)
    check_error(send(http, COMP, {"prompt": prompt, "ignore_eos": True}), 400, "max_tokens")
    r = send(http, COMP, {"prompt": prompt[:20], "ignore_eos": True, "max_tokens": None})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = send(http, CHAT, {"messages": [{"role": "user", "content": "word " * 470}],
                          "ignore_eos": True})  # fmt: skip
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert 0 < usage["completion_tokens"] < 100 and usage["total_tokens"] == MAX_MODEL_LEN
    assert r.json()["choices"][0]["finish_reason"] == "length"
