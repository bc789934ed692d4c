"""Tool-call parsers: whole outputs and streams (split anywhere) give the same calls and content;
what is not a well-formed call stays content; the parser is detected from chat templates."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime import options
from pagoda.runtime.server.tool_parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    detect,
)
from parser_testlib import streamed

CASES = [
    (HermesParser(), 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
     '"who": {"name": "nested"}}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": '
     '{"a": 1, "b": [2, "}"]}}\n</tool_call>',
     "Sure.", [("get_weather", {"city": "Paris", "who": {"name": "nested"}}),
               ("add", {"a": 1, "b": [2, "}"]})]),
    (HermesParser(), '<tool_call>\n{"arguments": {"x": "é\\"q"}, "name": "late_name"}\n</tool_call>',
     None, [("late_name", {"x": 'é"q'})]),
    (Llama3JsonParser(), '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; '
     '{"name": "g", "parameters": {}}', None, [("f", {"a": 1}), ("g", {})]),
    (Llama3JsonParser(), '  {"name": "f", "parameters": {"q": "x"}}', None, [("f", {"q": "x"})]),
    (MistralParser(), 'Let me see. [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, '
     '{"name": "g", "arguments": "{\\"b\\": 2}"}]', "Let me see.",
     [("f", {"a": 1}), ("g", {"b": 2})]),
]  # fmt: skip
PLAIN = [
    (HermesParser(), "No tools needed: 2 + 2 = 4."),
    (HermesParser(), "<tool_call>\n{not json at all\n</tool_call>"),
    (Llama3JsonParser(), "The answer is {probably} 4."),
    (Llama3JsonParser(), '{"name": "f"}'),  # no arguments
    (MistralParser(), "Plain [text] with brackets."),
    # a name whose escape JSON does not have: json.loads raised (a 400 blaming the request)
    (HermesParser(), '<tool_call>\n{"name": "f\\x", "arguments": {}}\n</tool_call>'),
    (Llama3JsonParser(), '{"name": "f\\u12", "parameters": {}}'),
    (MistralParser(), '[TOOL_CALLS][{"name": "\\q", "arguments": {}}]'),
]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_whole_outputs(parser, text, content, calls):
    got_content, got = parser.parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got)
    if parser.name == "mistral":  # what Mistral's templates take back: 9 letters and digits
        assert all(len(c.id) == 9 and c.id.isalnum() for c in got)
    else:
        assert all(c.id.startswith("call_") for c in got)
    first = parser.parse(text, parallel=False)[1]
    assert [c.name for c in first] == [calls[0][0]]


def _streamed(parser, text: str, seed: int) -> tuple[str, list, list[dict]]:
    return streamed(parser.stream(), text, seed)


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
@pytest.mark.parametrize("seed", range(4))
def test_streams_give_the_same_calls(parser, text, content, calls, seed):
    got_content, got, _ = _streamed(parser, text, seed)
    assert got_content == (content or "")  # the whitespace before a call held back, as whole
    assert [(n, json.loads(a)) for n, a in got] == calls


@pytest.mark.parametrize(("parser", "text"), PLAIN)
def test_what_is_not_a_call_stays_content(parser, text):
    assert parser.parse(text) == (text, [])
    content, calls, _ = _streamed(parser, text, 0)
    assert content == text and calls == []


def test_a_call_cut_short_streams_what_it_has():
    """max_tokens inside the arguments: a stream has sent the call's start, and the whole
    response reports the same call (finish_reason `length` tells the client it is cut, as
    OpenAI reports a call cut short)."""
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1\n'
    content, calls = HermesParser().parse(text)
    assert (content, [(c.name, c.arguments) for c in calls]) == (None, [("f", '{"a": 1')])
    content, calls, _ = _streamed(HermesParser(), text, 0)
    assert content == "" and calls == [["f", '{"a": 1']]


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser()])
def test_arguments_nested_past_jsons_depth_are_the_text_as_streamed(parser):
    """json.loads raised RecursionError (not a ValueError): a 500 for a whole response. The
    arguments are the model's text, whole as streamed (a JSON string's value once whole)."""
    deep = "[" * 1000 + "]" * 1000
    for args in (deep, json.dumps(deep)):  # the arguments as JSON, and as a JSON string
        call = f'{{"name": "f", "{"parameters" if parser.name == "llama3_json" else "arguments"}"'
        text = {
            "hermes": f"<tool_call>{call}: {args}}}</tool_call>",
            "llama3_json": f"{call}: {args}}}",
            "mistral": f"[TOOL_CALLS][{call}: {args}}}]",
        }[parser.name]
        assert [(c.name, c.arguments) for c in parser.parse(text)[1]] == [("f", deep)]
        assert _streamed(parser, text, 0)[1] == [["f", deep]]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_arguments_that_are_no_json_are_the_text_as_streamed(literal):
    """NaN and Infinity (which JSON has not): the stream has sent the arguments as the model
    wrote them before they could be read, so the whole response gives the same text (OpenAI's
    arguments are the model's text too: a client validates them)."""
    args = f'{{"a": [{literal}]}}'
    text = f'<tool_call>\n{{"name": "f", "arguments": {args}}}\n</tool_call>'
    assert [(c.name, c.arguments) for c in HermesParser().parse(text)[1]] == [("f", args)]
    assert _streamed(HermesParser(), text, 0)[1] == [["f", args]]


D = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
)
# per parser: a block of calls (each `{name}`, arguments `{}`), as the model writes them
BLOCKS = {
    "hermes": ("Hm. ", '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call>', "\n", ""),
    "llama3_json": ("", '{{"name": "{}", "parameters": {{}}}}', "; ", ""),
    "mistral": ("Hm. [TOOL_CALLS][", '{{"name": "{}", "arguments": {{}}}}', ", ", "]"),
    "hunyuan_a13b": ("Hm. <tool_calls>[", '{{"name": "{}", "arguments": {{}}}}', ", ",
                     "]</tool_calls>"),
    "glm45": ("Hm. ", "<tool_call>{}\n</tool_call>", "\n", ""),
    "minimax_m2": ("Hm. <minimax:tool_call>", '<invoke name="{}">\n</invoke>', "\n",
                   "</minimax:tool_call>"),
    "deepseek_v3": (f"Hm. {D[0]}", f"{D[1]}function{D[2]}{{}}\n```json\n{{{{}}}}\n```{D[3]}",
                    "\n", D[4]),
    "deepseek_v31": (f"Hm. {D[0]}", f"{D[1]}{{}}{D[2]}{{{{}}}}{D[3]}", "", D[4]),
}  # fmt: skip


