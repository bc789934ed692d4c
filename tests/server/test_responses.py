"""The Responses API's parts without a server: input items → chat messages (and chat's errors
named by this API's fields), the output items a whole reply and its stream make (the same),
the bounded store, and hostile bodies (a 400, never anything else)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.server import responses_background
from pagoda.runtime.server.endpoint import Job
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.responses import ResponsesEndpoint, ResponseState
from pagoda.runtime.server.responses_input import chat_request, responses_error
from pagoda.runtime.server.responses_items import input_items, page, query_lists
from pagoda.runtime.server.responses_output import ResponseOutput, as_messages
from pagoda.runtime.server.responses_protocol import ResponsesRequest
from pagoda.runtime.server.responses_store import ResponseStore
from pagoda.runtime.server.serving import RequestFailed


def parse(**body):
    return parse_request(json.dumps({"input": "Hi", **body}).encode(), ResponsesRequest)


def test_items_become_chat_messages():
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}
    req = parse(instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "think"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
        call, {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {"type": "function_call_output", "call_id": "c2", "output": "6"},
    ])  # fmt: skip
    history = [{"role": "user", "content": "before"}]
    chat, conversation, origins = chat_request(req, history)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "user", "assistant", "tool", "tool"]
    assert chat.messages[2].as_template_dict()["content"] == "a\nb"  # chat's joining
    reply = chat.messages[3]  # one assistant reply: thinking, text, both calls
    assert (reply.as_template_dict()["content"], reply.reasoning_content) == (
        "Let me add.",
        "think",
    )
    assert [c.id for c in reply.tool_calls] == ["c1", "c2"]
    assert conversation[0] == history[0] and len(conversation) == 5  # no instructions
    assert origins == ["instructions", "previous_response_id", "input[0]", "input[2]",
                       "input[5]", "input[6]"]  # fmt: skip


def test_image_parts_become_chat_image_parts():
    url = "data:image/png;base64,AAAA"
    req = parse(input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": url, "detail": "low"},
        {"type": "input_text", "text": "what is it?"}]}])  # fmt: skip
    chat, _, _ = chat_request(req, [])
    parts = chat.messages[0].content
    assert (parts[0].type, parts[0].image_url.url, parts[0].image_url.detail) == (
        "image_url", url, "low")  # fmt: skip
    assert parts[1].text == "what is it?"
    for part, param, code in [({"file_id": "file-1"}, "file_id", "unsupported_parameter"),
                              ({}, "image_url", "missing_required_parameter")]:  # fmt: skip
        with pytest.raises(APIError) as e:
            parse(input=[{"role": "user", "content": [{"type": "input_image", **part}]}])
        assert (e.value.param, e.value.code) == (f"input[0].content[0].{param}", code)
    with pytest.raises(APIError) as e:
        parse(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])
    assert e.value.param == "input[0].content[0].type" and "input_image" in e.value.message
    chat_says = APIError(400, "messages[0].content[0]: content parts of type 'image_url' are "
                         "not supported", param="messages[0].content[0].type")  # fmt: skip
    got = responses_error(chat_says, ["input[0]"])
    assert got.message.startswith("input[0].content[0]: content parts of type 'input_image'")


def test_settings_become_chat_fields():
    tool = {"type": "function", "name": "add", "parameters": {"type": "object"}}
    fmt = {"type": "json_schema", "name": "city", "schema": {"type": "object"}, "strict": True}
    req = parse(tools=[tool, {**tool, "name": "sub", "strict": False}], parallel_tool_calls=False,
                tool_choice={"type": "function", "name": "sub"}, text={"format": fmt},
                reasoning={"effort": "low"}, max_output_tokens=7, seed=3, top_p=0.5)  # fmt: skip
    chat, _, _ = chat_request(req, [])
    assert [(t.function.name, t.function.strict) for t in chat.tools] == [("add", True),
                                                                          ("sub", False)]  # fmt: skip
    assert chat.tool_choice.function.name == "sub" and chat.parallel_tool_calls is False
    rf = chat.response_format
    assert (rf.type, rf.json_schema.name, rf.json_schema.schema_, rf.json_schema.strict) == (
        "json_schema", "city", {"type": "object"}, True)  # fmt: skip
    assert (chat.reasoning_effort, chat.max_tokens, chat.seed, chat.top_p) == ("low", 7, 3, 0.5)
    chat, _, _ = chat_request(parse(text={"format": {"type": "json_object"}}), [])
    assert chat.response_format.type == "json_object" and chat.tools is None


def test_chat_errors_name_the_responses_fields():
    e = APIError(400, "messages[2].tool_call_id: no call; messages is bad",
                 param="messages[2].tool_call_id", code="invalid_value")  # fmt: skip
    got = responses_error(e, ["instructions", "input[0]", "input[3]"])
    assert (got.param, got.message) == (
        "input[3].call_id",
        "input[3].call_id: no call; input is bad",
    )
    for chat, ours in [("response_format.json_schema.name", "text.format.name"),
                       ("tools[1].function.parameters", "tools[1].parameters"),
                       ("tool_choice.function.name", "tool_choice.name"),
                       ("max_tokens", "max_output_tokens"), ("reasoning_effort", "reasoning.effort")]:  # fmt: skip
        assert responses_error(APIError(400, chat, param=chat), []).param == ours


def stream_items(deltas, status="completed"):
    out = ResponseOutput()
    events = [e for d in deltas for e in out.feed(d)] + out.close(status)
    return out.items, events


def test_a_stream_and_a_whole_reply_make_the_same_items():
    calls = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "add",
                                                                           "arguments": '{"a"'}},
             {"index": 0, "function": {"arguments": ": 1}"}},
             {"index": 1, "id": "call_2", "type": "function", "function": {"name": "sub",
                                                                           "arguments": "{}"}}]  # fmt: skip
    deltas = [{"reasoning": "th"}, {"reasoning": "ink", "content": "Hi"}, {"content": " there"},
              {"tool_calls": calls[:1]}, {"tool_calls": calls[1:]}]  # fmt: skip
    items, events = stream_items(deltas)
    whole = ResponseOutput()
    whole.feed_message({"reasoning": "think", "content": "Hi there", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "sub", "arguments": "{}"}}]})  # fmt: skip
    whole.close("completed")
    strip = [{k: v for k, v in i.items() if k != "id"} for i in items]
    assert strip == [{k: v for k, v in i.items() if k != "id"} for i in whole.items]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call", "function_call"]
    assert items[2]["arguments"] == '{"a": 1}' and items[3]["call_id"] == "call_2"
    kinds = [e["type"] for e in events]
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    )
    assert kinds[:3] == ["response.output_item.added", "response.content_part.added",
                         "response.reasoning_text.delta"]  # fmt: skip
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [
        0,
        1,
        2,
        3,
    ]
    assert as_messages(items) == [{"role": "assistant", "content": "Hi there", "reasoning_content": "think",
                                   "tool_calls": [{"id": "call_1", "type": "function",
                                                   "function": {"name": "add", "arguments": '{"a": 1}'}},
                                                  {"id": "call_2", "type": "function",
                                                   "function": {"name": "sub", "arguments": "{}"}}]}]  # fmt: skip


def test_an_empty_reply_is_an_empty_message_and_a_cut_one_incomplete():
    items, events = stream_items([], "completed")
    assert [(i["type"], i["content"][0]["text"]) for i in items] == [("message", "")]
    assert "response.output_text.delta" not in [e["type"] for e in events]
    items, _ = stream_items([{"content": "Hel"}], "incomplete")
    assert items[0]["status"] == "incomplete"


def test_the_store_drops_the_least_recently_used():
    store = ResponseStore(max_responses=2, max_bytes=100)
    store.put("a", b"1" * 10, [], 0)
    store.put("b", b"2" * 10, [], 0)
    store.get("a")  # now the most recent
    store.put("c", b"3" * 10, [], 0)
    assert len(store) == 2
    with pytest.raises(APIError) as e:
        store.get("b")
    assert (e.value.status, e.value.param) == (404, None)
    store.put("d", b"4" * 95, [], 0)  # past the bytes: the oldest go
    assert len(store) == 1 and store.get("d").size == 95
    store.put("e", b"5" * 101, [], 0)  # larger than the whole bound: not kept
    with pytest.raises(APIError) as e:
        store.get("e", "previous_response_id")
    assert e.value.code == "previous_response_not_found"
    store.delete("d")
    with pytest.raises(APIError):
        store.delete("d")


class Run:
    done = False


def test_the_store_keeps_running_responses_and_counts_their_events():
    store, run = ResponseStore(max_responses=2, max_bytes=100), Run()
    store.put("bg", b"q" * 10, [], 0, run=run)
    store.put("a", b"1" * 10, [], 0)
    store.update("bg", grow=85)  # its events: past the bound, the finished one goes
    assert (len(store), store.bytes) == (1, 95)
    store.put("b", b"2" * 3, [], 0)
    store.put("c", b"3" * 3, [], 0)  # past the count: the oldest finished one goes
    assert [store.get(k).size for k in ("bg", "c")] == [95, 3] and store.bytes == 98
    store.update("bg", body=b"d" * 20, messages=[{"role": "user"}], grow=5)
    assert (store.get("bg").size, store.get("bg").messages) == (110, [{"role": "user"}])
    assert (len(store), store.bytes) == (1, 110)  # only the running one, past the bound
    run.done = True  # ended: larger than the whole bound, it is not kept
    store.update("bg")
    assert (len(store), store.bytes) == (0, 0)
    store.put("x", b"q", [], 0, run=run)
    assert store.delete("x").run is run
    store.update("x", body=b"late")  # a run ending after its delete stores nothing
    assert len(store) == 0


def test_input_items_have_ids_and_page_as_openai_lists():
    req = parse(input=[{"role": "user", "content": "a"},
                       {"type": "message", "role": "assistant", "id": "msg_1", "content": "b"},
                       {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c", "output": "5"}])  # fmt: skip
    items = input_items(req)
    assert [i["type"] for i in items] == ["message", "message", "function_call",
                                          "function_call_output"]  # fmt: skip
    assert items[1]["id"] == "msg_1" and items[1]["content"] == [
        {"type": "output_text", "text": "b", "annotations": []}]  # fmt: skip
    assert len({i["id"] for i in items}) == 4 and {i["status"] for i in items} == {"completed"}
    q = query_lists([("limit", "2"), ("after", items[3]["id"]), ("include[]", "")])
    got = page(items, q)  # newest first, after the newest
    assert [i["id"] for i in got["data"]] == [items[2]["id"], "msg_1"] and got["has_more"]
    assert input_items(parse(input="x"))[0]["content"] == [{"type": "input_text", "text": "x"}]
    with pytest.raises(APIError) as e:
        page(items, query_lists([("include[]", "message.input_image.image_url")]))
    assert e.value.param == "include"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) |
                    st.dictionaries(st.sampled_from(["type", "role", "content", "text", "call_id",
                                                     "name", "arguments", "output", "x"]),
                                    inner, max_size=4), max_leaves=12)  # fmt: skip
FIELDS = ["input", "instructions", "tools", "tool_choice", "text", "reasoning", "metadata",
          "max_output_tokens", "previous_response_id", "include", "store", "stream"]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=4),
       st.lists(st.sampled_from(["message", "function_call", "function_call_output",
                                 "reasoning", "input_image"]), max_size=4))  # fmt: skip
def test_hostile_bodies_are_400s(body, kinds):
    if kinds:  # items of each type with random fields, more of them well-formed
        body["input"] = [{"type": k, "role": "user", "content": "x", "call_id": "c",
                          "name": "f", "arguments": "{}", "output": "o", "summary": []}
                         for k in kinds]  # fmt: skip
    try:
        req = parse_request(json.dumps(body).encode(), ResponsesRequest)
        chat_request(req, [])
    except APIError as e:
        assert e.status == 400 and e.message


class FailingServing:
    """A stream's engine side that sends one delta, then fails as a refused request does."""

    async def choice_deltas(self, job, totals):
        yield {"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}
        raise RequestFailed(ValueError("the core refused it"))


async def test_a_stream_that_fails_ends_with_an_error_and_response_failed():
    endpoint = ResponsesEndpoint(("m",))
    job = Job(endpoint, "resp_1", "m", [[1, 2]], [None], SamplingParams(), True, False, None, {})
    job.api_state = ResponseState(parse(), job, [])
    frames = [f async for f in endpoint.stream(FailingServing(), job)]
    events = [json.loads(f.split(b"data: ", 1)[1]) for f in frames]
    assert [f.split(b"\n", 1)[0] for f in frames] == [
        b"event: " + e["type"].encode() for e in events
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-2:] == [
        "error", "response.failed"]  # fmt: skip
    assert (events[-2]["code"], events[-2]["message"]) == ("invalid_request", "the core refused it")
    failed = events[-1]["response"]
    assert (failed["status"], failed["error"]["code"]) == ("failed", "invalid_request")
    (item,) = failed["output"]
    assert (item["status"], item["content"][0]["text"]) == ("incomplete", "Hel")
    assert len(endpoint.store) == 0  # a failed response is not stored


class HangingServing:
    """A background stream's engine side: one delta, then nothing until it is aborted (or,
    `deaf`, not even then)."""

    def __init__(self, deaf: bool = False) -> None:
        self.aborted, self.deaf = asyncio.Event(), deaf

    async def choice_deltas(self, job, totals):
        yield {"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}
        await (asyncio.Event() if self.deaf else self.aborted).wait()
        yield {"index": 0, "delta": {}, "finish_reason": "abort"}

    def abort(self, job):
        self.aborted.set()

    def usage(self, job, totals):
        return {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


@pytest.mark.parametrize("deaf", [False, True])
async def test_shutdown_cancels_running_background_responses(monkeypatch, deaf):
    monkeypatch.setattr(responses_background, "CLOSE_WAIT_S", 0.05)
    endpoint, serving = ResponsesEndpoint(("m",)), HangingServing(deaf)
    job = Job(endpoint, "resp_1", "m", [[1, 2]], [None], SamplingParams(), True, False, None, {})
    job.api_state = ResponseState(parse(background=True, stream=True), job, [])
    follow = endpoint.detach(serving, job)
    frames = []
    async for f in follow:
        frames.append(json.loads(f.split(b"data: ", 1)[1]))
        if frames[-1]["type"] == "response.output_text.delta":
            break
    assert json.loads(endpoint.store.get("resp_1").body)["status"] == "in_progress"
    await endpoint.runs.close()  # what the server's shutdown does
    frames += [json.loads(f.split(b"data: ", 1)[1]) async for f in follow]  # it ends
    assert "response.completed" not in [e["type"] for e in frames] and not endpoint.runs.running
    stored = endpoint.store.get("resp_1")
    body = json.loads(stored.body)
    assert (body["status"], body["background"]) == ("cancelled", True)
    (item,) = body["output"]
    assert (item["status"], item["content"][0]["text"]) == ("incomplete", "Hel")
    assert stored.size > sum(len(f) for f in stored.run.frames)  # its events are counted
