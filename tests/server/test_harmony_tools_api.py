"""`pagoda serve --tool-call-parser openai --reasoning-parser openai_gptoss` through the `openai`
SDK on a tiny gpt-oss checkpoint steered to write one harmony reply (`harmony_testlib`): an
analysis message, then ``<|start|>assistant<|channel|>commentary to=functions.get_weather
<|constrain|>json<|message|>{"city": "Paris"}<|call|>``, the arguments in two tokens. The call
comes back as `tool_calls` (whole, and streamed through the SDK's `chat.completions.stream`
helper), the analysis as the reasoning, `<|call|>` ends the generation (its successor is never
written), a tool result goes back through the template, `reasoning_effort` is accepted."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from harmony_testlib import ARGUMENTS, REASONING, write_steered_gpt_oss
from server_testlib import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[openai.OpenAI]:
    path = tmp_path_factory.mktemp("gpt-oss-tools")
    write_steered_gpt_oss(path)
    srv = ServerProcess("--model", str(path), "--served-model-name", "gpt-oss",
                        "--tool-call-parser", "openai", "--reasoning-parser", "openai_gptoss",
                        "--kv-cache-memory", "16MiB", "--max-model-len", "256",
                        "--no-engine-process", "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        yield openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)
    finally:
        srv.stop()


def _check_call(choice) -> None:
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("get_weather", ARGUMENTS)
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == REASONING


def test_a_call_whole_with_its_reasoning_and_the_stop_at_call(client):
    r = client.chat.completions.create(model="gpt-oss", messages=ASK, tools=TOOLS,
                                       max_tokens=40, temperature=0)  # fmt: skip
    _check_call(r.choices[0])
    assert r.usage.completion_tokens_details.reasoning_tokens == 1
    assert r.usage.completion_tokens < 40  # <|call|> stopped it ("never written" follows)


def test_a_call_streamed_through_the_sdk_helper(client):
    with client.chat.completions.stream(model="gpt-oss", messages=ASK, tools=TOOLS,
                                        max_tokens=40, temperature=0) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_completion()
    pieces = [e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"]
    # the name's chunk (empty arguments), then the arguments as the tokens arrive; a reader that
    # falls behind (a loaded machine) gets neighbouring chunks merged, never lost or reordered
    assert "".join(pieces) == '{"city": "Paris"}' and pieces[-1].endswith('"Paris"}')
    assert all(p in ("", '{"city": ', '"Paris"}', '{"city": "Paris"}') for p in pieces), pieces
    _check_call(final.choices[0])


def test_a_tool_result_goes_back_and_reasoning_effort_is_the_templates(client):
    first = client.chat.completions.create(model="gpt-oss", messages=ASK, tools=TOOLS,
                                           max_tokens=40, temperature=0)  # fmt: skip
    message = first.choices[0].message
    turn = [*ASK, {"role": "assistant", "content": None,
                   "tool_calls": [c.model_dump() for c in message.tool_calls]},
            {"role": "tool", "tool_call_id": message.tool_calls[0].id,
             "content": "sunny"}]  # fmt: skip
    r = client.chat.completions.create(model="gpt-oss", messages=turn, tools=TOOLS, max_tokens=40,
                                       temperature=0, reasoning_effort="high")  # fmt: skip
    _check_call(r.choices[0])  # (the steered model writes its one reply whatever the prompt)
    with pytest.raises(openai.BadRequestError) as e:  # a format after gpt-oss's channels
        client.chat.completions.create(model="gpt-oss", messages=ASK, tools=TOOLS, max_tokens=4,
                                       response_format={"type": "json_object"})  # fmt: skip
    assert e.value.body["param"] == "response_format"