def _block(parser: str, *names: str) -> str:
    head, call, sep, tail = BLOCKS[parser]
    return head + sep.join(call.format(n) for n in names) + tail


def _lead(name: str) -> str:
    """The content of a block's head "Hm. ": DeepSeek's is the text before the calls as written
    (vLLM's), the others' without the whitespace before the call."""
    return "Hm. " if name.startswith("deepseek") else "Hm."


def _sent(parser, text: str, seed: int) -> tuple[str | None, list[list[str]], list[int]]:
    """`text` streamed (split by `seed`): the content (None: none), the calls and the index of
    each call's first delta."""
    content, calls, deltas = streamed(parser.stream(), text, seed)
    firsts = [c["index"] for d in deltas for c in d.get("tool_calls", ()) if "id" in c]
    return content or None, calls, firsts


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_call_to_a_function_not_in_tools_is_dropped(name):
    """OpenAI never returns a call to a function the request does not list (a client
    dispatching on its name has nothing to run): every parser drops it as gpt-oss's does
    (test_harmony_tools.py), its text neither content nor a call, and reads on: the calls after
    it come back with dense indices, whole and streamed alike, no markup in the content."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("f", "g")]  # fmt: skip
    parser = PARSERS[name].for_request(tools)
    lead = _lead(name) if BLOCKS[name][0] else None
    assert _block(name, "f") != _block(name, "nope")
    text = _block(name, "nope")
    assert parser.parse(text) == (lead, [])
    assert [_sent(parser, text, seed) for seed in range(3)] == [(lead, [], [])] * 3
    text = _block(name, "nope", "f")
    content, calls = parser.parse(text)
    assert (content, [(c.name, c.arguments) for c in calls]) == (lead, [("f", "{}")])
    for seed in range(3):
        assert _sent(parser, text, seed) == (lead, [["f", "{}"]], [0])
    text = _block(name, "nope", "f", "nope", "g")
    content, calls = parser.parse(text)
    assert (content, [(c.name, c.arguments) for c in calls]) == (lead, [("f", "{}"), ("g", "{}")])
    for seed in range(3):
        assert _sent(parser, text, seed) == (lead, [["f", "{}"], ["g", "{}"]], [0, 1])
    # without parallel_tool_calls: the first call sent (not the first read) is the only one
    assert [c.name for c in parser.parse(text, parallel=False)[1]] == ["f"]
    assert streamed(parser.stream(False), text, 0)[1] == [["f", "{}"]]
    assert [c.name for c in PARSERS[name]().parse(text)[1]] == ["nope", "f", "nope", "g"]


@pytest.mark.parametrize("name", sorted(set(BLOCKS) - {"llama3_json"}))
def test_content_before_a_call_is_the_same_whole_and_streamed(name):
    """Whitespace leading the content is content, whole as streamed; whitespace before the call
    is not (the stream holds it back until more content follows, and none does)."""
    text = "  " + _block(name, "f")
    content, calls = PARSERS[name]().parse(text)
    assert (content, [c.name for c in calls]) == ("  " + _lead(name), ["f"])
    for seed in range(3):
        assert _sent(PARSERS[name](), text, seed) == ("  " + _lead(name), [["f", "{}"]], [0])


def test_content_is_not_held_longer_than_a_marker_could_need():
    stream = HermesParser().stream()
    assert stream.feed("Hello <tool") == {"content": "Hello"}
    assert stream.feed("box> done") == {"content": " <toolbox> done"}


def test_whitespace_before_a_call_is_held_and_after_plain_text_sent():
    stream = HermesParser().stream()
    assert stream.feed("Sure!\n") == {"content": "Sure!"}
    assert stream.feed("\n<tool_call>\n") == {}
    stream = HermesParser().stream()
    assert stream.feed("Done.\n\n") == {"content": "Done."}
    assert stream.feed("", final=True) == {"content": "\n\n"}


def test_detection_from_chat_templates():
    assert detect("{% for tool in tools %}...<tool_call>\n{{ tool }}</tool_call>") == "hermes"
    assert detect('{%- if tools %}<|python_tag|>{{ t }} "parameters"') == "llama3_json"
    assert detect("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]") == "mistral"
    assert detect("<tool_call> and [TOOL_CALLS]") is None  # ambiguous
    assert detect("{{ messages }}") is None and detect(None) is None
    assert set(PARSERS) == set(options.TOOL_CALL_PARSERS) - {"auto"}
