"""Tool calls through the `openai` SDK against `pagoda serve`: a streamed reply that is a call
says `content: null`, as OpenAI's does, so the SDK's stream helper (`ChatCompletionStreamState`)
builds the message a whole response gives (content null, the same call); tool errors carry a
code and name the field."""

from __future__ import annotations

import openai
import pytest
from pydantic import BaseModel

MODEL = "smollm2-135m"
pytestmark = pytest.mark.e2e


class Add(BaseModel):
    a: int
    b: int


ASK = [{"role": "user", "content": "What is 2 + 3?"}]
CALL = dict(model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Add)],
            tool_choice="required", parallel_tool_calls=False, max_tokens=40,
            temperature=0)  # fmt: skip


def test_a_streamed_call_accumulates_to_the_whole_message(client):
    whole = client.chat.completions.create(**CALL).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    chunks = []
    with client.chat.completions.stream(**CALL) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert final.message.role == "assistant" and final.message.content is None  # was ""
    (call,), (want,) = final.message.tool_calls, whole.message.tool_calls
    assert (call.function.name, call.function.arguments) == (want.function.name,
                                                             want.function.arguments)  # fmt: skip
    assert isinstance(call.function.parsed_arguments, Add)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and sum(d.role is not None for d in deltas) == 1
    assert all(d.content is None for d in deltas)  # no "" beside a call, as OpenAI


def test_a_text_reply_with_tools_streams_its_content(client):
    """tool_choice auto, answered in text: the first delta carries the role and text."""
    kw = {**CALL, "tool_choice": "auto", "max_tokens": 6}
    kw.pop("parallel_tool_calls")
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.message.content == whole.message.content
    assert final.message.tool_calls == whole.message.tool_calls


def test_tool_errors_carry_a_code(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**{**CALL, "tool_choice": {
            "type": "function", "function": {"name": "sub"}}})  # fmt: skip
    assert (e.value.code, e.value.param) == ("invalid_value", "tool_choice.function.name")


def test_a_call_whose_name_is_not_json_stays_content(client):
    """tool_choice auto, the reply forced (a one-choice structured output) to a Hermes call
    whose name holds an escape JSON lacks: content, as other malformed calls (it was a 400
    `invalid_request` whole and an error event streamed: the parser's json.loads raised)."""
    text = '<tool_call>\n{"name": "f\\x", "arguments": {}}\n</tool_call>'
    kw = {**CALL, "tool_choice": "auto", "max_tokens": 40,
          "extra_body": {"structured_outputs": {"choice": [text]}}}  # fmt: skip
    kw.pop("parallel_tool_calls")
    whole = client.chat.completions.create(**kw).choices[0]
    assert (whole.message.content, whole.message.tool_calls) == (text, None)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
FULL_ARGS = '{"a": 2, "b": 3}'


def _whole_and_streamed(client, text: str, max_tokens: int):
    """The reply forced to `text` (a one-choice structured output; tool_choice auto, the one
    tool `add`), whole and streamed (the SDK's chunks added up: its stream helper refuses a
    `length` finish): the same (content, [(name, arguments)], finish_reason) both ways."""
    kw = dict(model=MODEL, messages=ASK, tools=[ADD], max_tokens=max_tokens, temperature=0,
              extra_body={"structured_outputs": {"choice": [text]}})  # fmt: skip
    whole = client.chat.completions.create(**kw).choices[0]
    got = (whole.message.content, [(c.function.name, c.function.arguments)
                                   for c in whole.message.tool_calls or []], whole.finish_reason)  # fmt: skip
    content, calls, finish = None, {}, None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for d, f in ((c.delta, c.finish_reason) for c in chunk.choices):
            if d.content is not None:
                content = (content or "") + d.content
            for t in d.tool_calls or []:
                if t.id is not None:
                    calls[t.index] = [t.function.name, ""]
                calls[t.index][1] += t.function.arguments or ""
            finish = f or finish
    assert (content, [tuple(c) for c in calls.values()], finish) == got
    assert list(calls) == list(range(len(calls)))  # indices 0, 1, ... over the calls sent
    return got


def test_a_call_to_a_function_not_in_tools_and_a_call_cut_short_whole_as_streamed(client):
    """A call to a function the request does not list is none (OpenAI never returns one):
    dropped, neither content nor a call, and a call after it read on, index 0, whole and
    streamed alike (it was all content: the markup shown as text, the listed call lost). A call
    cut short by max_tokens after the stream sent its name: the whole response reports the same
    call, its arguments as far as written, with finish_reason `length` (as OpenAI does; it was
    content whole, a call streamed)."""
    call = f'<tool_call>\n{{"name": "NAME", "arguments": {FULL_ARGS}}}\n</tool_call>'
    text = call.replace("NAME", "sub")
    assert _whole_and_streamed(client, text, 40) == (None, [], "stop")
    both = text + "\n" + call.replace("NAME", "add")
    assert _whole_and_streamed(client, both, 80) == (None, [("add", FULL_ARGS)], "tool_calls")
    content, calls, finish = _whole_and_streamed(client, call.replace("NAME", "add"), 21)
    assert (content, [n for n, _ in calls], finish) == (None, ["add"], "length")
    assert calls[0][1] and FULL_ARGS.startswith(calls[0][1]) and calls[0][1] != FULL_ARGS
