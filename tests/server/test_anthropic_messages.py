"""The Messages API's parts without a server: blocks → chat messages (and chat's errors named by
this API's fields), `thinking` → the template's switch, the stream's block events from chat's
deltas, stop reasons and usage, Anthropic's error body, and hostile bodies (a 400, never
anything else)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pagoda.runtime.server.anthropic_input import chat_request, messages_error
from pagoda.runtime.server.anthropic_output import StreamBlocks, content_blocks, stop_of, usage_of
from pagoda.runtime.server.anthropic_protocol import (
    CountTokensRequest,
    MessagesRequest,
    error_shape,
)
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.request_body import parse_request

SWITCH = frozenset({"enable_thinking"})


def parse(model=MessagesRequest, **body):
    base = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    if model is CountTokensRequest:
        del base["max_tokens"]
    return parse_request(json.dumps({**base, **body}).encode(), model)


def refused(**body) -> APIError:
    with pytest.raises(APIError) as e:
        parse(**body)
    assert e.value.status == 400
    return e.value


def test_blocks_become_chat_messages():
    req = parse(system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "source": {
            "type": "url", "url": "http://x/i.png"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": ""},
            {"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}},
            {"type": "tool_use", "id": "t2", "name": "add", "input": {"a": 2}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "1"},
            {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
             "content": [{"type": "text", "text": "no"}]},
            {"type": "text", "text": "go on"}]},
    ], tools=[{"name": "add", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"], metadata={"user_id": "u1"}, top_k=5)  # fmt: skip
    chat, origins = chat_request(req, frozenset(), False)
    messages = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert origins == ["system", "messages[0]", "messages[1]", "messages[2]", "messages[2]",
                       "messages[2]"]  # fmt: skip
    assert messages[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "http://x/i.png"},
    }
    assert (messages[2]["content"], messages[2]["reasoning_content"]) == ("Let me add.", "hm")
    assert [c["function"]["arguments"] for c in messages[2]["tool_calls"]] == ['{"a": 1}',
                                                                              '{"a": 2}']  # fmt: skip
    assert (messages[3]["content"], messages[4]["content"]) == ("1", "Error: no")
    assert (chat.tool_choice, chat.parallel_tool_calls, chat.stop, chat.user, chat.top_k) == (
        "required", False, ["END"], "u1", 5)  # fmt: skip
    assert chat.tools[0].function.parameters == {"type": "object"}
    assert not chat.continue_final_message


def test_output_config_is_chats_response_format_and_effort():
    schema = {"type": "object"}
    req = parse(output_config={"format": {"type": "json_schema", "schema": schema},
                               "effort": "low"})  # fmt: skip
    chat, _ = chat_request(req, frozenset(), False)
    spec = chat.response_format.json_schema
    assert (chat.response_format.type, spec.schema_, spec.strict) == ("json_schema", schema, True)
    assert chat.reasoning_effort == "low"
    req = parse(output_config={"effort": "max"})
    with pytest.raises(APIError) as e:
        chat_request(req, frozenset(), False)
    assert e.value.param == "output_config.effort"


def test_a_last_assistant_message_is_continued():
    req = parse(messages=[{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello"}])  # fmt: skip
    chat, _ = chat_request(req, frozenset(), False)
    assert chat.continue_final_message and not chat.generation_prompt
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    req = parse(messages=[{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": [call]}])  # fmt: skip
    with pytest.raises(APIError, match="continued"):
        chat_request(req, frozenset(), False)


@pytest.mark.parametrize(("thinking", "variables", "reasoning", "switch"), [
    ({"type": "adaptive"}, SWITCH, True, True),
    ({"type": "enabled", "budget_tokens": 1024}, SWITCH, True, True),
    ({"type": "disabled"}, SWITCH, True, False),
    ({"type": "adaptive"}, frozenset(), True, None),
    ({"type": "disabled"}, frozenset(), False, None),
    ({"type": "enabled", "budget_tokens": 1024}, frozenset(), False, "400"),
    ({"type": "disabled"}, frozenset(), True, "400"),
])  # fmt: skip
def test_thinking_is_the_templates_switch(thinking, variables, reasoning, switch):
    req = parse(thinking=thinking, max_tokens=2000)
    if switch == "400":
        with pytest.raises(APIError) as e:
            chat_request(req, variables, reasoning)
        assert e.value.status == 400 and e.value.param.startswith("thinking")
        return
    chat, _ = chat_request(req, variables, reasoning)
    want = None if switch is None else {"enable_thinking": switch}
    assert chat.chat_template_kwargs == want


@pytest.mark.parametrize(("body", "named"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "budget_tokens"),  # >= max_tokens
    ({"thinking": {"type": "adaptive", "display": "omitted"}}, "thinking.display"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "auto"}}, "tool_choice"),  # no tools
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                 "input": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                    "content": [{"type": "image"}]}]}]}, "messages[0].content[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": [{"type": "text", "text": "x",
                    "citations": [{"type": "char_location"}]}]}]}, "citations"),
    ({"mcp_servers": []}, "mcp_servers"),
])  # fmt: skip
def test_what_is_not_honoured_is_a_400_naming_it(body, named):
    assert named in (refused(**body).param or "")


def test_count_tokens_takes_no_sampling_fields():
    assert parse(CountTokensRequest).model == "m"
    with pytest.raises(APIError, match="max_tokens"):
        parse(CountTokensRequest, max_tokens=8)


def test_chats_errors_name_this_apis_fields():
    e = APIError(400, "messages[3]: a message with role 'tool' must answer a tool call; "
                 "tools[0].function.parameters is bad", param="messages[3].tool_call_id")  # fmt: skip
    out = messages_error(e, ["system", "messages[0]", "messages[1]", "messages[1]"])
    assert out.param == "messages[1].tool_use_id"
    assert out.message == ("messages[1].tool_use_id: messages[1]: a tool_result block must "
                           "answer a tool_use; tools[0].input_schema is bad")  # fmt: skip


def test_the_stream_opens_a_block_per_kind_and_call():
    s = StreamBlocks()
    events = s.feed({"reasoning": "th", "content": None})
    events += s.feed({"reasoning": "ink"})
    events += s.feed({"content": "Hi"})
    events += s.feed(
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a'}}]}
    )
    events += s.feed({"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]})
    events += s.close()
    shape = [(e["type"], e["index"], (e.get("delta") or e.get("content_block") or {})["type"]
              if e["type"] != "content_block_stop" else None) for e in events]  # fmt: skip
    assert shape == [
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None), ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
    ]  # fmt: skip
    assert events[7]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    assert s.close() == [] and StreamBlocks().close() == []


def test_a_whole_reply_is_the_same_blocks():
    message = {"reasoning": "think", "content": "Hi", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"a'}}]}  # fmt: skip
    assert content_blocks(message) == [
        {"type": "thinking", "thinking": "think", "signature": ""}, {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]  # fmt: skip
    assert content_blocks({"content": ""}) == []


def test_stop_reasons_and_usage():
    assert stop_of("stop", None) == ("end_turn", None)
    assert stop_of("stop", 2) == ("end_turn", None)  # an end-of-turn token
    assert stop_of("stop", "END") == ("stop_sequence", "END")
    assert stop_of("length", None) == ("max_tokens", None)
    assert stop_of("tool_calls", None) == ("tool_use", None)
    with pytest.raises(APIError) as e:
        stop_of("abort", None)
    assert e.value.status == 503
    chat = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip
    assert usage_of(chat) == {"input_tokens": 6, "output_tokens": 3, "cache_read_input_tokens": 4}


def test_errors_on_the_messages_paths_are_anthropics():
    e = APIError(404, "model 'x' not found", param="model", code="model_not_found")
    assert error_shape("/v1/messages", e) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model 'x' not found"},
    }
    assert error_shape("/v1/messages/count_tokens", APIError(400, "bad"))["error"]["type"] == \
        "invalid_request_error"  # fmt: skip
    assert error_shape("/v1/chat/completions", e) == e.body()
    assert error_shape("/v1/messagesx", e) == e.body()


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) |
                    st.dictionaries(st.sampled_from(["type", "role", "content", "text", "id",
                                                     "name", "input", "tool_use_id", "source",
                                                     "messages", "thinking"]), kids, max_size=4),
                    max_leaves=12))  # fmt: skip
def test_hostile_bodies_are_a_400(value):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [value]}]}
    try:
        req = parse_request(json.dumps(body).encode(), MessagesRequest)
        chat_request(req, frozenset(), False)
    except APIError as e:
        assert e.status == 400
