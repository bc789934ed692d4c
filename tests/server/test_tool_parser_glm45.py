"""GLM-4.5's tool calls (`--tool-call-parser glm45`) and thinking (`--reasoning-parser glm45`),
as vLLM's glm4_moe parsers read them: whole outputs and streams split anywhere give the same
calls and content; each argument typed by its tool's schema (a string kept raw, the rest read as
JSON); what holds no call's name stays content; the parser is detected from GLM-4.5's
template; the structural tag of `tool_choice: required` accepts GLM-4.5's own call text."""

from __future__ import annotations

import pytest
from pagoda.runtime.server.reasoning import ReasoningStream, split, thinks
from pagoda.runtime.server.tool_parser_glm45 import Glm45Parser
from pagoda.runtime.server.tool_parsers import detect
from parser_testlib import accepts, family_tests, reasoning_streamed, tool_grammar

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "code": {"type": "string"},
                                         "days": {"type": "integer"}, "metric": {"type": "boolean"},
                                         "hours": {"type": "array",
                                                   "items": {"type": "integer"}}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]  # fmt: skip
CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New York</arg_value>\n"
        "<arg_key>code</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n"
        "<arg_key>hours</arg_key>\n<arg_value>[6, 12]</arg_value>\n</tool_call>")  # fmt: skip
WEATHER = {"city": "New York", "code": "42", "days": 3, "metric": True, "hours": [6, 12]}
DEEP = "[" * 1000 + "]" * 1000
CASES = [
    (CALL, None, [("get_weather", WEATHER)]),
    ("Let me check.\n" + CALL + "\n<tool_call>now\n</tool_call>", "Let me check.",
     [("get_weather", WEATHER), ("now", {})]),
    # a value the schema does not type: JSON where it is JSON, a Python literal, else the text
    ("<tool_call>now<arg_key>a</arg_key><arg_value>{'x': True}</arg_value><arg_key>b"
     "</arg_key><arg_value> two words </arg_value><arg_key>a</arg_key><arg_value>9"
     "</arg_value></tool_call>", None, [("now", {"a": {"x": True}, "b": "two words"})]),
    # nested past json's depth (it raised RecursionError: a 500): the text, as other non-JSON
    ("<tool_call>now<arg_key>a</arg_key><arg_value>" + DEEP + "</arg_value></tool_call>",
     None, [("now", {"a": DEEP})]),
    # NaN and numbers past a double are no JSON value (json.dumps wrote NaN, Infinity: the
    # arguments were no JSON): the text
    ("<tool_call>get_weather<arg_key>days</arg_key><arg_value>NaN</arg_value><arg_key>x"
     "</arg_key><arg_value>[1e999]</arg_value></tool_call>", None,
     [("get_weather", {"days": "NaN", "x": "[1e999]"})]),
]  # fmt: skip
PLAIN = ["No call: 2 + 2 = 4.", "<tool_call>\n</tool_call>", "a <tool_call> b"]


def parser() -> Glm45Parser:
    return Glm45Parser.for_request(TOOLS)


CUT = (
    CALL[: CALL.index("<arg_key>days")] + "<arg_key>da",
    "get_weather",
    '{"city": "New York", "code": "42"',
)  # max_tokens inside a value
(
    test_whole_and_streamed_outputs,
    test_what_is_not_a_call_stays_content,
    test_a_call_cut_short_is_reported_as_streamed,
) = family_tests(parser, CASES, PLAIN, CUT)


def test_arguments_stream_pair_by_pair():
    stream = parser().stream()
    assert stream.feed("Hi <tool_") == {"content": "Hi"}
    first = stream.feed("call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo")
    assert first["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert stream.feed("</arg_value>\n")["tool_calls"] == [
        {"index": 0, "function": {"arguments": '{"city": "Oslo"'}}
    ]
    assert stream.feed("</tool_call>")["tool_calls"] == [
        {"index": 0, "function": {"arguments": "}"}}
    ]


def test_detected_from_glm45s_template_not_as_hermes():
    glm = ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>{function-name}\n"
           "<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n</tool_call>")  # fmt: skip
    assert detect(glm) == "glm45"
    assert detect("{% for tool in tools %}<tool_call>\n{{ tool }}</tool_call>") == "hermes"


def test_the_required_grammar_takes_glm45s_own_call_text():
    """The structural tag `tool_choice: required` compiles (xgrammar's glm_xml style inside
    GLM-4.5's call tags) accepts the call as GLM-4.5's template writes it, typed values and
    all, and refuses a value of the wrong type."""
    grammar = tool_grammar(TOOLS, "glm45")
    assert accepts(grammar, CALL)
    assert accepts(grammar, CALL + "\n<tool_call>now\n</tool_call>")
    assert not accepts(grammar, CALL.replace("<arg_value>3<", "<arg_value>three<"))
    # tool_choice auto with a strict tool: free text, but a call once <tool_call> starts one
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    grammar = tool_grammar(strict, "glm45", "auto")
    assert accepts(grammar, "Let me see.\n" + CALL)
    assert accepts(grammar, "No call needed.")
    assert not accepts(grammar, "Let me see.\n" + CALL.replace(">3<", ">three<"))


@pytest.mark.parametrize(("text", "want"), [
    ("<think>sum it</think>8", ("sum it", "8")),
    ("\n<think>still thinking", ("still thinking", None)),  # cut off: all of it is reasoning
    ("8, no thinking </think> here", (None, "8, no thinking </think> here")),  # vLLM's rule
    ("<think></think>", ("", None)),
])  # fmt: skip
@pytest.mark.parametrize("seed", range(3))
def test_glm45_reasoning_whole_and_streamed(text, want, seed):
    assert split(text, ReasoningStream(True, "glm45")) == want
    thought, content = reasoning_streamed(ReasoningStream(True, "glm45"), text, seed, 5)
    assert (thought or None if want[0] is None else thought, content or None) == want


def test_glm45_thinking_off():
    assert not thinks("glm45", "<|assistant|>\n<think></think>", None)
    assert not thinks("glm45", "<|assistant|>", {"enable_thinking": False})
    assert thinks("glm45", "<|assistant|>", {"enable_thinking": True})
