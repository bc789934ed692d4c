"""The `openai` SDK's structured-output helpers against `pagoda serve`, used as its docs show:
`chat.completions.parse` with pydantic models (a discriminated union included) and with
`pydantic_function_tool` tools, and the parsed message appended to the conversation as is (the
SDK sends its `parsed` and `parsed_arguments` copies back with it)."""

from __future__ import annotations

from typing import Annotated, Literal

import openai
import pytest
from pydantic import BaseModel, Field

MODEL = "smollm2-135m"
pytestmark = pytest.mark.e2e


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    name: str = Field(max_length=12)
    animal: Annotated[Cat | Dog, Field(discriminator="kind")]  # oneOf over $refs


class Add(BaseModel):
    a: int
    b: int


def test_parse_a_discriminated_union_and_send_the_answer_back(client):
    messages = [{"role": "user", "content": "Describe a pet as JSON."}]
    r = client.chat.completions.parse(model=MODEL, messages=messages, response_format=Pet,
                                      max_tokens=60, temperature=0)  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, Pet)
    messages += [r.choices[0].message, {"role": "user", "content": "Another one."}]
    r = client.chat.completions.parse(model=MODEL, messages=messages, response_format=Pet,
                                      max_tokens=60, temperature=0)  # fmt: skip
    assert isinstance(r.choices[0].message.parsed, Pet)


def test_parsed_tool_calls_and_their_results_go_back(client):
    tools = [openai.pydantic_function_tool(Add)]  # strict: true
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    r = client.chat.completions.parse(model=MODEL, messages=messages, tools=tools,
                                      tool_choice="required", parallel_tool_calls=False,
                                      max_tokens=60, temperature=0)  # fmt: skip
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert isinstance(call.function.parsed_arguments, Add)
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    r = client.chat.completions.parse(model=MODEL, messages=messages, tools=tools,
                                      max_tokens=8, temperature=0)  # fmt: skip
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


class Weather(BaseModel):
    city: str


class Report(BaseModel):
    summary: str = Field(max_length=40)
    celsius: int


def test_an_agent_with_tools_and_an_output_type(client):
    """tools (strict, tool_choice auto) with a response_format, as the Agents SDK sends them for
    an agent with an output type: the model may call a tool, then answers in the format. A
    logit_bias towards "<" makes the first turn start a call (`<tool_call>`)."""
    tools = [openai.pydantic_function_tool(Weather, name="get_weather")]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=MODEL, tools=tools, response_format=Report, max_tokens=80, temperature=0)
    r = client.chat.completions.parse(messages=messages, logit_bias={"44": 100}, **kw)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", message
    (call,) = message.tool_calls
    assert isinstance(call.function.parsed_arguments, Weather) and message.parsed is None
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}]
    r = client.chat.completions.parse(messages=messages, logit_bias={"107": 100}, **kw)  # "{"
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, Report) and not r.choices[0].message.tool_calls
