"""Property-based fuzzing of the live server: no request, valid or hostile, gets a 5xx.

Bodies are drawn from the request models' JSON schemas (the ones /openapi.json serves), then
some are made
hostile: a field replaced by deep nesting, a lone surrogate, a huge integer literal, a huge
string, a wrong type or a non-finite float, or the body itself mangled. Every answer must be
below 500 and well-formed, and afterwards the engine's block pool must be intact with nothing
left in flight. JSON Schemas are fuzzed too (`response_format` and `structured_outputs.json`):
refused, or enforced so that every complete output validates. `PAGODA_FUZZ_EXAMPLES` sets the
number of cases per endpoint (default 150; half as many schemas).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pagoda.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from server_testlib import MAX_MODEL_LEN

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EXAMPLES = int(os.environ.get("PAGODA_FUZZ_EXAMPLES", "150"))
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "top_k", "min_p", "n", "stop", "seed", "logprobs", "top_logprobs", "stream",
          "stream_options", "stop_token_ids", "repetition_penalty", "echo", "best_of",
          "min_tokens", "include_stop_str_in_output", "continue_final_message",
          "add_generation_prompt", "chat_template_kwargs"]  # fmt: skip
HOSTILE = [  # raw JSON text of values no well-behaved client sends
    "[" * 3000 + "]" * 3000,
    '{"a":' * 2000 + "1" + "}" * 2000,
    '"\\ud800"',
    '"x\\udfffy"',
    "9" * 5000,
    "-" + "1" * 4400,
    "1e999",
    "-1e999",
    "Infinity",
    "NaN",
    "1e308",
    str(2**70),
    json.dumps("w" * 300_000),
    "null",
    "true",
    "{}",
    "[[[]]]",
    '"5"',
    "-1",
    "0",
]
STATUSES: Counter[int] = Counter()  # every answer's status, reported after the run
RAW_BODIES = [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe{}", b'{"prompt": "x"', b"{}" * 1000]


def _tame(body: dict) -> dict:
    """Keep valid requests short (the point is the answer's status, not long generations)."""
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v < MAX_MODEL_LEN:
            body[key] = min(v, 3)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 3
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 16:
        body["n"] = min(n, 2)
    return body


def from_schema(schema: dict, defs: dict | None = None) -> st.SearchStrategy:
    """Values matching the subset of JSON Schema that pydantic emits for our request models."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        return st.deferred(lambda: from_schema(defs[schema["$ref"].split("/")[-1]], defs))
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs) for s in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        props = {k: from_schema(v, defs) for k, v in schema.get("properties", {}).items()}
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries({k: v for k, v in props.items() if k in required},
                                     optional={k: v for k, v in props.items() if k not in required})  # fmt: skip
    if kind == "array":
        items = from_schema(schema.get("items", {}), defs)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=4)
    scalars = {
        "string": st.text(max_size=40) | st.sampled_from(["Hello", "smollm2-135m", ""]),
        "integer": st.integers(-3, 40) | st.integers(),
        "number": st.floats(-3, 3) | st.floats(allow_nan=False, allow_infinity=False),
        "boolean": st.booleans(),
        "null": st.none(),
    }
    return scalars.get(kind, st.none())


@st.composite
def bodies(draw, model) -> bytes:
    """Schema-valid-ish bodies, a third of them made hostile in one field or as a whole."""
    body = _tame(draw(from_schema(model.model_json_schema())))
    mode = draw(st.sampled_from(["valid", "valid", "field", "field", "raw"]))
    if mode == "valid":
        return json.dumps(body).encode()
    if mode == "raw":
        return draw(st.sampled_from(RAW_BODIES))
    field = draw(st.sampled_from(FIELDS))
    body[field] = "\0PLACEHOLDER\0"
    text = json.dumps(body).replace(json.dumps("\0PLACEHOLDER\0"), draw(st.sampled_from(HOSTILE)))
    return text.encode()


def _check(r: httpx.Response, body: bytes) -> None:
    STATUSES[r.status_code] += 1
    assert r.status_code < 500, (r.status_code, r.text[:300], body[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert len(r.content) < 4000, "echoed values must be truncated"
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    else:
        assert r.json()["choices"], r.text[:300]


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.base, timeout=120) as c:
        yield c


def _fuzz(path: str, model):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("PAGODA_FUZZ_RANDOM"),
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(body=bodies(model))
    def run(http: httpx.Client, body: bytes) -> None:
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
        _check(r, body)

    return run


test_fuzz_completions = _fuzz("/v1/completions", CompletionRequest)
test_fuzz_chat = _fuzz("/v1/chat/completions", ChatCompletionRequest)


# JSON Schemas drawn from the keywords clients use and misuse (wrong types, contradictions,
# references that go nowhere, regexes xgrammar reads loosely): refused, or enforced exactly
_TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array",
                          "date"])  # fmt: skip
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2),
                  st.sampled_from(["a", "bb", "", "x\u0000y"]))  # fmt: skip
_NAMES = st.sampled_from(["a", "b", "c"])
_SCALAR_KEYWORDS = {
    "type": _TYPES | st.lists(_TYPES, max_size=3),
    "enum": st.lists(_LEAF, max_size=4), "const": _LEAF,
    "minimum": st.integers(-3, 3), "maximum": st.integers(-3, 3) | st.just("3"),
    "exclusiveMinimum": st.floats(-2, 2), "multipleOf": st.sampled_from([0, 0.5, 2, 3]),
    "minLength": st.integers(-1, 4), "maxLength": st.integers(0, 4),
    "pattern": st.sampled_from(["[a-z]+", "^a*$", "(?!a).", "a^b", "([", "(a)\\1", "\\d{2}",
                                '^"a*"$', "^x\\\\?y$"]),
    "format": st.sampled_from(["email", "date", "bogus"]),
    "$ref": st.sampled_from(["#", "#/$defs/x", "#foo", "http://x/y"]),
    "title": st.text(max_size=4),
}  # fmt: skip


def _compound(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={
        **_SCALAR_KEYWORDS,
        "properties": st.dictionaries(_NAMES, children, max_size=3),
        "required": st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3),
        "additionalProperties": children, "items": children, "prefixItems": st.lists(children, max_size=2),
        "minItems": st.integers(0, 3), "maxItems": st.integers(0, 3),
        "anyOf": st.lists(children, max_size=3), "oneOf": st.lists(children, max_size=2),
        "allOf": st.lists(children, max_size=2), "$defs": st.dictionaries(st.just("x"), children),
        "not": children, "minProperties": st.integers(0, 2), "uniqueItems": st.booleans(),
    })  # fmt: skip


SCHEMAS = st.recursive(
    st.booleans() | st.fixed_dictionaries({}, optional=_SCALAR_KEYWORDS), _compound, max_leaves=8
)


def _drawn(strategy: st.SearchStrategy, n: int) -> list:
    """The `n` examples @given would draw (derandomized unless PAGODA_FUZZ_RANDOM is set), as a
    list: the schema tests send them 8 at a time, so that the accepted ones share the engine's
    steps instead of each running its 40 tokens alone."""
    out: list = []

    @settings(max_examples=n, deadline=None, derandomize=not os.environ.get("PAGODA_FUZZ_RANDOM"),
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(strategy)
    def collect(example) -> None:
        out.append(example)

    collect()
    return out


def _post_all(http: httpx.Client, bodies_: list[dict]) -> list[httpx.Response]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda body: http.post("/v1/chat/completions", json=body), bodies_))


def test_fuzz_json_schemas_are_refused_or_enforced(http):
    """Whatever the schema, no 5xx; when it is accepted, a complete output validates."""
    cases = _drawn(st.tuples(SCHEMAS, st.sampled_from(["response_format", "structured_outputs"])),
                   max(EXAMPLES // 2, 10))  # fmt: skip
    sent = []
    for schema, where in cases:
        if where == "response_format":
            extra = {"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "s", "schema": schema}}}  # fmt: skip
        else:
            extra = {"structured_outputs": {"json": schema}}
        sent.append({"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 40,
                     "temperature": 0, **extra})  # fmt: skip
    for (schema, _), r in zip(cases, _post_all(http, sent)):
        STATUSES[r.status_code] += 1
        assert r.status_code in (200, 400), (r.status_code, r.text[:300], schema)
        if r.status_code == 400:
            assert r.json()["error"]["param"] in ("response_format.json_schema.schema",
                                                  "structured_outputs.json", "messages"), r.text  # fmt: skip
            continue
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_fuzz_tool_parameters_are_refused_or_enforced(http):
    """A tool whose argument `a` has a drawn schema: no 5xx; a call made under required, a
    named function or a strict tool has arguments that validate."""
    cases = _drawn(st.tuples(SCHEMAS, st.sampled_from(["required", "named", "auto-strict"])),
                   max(EXAMPLES // 4, 10))  # fmt: skip
    sent, params_ = [], []
    for schema, choice in cases:
        params = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        fn = {"name": "f", "parameters": params, "strict": choice == "auto-strict"}
        tool_choice = {"required": "required", "auto-strict": "auto",
                       "named": {"type": "function", "function": {"name": "f"}}}[choice]  # fmt: skip
        sent.append({"messages": [{"role": "user", "content": "Call f."}], "max_tokens": 40,
                     "temperature": 0, "tools": [{"type": "function", "function": fn}],
                     "tool_choice": tool_choice})  # fmt: skip
        params_.append(params)
    for (schema, _), params, r in zip(cases, params_, _post_all(http, sent)):
        STATUSES[r.status_code] += 1
        assert r.status_code in (200, 400), (r.status_code, r.text[:300], schema)
        if r.status_code == 400:
            assert r.json()["error"]["param"] in ("tools[0].function.parameters", "messages"), (
                r.text
            )
            continue
        choice_ = r.json()["choices"][0]
        for call in choice_["message"].get("tool_calls") or ():
            jsonschema.validate(json.loads(call["function"]["arguments"]), params)


def test_engine_intact_after_fuzzing(http):
    """Runs after the fuzz tests (file order): nothing left running, the pool consistent."""
    print(f"fuzz answers by status: {dict(sorted(STATUSES.items()))}")
    deadline = time.monotonic() + 60
    while True:
        r = http.get("/debug/engine")
        assert r.status_code == 200 and r.json()["integrity"] == "ok", r.text
        if r.json()["in_flight"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.json()["in_flight"] == 0 and r.json()["stats"]["num_running"] == 0, r.json()
    ok = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
