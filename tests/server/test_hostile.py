"""Hostile requests against structured outputs, tools, logprobs and streaming, over HTTP: no 5xx,
nothing constrained is ever loosened (an accepted schema's complete output validates), and the
engine comes out as it went in: one bad request among many constrained ones hurts none of them,
a client leaving mid-stream frees its request, and afterwards the same greedy request gives the
same tokens and /metrics still scrapes."""

from __future__ import annotations

import asyncio
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from schema_suite import SCHEMAS

pytestmark = pytest.mark.e2e
CHAT, COMP = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "Answer in JSON."}]
GREEDY = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
          "max_tokens": 12, "temperature": 0}  # fmt: skip
DEAD_END = 'root ::= "hello" [^\\x00-\\U0010FFFF]'  # a grammar whose path ends in nothing

# JSON Schemas no well-behaved client sends: each is refused (400) or, when accepted, enforced
HOSTILE_SCHEMAS = [
    {"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$ref": "#/$defs/missing"}, {"$ref": "#anchor"}, {"$dynamicRef": "#x"}, {"$recursiveRef": "#"},
    {"type": "string", "minLength": 5, "maxLength": 2}, {"type": "integer", "minimum": 5, "maximum": 2},
    {"type": "array", "minItems": 3, "maxItems": 1}, {"type": "string", "pattern": "(["},
    {"type": "string", "pattern": "(?=a)a"}, {"type": "string", "pattern": "a^b"},
    {"type": "string", "pattern": "(a)\\1"}, {"type": "string", "pattern": "\\p{L}"},
    {"type": "string", "pattern": "a\u0000b"}, {"enum": []}, {"enum": ["a", 1, None, {"x": [1]}]},
    {"enum": [f"v{i}" for i in range(5000)]}, {"type": []}, {"type": "date"}, {"type": 5},
    {"anyOf": []}, {"anyOf": [{"type": "integer"}], "minimum": 3}, {"oneOf": [{"type": "integer"},
    {"type": "number"}]}, {"enum": ["a", "bb"], "type": "string", "maxLength": 1},
    {"const": {"a": [1, 2]}}, {"type": "object", "properties": {"a\u0000": {"type": "integer"}},
    "required": ["a\u0000"]}, {"type": "object", "properties": {f"p{i}": {"type": "integer"} for
    i in range(300)}, "required": ["p0"]}, {"not": {}}, {"if": {}, "then": {}},
    {"type": "object", "required": ["a"], "additionalProperties": False},
    {"type": "number", "multipleOf": 0.1}, {"format": "no-such-format", "type": "string",
    "maxLength": 3}, {"properties": []}, {"items": "x", "type": "array"}, {"required": "a"},
    {"type": "string", "maxLength": 10**12}, {"type": "integer", "minimum": 10**30},
    {"type": "object", "minProperties": 3, "maxProperties": 1}, True, {},
    # no finite value: the way out's shortcut (xgrammar's jump forward) allocated until the
    # engine process was killed
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
]  # fmt: skip


def _nest(depth: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


HOSTILE_SCHEMAS += [_nest(5), _nest(150), _nest(400)]


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.base, timeout=120) as c:
        yield c


def _settle(http: httpx.Client) -> dict:
    """/debug/engine once nothing is in flight (the pool checked for integrity)."""
    deadline = time.monotonic() + 30
    while True:
        r = http.get("/debug/engine")
        assert r.status_code == 200 and r.json()["integrity"] == "ok", r.text
        if r.json()["in_flight"] == 0 or time.monotonic() > deadline:
            return r.json()
        time.sleep(0.1)


def _error(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


def test_hostile_schemas_are_refused_or_enforced_and_leave_the_engine_as_it_was(http):
    """Each schema as a response_format and as a tool's parameters, 8 requests in flight at a
    time (the accepted ones share the engine's steps instead of each running its own)."""
    before = http.post(CHAT, json=GREEDY).json()["choices"][0]["message"]["content"]
    answers = {200: 0, 400: 0}
    cases = []
    for schema in HOSTILE_SCHEMAS:
        fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        cases += [(schema, body) for body in (
            {"messages": USER, "max_tokens": 24, "response_format": fmt},
            {"messages": USER, "max_tokens": 4, "tools": [tool], "tool_choice": "required"})]  # fmt: skip
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda case: http.post(CHAT, json=case[1]), cases))
    for (schema, body), r in zip(cases, replies):
        assert r.status_code in (200, 400), (r.status_code, r.text[:300], schema)
        answers[r.status_code] += 1
        if r.status_code == 400:
            assert _error(r)["param"] in ("response_format.json_schema.schema", "messages",
                                          "tools[0].function.parameters"), r.text  # fmt: skip
            continue
        choice = r.json()["choices"][0]
        if "response_format" in body and choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    assert answers[200] >= 10 and answers[400] >= 30, answers
    assert _settle(http)["in_flight"] == 0
    after = http.post(CHAT, json=GREEDY).json()["choices"][0]["message"]["content"]
    assert after == before
    families = {f.name for f in text_string_to_metric_families(http.get("/metrics").text)}
    assert "pagoda:structured_output_requests" in families, sorted(families)[:20]


