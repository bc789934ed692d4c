"""MiniMax-M2's tool calls (`--tool-call-parser minimax_m2`) and thinking (`--reasoning-parser
minimax_m2`), in the format MiniMax-M2's chat template asks for (`<minimax:tool_call>`, one
`<invoke name=...>` per call, `<parameter name=...>` per argument): whole outputs and streams
split anywhere give the same calls and content; each argument typed by its tool's schema as
vLLM's parser types it (an untyped one a string); what
is not a complete call stays content; the parser is detected from the template; the structural
tag of `tool_choice: required` accepts the model's own call text."""

from __future__ import annotations

import pytest
from pagoda.runtime.server.reasoning import ReasoningStream, split, thinks
from pagoda.runtime.server.tool_parser_minimax_m2 import MiniMaxM2Parser
from pagoda.runtime.server.tool_parsers import detect
from parser_testlib import accepts, family_tests, tool_grammar

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "code": {"type": "string"},
                                         "days": {"type": "integer"},
                                         "hours": {"type": "array",
                                                   "items": {"type": "integer"}}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "set", "parameters": {
        "type": "object", "properties": {"n": {"description": "untyped"}, "flag": {"type": "boolean"},
                                         "ratio": {"type": "number"}, "pick": {"enum": [1, 2]},
                                         "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                         "either": {"type": ["integer", "string"]}}}}},
]  # fmt: skip
INVOKE = ('<invoke name="get_weather">\n<parameter name="city">New York</parameter>\n'
          '<parameter name="code">42</parameter>\n<parameter name="days">3</parameter>\n'
          '<parameter name="hours">[6, 12]</parameter>\n</invoke>')  # fmt: skip
CALL = f"<minimax:tool_call>\n{INVOKE}\n</minimax:tool_call>"
WEATHER = {"city": "New York", "code": "42", "days": 3, "hours": [6, 12]}
DEEP = "[" * 1000 + "]" * 1000
CASES = [
    (CALL, None, [("get_weather", WEATHER)]),
    (f'Let me check.\n<minimax:tool_call>\n{INVOKE}\n<invoke name="now">\n</invoke>\n'
     "</minimax:tool_call>", "Let me check.", [("get_weather", WEATHER), ("now", {})]),
    # null is None whatever the schema's type, as MiniMax's and vLLM's parsers read it
    ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">null'
     '</parameter>\n<parameter name="days">Null</parameter>\n</invoke>\n</minimax:tool_call>',
     None, [("get_weather", {"city": None, "days": None})]),
    # unquoted names, a value over lines, a repeated key (the first kept), a tool whose schema
    # types no argument: every value a string, as vLLM's parser keeps them
    ("<minimax:tool_call><invoke name=now><parameter name=a>\n{'x': True}\n</parameter>"
     '<parameter name="b"> two words </parameter><parameter name="a">9</parameter>'
     '<parameter name="c">[1, 2]</parameter></invoke></minimax:tool_call>', None,
     [("now", {"a": "{'x': True}", "b": "two words", "c": "[1, 2]"})]),
    # vLLM's typing: an untyped argument a string, booleans by word, a whole number an integer,
    # an enum's type, anyOf, a list of types in its order, nil/none null, a typed value its
    # type does not read as JSON or as the text
    ('<minimax:tool_call><invoke name="set"><parameter name="n">42</parameter>'
     '<parameter name="flag">yes</parameter><parameter name="ratio">2.0</parameter>'
     '<parameter name="pick">2</parameter><parameter name="maybe">nil</parameter>'
     '<parameter name="either">abc</parameter></invoke><invoke name="get_weather">'
     '<parameter name="days">three</parameter><parameter name="code">None</parameter>'
     '<parameter name="hours">{"a": 1}</parameter></invoke></minimax:tool_call>', None,
     [("set", {"n": "42", "flag": True, "ratio": 2, "pick": 2, "maybe": None, "either": "abc"}),
      ("get_weather", {"days": "three", "code": None, "hours": {"a": 1}})]),
    # an array nested past json's depth (it raised RecursionError: a 500): the text
    ('<minimax:tool_call><invoke name="get_weather"><parameter name="hours">' + DEEP +
     "</parameter></invoke></minimax:tool_call>", None, [("get_weather", {"hours": DEEP})]),
    # NaN and Infinity are no JSON value (json.dumps wrote them as such: no JSON): the text
    ('<minimax:tool_call><invoke name="get_weather"><parameter name="days">NaN</parameter>'
     '<parameter name="hours">[Infinity]</parameter></invoke></minimax:tool_call>', None,
     [("get_weather", {"days": "NaN", "hours": "[Infinity]"})]),
]  # fmt: skip
PLAIN = ["No call: 2 + 2 = 4.", "<minimax:tool_call>\n</minimax:tool_call>",
         "a <minimax:tool_call> b"]  # fmt: skip


def parser() -> MiniMaxM2Parser:
    return MiniMaxM2Parser.for_request(TOOLS)


CUT = (
    CALL[: CALL.index('<parameter name="days">')] + '<parameter name="days">1',
    "get_weather",
    '{"city": "New York", "code": "42"',
)  # max_tokens inside a value
(
    test_whole_and_streamed_outputs,
    test_what_is_not_a_call_stays_content,
    test_a_call_cut_short_is_reported_as_streamed,
) = family_tests(parser, CASES, PLAIN, CUT)


def test_detected_from_the_template():
    template = ("{% for tool in tools %}<tool>{{ tool | tojson }}</tool>{% endfor %}\n"
                '<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">'
                "param-value-1</parameter>\n</invoke>\n</minimax:tool_call>")  # fmt: skip
    assert detect(template) == "minimax_m2"


def test_the_required_grammar_takes_the_models_own_call_text():
    grammar = tool_grammar(TOOLS, "minimax_m2")
    assert accepts(grammar, CALL)
    assert accepts(grammar, CASES[1][0].removeprefix("Let me check.\n"))
    assert not accepts(grammar, CALL.replace(">3<", ">three<"))
    assert parser().parse(CALL)[1][0].name == "get_weather"


@pytest.mark.parametrize(("text", "want"), [
    ("sum it</think>\n\n8", ("sum it", "\n\n8")),  # the template opened <think> in the prompt
    ("still thinking", ("still thinking", None)),  # cut off: all of it is reasoning
])  # fmt: skip
def test_minimax_m2_reasoning(text, want):
    """The prompt ends with the template's `<think>\\n`: the output thinks until `</think>`."""
    assert thinks("minimax_m2", "]~b]ai\n<think>\n", None)
    assert split(text, ReasoningStream(True, "minimax_m2")) == want
