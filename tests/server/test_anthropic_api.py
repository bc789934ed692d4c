"""`/v1/messages` through the `anthropic` SDK against the session's `pagoda serve` (the embedded
SmolLM2): a message is the chat completion of the same messages (greedy text and token counts),
whole and streamed (Anthropic's events, each with its `event:` line; the SDK's stream helper),
with a system prompt, a prefill continued, a tool call round trip, stop_sequences,
`/v1/messages/count_tokens`, and Anthropic's error body for each request refused."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
ASK = "What is the capital of France?"
SYSTEM = "Answer in one sentence."
TOOL = {"name": "add", "description": "Add two integers",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"},
                                                          "b": {"type": "integer"}},
                         "required": ["a", "b"]}}  # fmt: skip
CHAT_TOOL = {"type": "function", "function": {"name": "add", "description": TOOL["description"],
                                              "parameters": TOOL["input_schema"]}}  # fmt: skip


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)


def create(claude, messages, max_tokens=12, **kw):
    return claude.messages.create(model=MODEL, max_tokens=max_tokens, messages=messages,
                                  extra_body={"temperature": 0, **kw.pop("extra_body", {})},
                                  **kw)  # fmt: skip


def stream(claude, messages, max_tokens=12, **kw):
    """The SDK's stream helper, greedy (the SDK's methods take no `temperature` any more:
    Anthropic's API does, and older clients send it)."""
    return claude.messages.stream(model=MODEL, max_tokens=max_tokens, messages=messages,
                                  extra_body={"temperature": 0}, **kw)  # fmt: skip


def chat(client, messages, max_tokens=12, **kw):
    return client.chat.completions.create(model=MODEL, temperature=0, max_tokens=max_tokens,
                                          messages=messages, **kw)  # fmt: skip


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_a_message_is_the_chat_completion_of_its_messages(claude, client):
    m = create(claude, [{"role": "user", "content": ASK}], system=SYSTEM)
    c = chat(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}])
    assert m.id.startswith("msg_") and (m.type, m.role, m.model) == ("message", "assistant", MODEL)
    assert text_of(m) == c.choices[0].message.content and "Paris" in text_of(m)
    assert [b.type for b in m.content] == ["text"]
    want = {"stop": "end_turn", "length": "max_tokens"}[c.choices[0].finish_reason]
    assert (m.stop_reason, m.stop_sequence) == (want, None)
    u = m.usage
    assert u.input_tokens + u.cache_read_input_tokens == c.usage.prompt_tokens
    assert u.output_tokens == c.usage.completion_tokens
    # the same prompt again: read from the prefix cache, counted apart (Anthropic's usage)
    again = create(claude, [{"role": "user", "content": ASK}],
                   system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}])  # fmt: skip
    assert text_of(again) == text_of(m) and again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == c.usage.prompt_tokens


def test_max_tokens_stops_the_message(claude):
    m = create(claude, [{"role": "user", "content": ASK}], max_tokens=3)
    assert (m.stop_reason, m.usage.output_tokens) == ("max_tokens", 3)


def test_the_stream_sends_anthropics_events_and_the_whole_message(claude, server):
    ask = [{"role": "user", "content": ASK}]
    whole = create(claude, ask)
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0, "messages": ask, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/messages", json=body, timeout=60) as r:
        frames = r.read().decode().strip().split("\n\n")
    events = []
    for frame in frames:  # each event's `event:` line names its data's type
        head, data = frame.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {events[-1]['type']}"
    kinds = [e["type"] for e in events]
    deltas = kinds.count("content_block_delta")
    assert deltas >= 1 and kinds == ["message_start", "ping", "content_block_start",
                                     *["content_block_delta"] * deltas, "content_block_stop",
                                     "message_delta", "message_stop"]  # fmt: skip
    assert "".join(e["delta"]["text"] for e in events[3:-3]) == text_of(whole)
    assert events[-2]["delta"]["stop_reason"] == whole.stop_reason
    with stream(claude, ask) as s:
        assert "".join(s.text_stream) == text_of(whole)
        final = s.get_final_message()
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens  # fmt: skip


def test_a_prefill_is_continued_as_chat_continues_it(claude, client):
    prefill = [{"role": "user", "content": ASK}, {"role": "assistant", "content": "The capital"}]
    m = create(claude, prefill)
    c = chat(client, prefill, extra_body={"continue_final_message": True,
                                          "add_generation_prompt": False})  # fmt: skip
    assert text_of(m) == c.choices[0].message.content