def test_a_dead_end_mid_grammar_ends_the_request_with_finite_logprobs(http):
    """After "hello" the grammar allows nothing: the sampler got all -inf, its NaN logprobs
    were a 500 (JSON has no NaN); now the request stops there, and its logprobs are numbers."""
    so = {"grammar": DEAD_END}
    chat = {"messages": USER, "max_tokens": 8, "temperature": 1.0, "logprobs": True,
            "top_logprobs": 2, "structured_outputs": so}  # fmt: skip
    r = http.post(CHAT, json=chat)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "hello" and choice["finish_reason"] == "stop"
    assert all(math.isfinite(t["logprob"]) for t in choice["logprobs"]["content"])
    r = http.post(COMP, json={"prompt": "x", "max_tokens": 8, "logprobs": 3,
                              "structured_outputs": so})  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hello", r.text
    with http.stream("POST", CHAT, json={**chat, "stream": True}) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"error"' not in "".join(lines)


def test_text_forced_forever_runs_to_its_budget(http):
    """A grammar whose forced text never ends killed the engine (its way-out search built that
    text until the OOM killer came); now such a request just runs out of tokens."""
    for so in ({"grammar": 'root ::= "a" root'}, {"regex": "hello(ab)*[^\\x00-\\U0010FFFF]"}):
        r = http.post(CHAT, json={"messages": USER, "max_tokens": 30, "structured_outputs": so})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert http.get("/health").json()["status"] == "ok"


async def test_one_bad_request_among_many_constrained_ones_hurts_none(server):
    """Constrained requests (schemas, tools, streaming or not) with bad ones among them, all at
    once: the good ones' complete outputs validate, the bad ones are 400s."""
    tool = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}  # fmt: skip
    bad = [
        {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#"}}}},
        {"messages": USER, "structured_outputs": {"grammar": 'root ::= root "a"'}},
        {"messages": USER, "tools": [tool], "tool_choice": {"type": "function",
                                                             "function": {"name": "nope"}}},
        {"messages": [*USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "add", "arguments": "[" * 50_000 + "]" * 50_000}}]}]},
        {"messages": USER, "stream": True, "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?!a)."}}}},
    ]  # fmt: skip
    good = [(schema, i % 2 == 0) for i, (_, schema) in enumerate(SCHEMAS[:12])]

    async with httpx.AsyncClient(base_url=server.base, timeout=120) as c:

        async def constrained(schema: dict, stream: bool) -> tuple[str, str]:
            fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
            body = {"messages": USER, "max_tokens": 200, "temperature": 0.7, "seed": 3,
                    "response_format": fmt, "stream": stream}  # fmt: skip
            if not stream:
                r = await c.post(CHAT, json=body)
                assert r.status_code == 200, r.text
                choice = r.json()["choices"][0]
                return choice["message"]["content"], choice["finish_reason"]
            text, finish = "", None
            async with c.stream("POST", CHAT, json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        ch = json.loads(line[6:])["choices"][0]
                        text += ch["delta"].get("content") or ""
                        finish = ch["finish_reason"] or finish
            return text, finish

        async def call_tool() -> dict:
            r = await c.post(CHAT, json={"messages": USER, "max_tokens": 40, "tools": [tool],
                                         "tool_choice": "required"})  # fmt: skip
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]

        tasks = [constrained(s, st) for s, st in good] + [call_tool()]
        tasks += [c.post(CHAT, json=b) for b in bad]
        results = await asyncio.gather(*tasks)
    for (schema, _), (text, finish) in zip(good, results):
        assert finish in ("stop", "length")
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema)
    message = results[len(good)]
    args = json.loads(message["tool_calls"][0]["function"]["arguments"])
    assert set(args) == {"a", "b"}
    for r in results[len(good) + 1 :]:
        assert r.status_code == 400, r.text
        _error(r)


async def test_leaving_mid_stream_of_a_constrained_request_frees_it(server):
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "string"}, "minItems": 50}}, "required": ["items"]}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "long", "schema": schema}}
    body = {"messages": USER, "max_tokens": 400, "response_format": fmt, "stream": True}
    seen = 0
    async with (
        httpx.AsyncClient(base_url=server.base, timeout=60) as c,
        c.stream("POST", CHAT, json=body) as r,
    ):
        async for line in r.aiter_lines():
            seen += line.startswith("data: {")
            if seen == 4:
                break  # the client leaves: the connection closes with the block
    with httpx.Client(base_url=server.base, timeout=60) as http:
        assert _settle(http)["in_flight"] == 0
        fmt["json_schema"]["schema"] = {"type": "object", "properties": {"n": {
            "type": "integer"}}, "required": ["n"]}  # fmt: skip
        r = http.post(CHAT, json={"messages": USER, "max_tokens": 20, "response_format": fmt})
        assert r.status_code == 200, r.text
        assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["n"], int)


def test_a_response_message_sent_back_as_is_is_accepted(http):
    """SDKs send a response's message back whole (`model_dump`): its empty response-only
    fields are dropped; a call's `index` (streamed) is kept out of the way."""
    calls = [{"id": "call_1", "type": "function", "index": 0,
              "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]  # fmt: skip
    messages = [*USER, {"role": "assistant", "content": None, "refusal": None, "audio": None,
                        "function_call": None, "annotations": [], "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}]  # fmt: skip
    r = http.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
