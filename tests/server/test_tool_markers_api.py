"""`tool_choice` required and named through the `openai` SDK against `pagoda serve` for the
formats whose call markers are special tokens: gpt-oss's harmony (`--tool-call-parser openai
--reasoning-parser openai_gptoss`) and DeepSeek V3's (`deepseek_v3`), on a tiny random
checkpoint (`marker_tools_testlib`): the grammar makes even random weights write a call in the
format, which comes back as `tool_calls` with arguments that follow the schema, whole and
streamed. Before, a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from marker_tools_testlib import marker_backend, write_marker_model
from server_testlib import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
         {"type": "function", "function": {"name": "now"}}]  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FLAGS = {"openai": ("--tool-call-parser", "openai", "--reasoning-parser", "openai_gptoss"),
         "deepseek_v3": ("--tool-call-parser", "deepseek_v3")}  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("marker-tools")
    write_marker_model(path)
    return path


@pytest.fixture(scope="module", params=list(FLAGS))
def client(request, model_dir) -> Iterator[openai.OpenAI]:
    srv = ServerProcess("--model", str(model_dir), "--served-model-name", "m",
                        *FLAGS[request.param], "--kv-cache-memory", "16MiB",
                        "--max-model-len", "512", "--no-engine-process",
                        "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        yield openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)
    finally:
        srv.stop()


def _check(calls, names) -> None:
    assert calls and {c.function.name for c in calls} <= names
    for c in calls:
        args = json.loads(c.function.arguments)
        assert args == {} if c.function.name == "now" else args["city"] in ("Paris", "Oslo")


@pytest.mark.parametrize(
    ("choice", "names"),
    [("required", {"get_weather", "now"}),
     ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})],
)  # fmt: skip
def test_the_reply_is_a_call_whole_and_streamed(client, choice, names):
    # random weights would reason on and on: the analysis (which the grammar leaves free, up to
    # <|end|>) ends as soon as it may; elsewhere <|end|> is not allowed, bias or not. One call
    # (DeepSeek's block could hold calls up to max_tokens)
    bias = {str(marker_backend().token_to_id("<|end|>")): 100}
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice,
                                       max_tokens=120, temperature=0, logit_bias=bias,
                                       parallel_tool_calls=False)  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    _check(r.choices[0].message.tool_calls, names)
    with client.chat.completions.stream(model="m", messages=ASK, tools=TOOLS, tool_choice=choice,
                                        max_tokens=120, temperature=0, logit_bias=bias,
                                        parallel_tool_calls=False) as stream:  # fmt: skip
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    _check(final.choices[0].message.tool_calls, names)
    first, again = r.choices[0].message.tool_calls[0], final.choices[0].message.tool_calls[0]
    assert (again.function.name, again.function.arguments) == (
        first.function.name, first.function.arguments)  # fmt: skip


def test_a_budget_too_small_for_the_call_ends_at_length(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=4,
                                       tool_choice="required", temperature=0)  # fmt: skip
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