def test_stop_sequences_end_the_message(claude, client):
    ask = [{"role": "user", "content": ASK}]
    full = text_of(create(claude, ask))
    word = full.split()[2]  # a word the greedy reply writes
    m = create(claude, ask, stop_sequences=["@@never@@", word])
    c = chat(client, ask, stop=["@@never@@", word])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", word)
    assert text_of(m) == c.choices[0].message.content == full[: full.index(word)]


def test_a_tool_call_round_trip(claude, client):
    ask = [{"role": "user", "content": "What is 2 + 3?"}]
    kw = {"tools": [TOOL], "tool_choice": {"type": "any"}}
    m = create(claude, ask, max_tokens=40, **kw)
    (call,) = m.content
    assert (m.stop_reason, call.type, call.name) == ("tool_use", "tool_use", "add")
    assert set(call.input) == {"a", "b"}
    with stream(claude, ask, max_tokens=40, **kw) as s:
        streamed = s.get_final_message()
    assert [(b.type, b.name, b.input) for b in streamed.content] == [
        ("tool_use", "add", call.input)
    ]
    assert streamed.stop_reason == "tool_use"
    # the result goes back; the reply is chat's to the same messages
    back = create(claude, [*ask, {"role": "assistant", "content": m.content},
                           {"role": "user", "content": [{"type": "tool_result",
                                                         "tool_use_id": call.id, "content": "5"}]}],
                  max_tokens=16, tools=[TOOL])  # fmt: skip
    want = chat(client, [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": "add", "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "5"}],
        max_tokens=16, tools=[CHAT_TOOL]).choices[0].message  # fmt: skip
    got = [(b.name, b.input) for b in back.content if b.type == "tool_use"]
    assert (text_of(back) or None, got) == (
        want.content or None, [(t.function.name, json.loads(t.function.arguments))
                               for t in want.tool_calls or ()])  # fmt: skip


def test_output_config_format_holds_the_reply_to_a_schema(claude, client):
    ask = [{"role": "user", "content": ASK}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    m = create(claude, ask, max_tokens=20,
               output_config={"format": {"type": "json_schema", "schema": schema}})  # fmt: skip
    spec = {"name": "output", "schema": schema, "strict": True}
    c = chat(client, ask, max_tokens=20,
             response_format={"type": "json_schema", "json_schema": spec})  # fmt: skip
    assert text_of(m) == c.choices[0].message.content
    assert m.stop_reason == "end_turn" and set(json.loads(text_of(m))) == {"city"}
    parsed = claude.messages.parse(
        model=MODEL, max_tokens=20, messages=ask, output_format=City, extra_body={"temperature": 0}
    )  # the SDK's own schema
    assert isinstance(parsed.parsed_output, City) and parsed.stop_reason == "end_turn"


class City(BaseModel):
    city: str


def test_count_tokens_is_the_prompt_a_message_runs(claude):
    ask = [{"role": "user", "content": ASK}]
    counted = claude.messages.count_tokens(model=MODEL, messages=ask, system=SYSTEM, tools=[TOOL])
    m = create(claude, ask, max_tokens=1, system=SYSTEM, tools=[TOOL])
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def user(*blocks):
    return {"messages": [{"role": "user", "content": list(blocks)}]}


REFUSED = [
    ({"max_tokens": None}, "max_tokens"),
    ({"container": "c"}, "container"),
    ({"output_config": {"effort": "low"}}, "output_config.effort"),  # no such template variable
    ({"temperature": 1.5}, "temperature"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    (
        user(
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "x"},
            }
        ),
        "document",
    ),
    (
        user(
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            }
        ),
        "image",
    ),
    (user({"type": "tool_result", "tool_use_id": "t9", "content": "5"}), "tool_use_id"),
]


@pytest.mark.parametrize(("fields", "named"), REFUSED)
def test_a_refused_request_is_a_400_with_anthropics_body(server, fields, named):
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": ASK}],
            **fields}  # fmt: skip
    r = server.post_json("/v1/messages", {k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    error = r.json()
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and named in error["error"]["message"]


def test_the_sdk_raises_anthropics_errors(claude):
    with pytest.raises(anthropic.BadRequestError) as bad:
        create(claude, [{"role": "user", "content": ASK}], extra_body={"top_k": "x"})
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="claude-nope", max_tokens=4,
                               messages=[{"role": "user", "content": ASK}])  # fmt: skip
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=MODEL, messages=[])
