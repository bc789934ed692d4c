"""`/v1/responses` through the `openai` SDK against the session's `pagoda serve` (the embedded
SmolLM2): a response is the chat completion of the same messages (greedy text and token
counts), whole and streamed (OpenAI's event sequence, numbered; the SDK's stream helper), with
instructions, conversations continued by `previous_response_id` or sent as input items, function
calls and their outputs, json_schema output, stored responses (GET, DELETE), and a 400 naming
each field this server does not honour (background responses:
`test_responses_background_api.py`)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel
from test_concurrency_metrics import idle_engine, scrape

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
ASK = "What is the capital of France?"
GREEDY = dict(model=MODEL, temperature=0, max_output_tokens=12)
TOOL = {"type": "function", "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                        "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}  # fmt: skip
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}
             | {"strict": True}}  # fmt: skip


def chat(client, messages, **kw):
    kw = {"model": MODEL, "temperature": 0, "max_tokens": 12, **kw}
    return client.chat.completions.create(messages=messages, **kw)


def test_a_response_is_the_chat_completion_of_its_messages(client, server):
    before = scrape(server.base)
    r = client.responses.create(instructions="Answer in one sentence.", input=ASK, **GREEDY)
    c = chat(client, [{"role": "system", "content": "Answer in one sentence."},
                      {"role": "user", "content": ASK}])  # fmt: skip
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == c.choices[0].message.content and "Paris" in r.output_text
    (message,) = r.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens)  # fmt: skip
    assert (r.instructions, r.max_output_tokens, r.temperature, r.model) == (
        "Answer in one sentence.", 12, 0.0, MODEL)  # fmt: skip
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    done = "pagoda:request_success_total{finished_reason=stop}"
    assert scrape(server.base)[done] - before.get(done, 0) == 2  # counted as chat's are


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(input=ASK, **{**GREEDY, "max_output_tokens": 3})
    assert (r.status, r.incomplete_details.reason, r.output[0].status) == (
        "incomplete", "max_output_tokens", "incomplete")  # fmt: skip
    assert r.usage.output_tokens == 3


def test_the_stream_sends_openais_events_and_the_whole_response(client):
    whole = client.responses.create(input=ASK, **GREEDY)
    events = list(client.responses.create(input=ASK, stream=True, **GREEDY))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1 and kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * deltas,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]  # fmt: skip
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage == whole.usage
    assert final.output[0].id == events[2].item.id == events[4].item_id
    with client.responses.stream(input=ASK, **GREEDY) as stream:
        assert stream.get_final_response().output_text == whole.output_text


def test_a_conversation_continues_by_id_or_as_input_items(client):
    first = client.responses.create(instructions="Be brief.", input=ASK, **GREEDY)
    follow = "And of Germany?"
    second = client.responses.create(previous_response_id=first.id, input=follow, **GREEDY)
    turns = [{"role": "user", "content": ASK},
             {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": follow}]  # fmt: skip
    c = chat(client, turns)  # the instructions are not carried over (OpenAI's rule)
    assert second.output_text == c.choices[0].message.content
    assert second.usage.input_tokens == c.usage.prompt_tokens
    assert second.previous_response_id == first.id
    items = [turns[0], {"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": first.output_text}]},
             {"role": "user", "content": [{"type": "input_text", "text": follow}]}]  # fmt: skip
    assert client.responses.create(input=items, **GREEDY).output_text == second.output_text


def test_a_function_call_round_trip(client):
    ask = [{"role": "user", "content": "What is 2 + 3?"}]
    kw = {**GREEDY, "max_output_tokens": 40, "tools": [TOOL]}
    r = client.responses.create(input=ask, tool_choice="required", **kw)
    (call,) = r.output
    assert (call.type, call.name, call.status) == ("function_call", "add", "completed")
    assert set(json.loads(call.arguments)) == {"a", "b"}
    with client.responses.stream(input=ask, tool_choice="required", **kw) as stream:
        events = list(stream)  # the SDK's helper checks each delta's item is a call
        final = stream.get_final_response()
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == call.arguments and done.name == "add"
    assert (final.output[0].name, final.output[0].arguments) == ("add", call.arguments)
    # the call's output goes back as items; the reply is chat's to the same messages
    back = client.responses.create(input=[*ask, call.model_dump(exclude_none=True),
                                          {"type": "function_call_output",
                                           "call_id": call.call_id, "output": "5"}],
                                   **{**kw, "max_output_tokens": 16})  # fmt: skip
    want = chat(client, [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function",
         "function": {"name": "add", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "5"}],
        tools=[CHAT_TOOL], max_tokens=16).choices[0].message  # fmt: skip
    got_calls = [(o.name, o.arguments) for o in back.output if o.type == "function_call"]
    want_calls = [(t.function.name, t.function.arguments) for t in want.tool_calls or ()]
    assert (back.output_text or None, got_calls) == (want.content or None, want_calls)
    # OpenAI's documented way: the output alone, continuing the response that made the call
    by_id = client.responses.create(previous_response_id=r.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
        **{**kw, "max_output_tokens": 16})  # fmt: skip
    assert by_id.output_text == back.output_text
    assert by_id.usage.input_tokens == back.usage.input_tokens  # (more of it cached now)


class City(BaseModel):
    name: str
    country: str


def test_json_schema_output_validates(client):
    r = client.responses.parse(input=ASK, text_format=City, **{**GREEDY, "max_output_tokens": 40})
    assert isinstance(r.output_parsed, City)
    assert City.model_validate_json(r.output_text) == r.output_parsed


def test_stored_responses_are_read_and_deleted(client):
    r = client.responses.create(input=ASK, **{**GREEDY, "max_output_tokens": 2})
    assert client.responses.retrieve(r.id) == r
    client.responses.delete(r.id)
    for call in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError) as e:
            call(r.id)
        assert e.value.status_code == 404 and r.id in e.value.message
    unstored = client.responses.create(input=ASK, store=False, **{**GREEDY, "max_output_tokens": 2})
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(input=ASK, previous_response_id=unstored.id, **GREEDY)
    assert (e.value.param, e.value.code) == ("previous_response_id", "previous_response_not_found")


async def test_a_stream_whose_client_leaves_is_aborted(server):
    before = scrape(server.base)
    body = {"model": MODEL, "input": "Write a long story about a dragon.", "stream": True,
            "max_output_tokens": 400}  # fmt: skip
    async with httpx.AsyncClient(base_url=server.base, timeout=60) as client:
        async with client.stream("POST", "/v1/responses", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("event: response.output_text.delta"):
                    break
        state = await idle_engine(client, timeout=10)
    assert state["stats"]["num_free_blocks"] == state["stats"]["num_blocks"]
    aborted = "pagoda:request_success_total{finished_reason=abort}"
    assert scrape(server.base)[aborted] - before.get(aborted, 0) == 1


FUNCTION_CALL = {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{}"}


@pytest.mark.parametrize("extra, param", [
    ({"background": True, "store": False}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"max_tool_calls": 2}, "max_tool_calls"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [TOOL, {"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[1].type"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"},
                                             {"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[1].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"reasoning": {"effort": "low"}}, "reasoning.effort"),  # SmolLM2's template lacks it
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"frequency_penalty": 1.0}, "frequency_penalty"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}},
     "text.format.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "sub"}}, "tool_choice.name"),
    ({"tools": [{**TOOL, "name": "a b"}]}, "tools[0].name"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "5"}]},
     "input[0].call_id"),
    ({"input": [FUNCTION_CALL, {"type": "function_call_output", "call_id": "call_1"}]},
     "input[1].output"),
    ({"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "Hi"}]},
     "input[0]"),
    ({"input": [{"role": "user", "content": "Hi"}], "instructions": 3}, "instructions"),
    ({"input": []}, "input"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
])  # fmt: skip
def test_what_is_not_honoured_is_a_400_naming_it(server, extra, param):
    r = server.post_json("/v1/responses", {"model": MODEL, "input": "Hi", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert param.split(".")[0].split("[")[0] in error["message"], error


def test_stored_response_routes_refuse_unknown_queries(server):
    r = httpx.get(f"{server.base}/v1/responses/resp_1?verbose=true", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "verbose"
    r = httpx.get(f"{server.base}/v1/responses/resp_missing?stream=true", timeout=30)
    assert r.status_code == 404 and "resp_missing" in r.json()["error"]["message"]
