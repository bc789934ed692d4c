"""Hunyuan's replies (`--reasoning-parser hunyuan_a13b`: `<think>` then `<answer>`) and tool
calls (`--tool-call-parser hunyuan_a13b`: a JSON array inside `<tool_calls>`), as vLLM's
hunyuan_a13b parsers read them (the reasoning cases are vLLM's own): whole outputs and streams
split anywhere give the same reasoning, content and calls; the answer tags never reach the
content; the call format is detected from a template that names it (not as Hermes'), and the
grammar of `tool_choice: required` accepts the model's own call text."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime.server.reasoning import new_stream, reasoning_tokens, split
from pagoda.runtime.server.tool_parsers import PARSERS, detect
from parser_testlib import accepts, reasoning_streamed, streamed, tool_grammar

R, C = "This is a reasoning section", "This is the rest"
THINKING = [  # (output, reasoning, content): vLLM's tests/reasoning/test_hunyuan_reasoning_parser
    (f"<think>\n\n</think>\n<answer>\n{C}\n</answer>", None, C),
    (f"<think>\n{R}\n</think>\n<answer>\n{C}\n</answer>", R, C),
    (f"<think>\n{R}!\n</think>\n<answer>\n", f"{R}!", None),
    ("This is content", None, "This is content"),
    (f"<think>\nThis\nThat\n</think>\n<answer>\n{C}\nThat", "This\nThat", f"{C}\nThat"),
    (f"<think>\n{R}\n</think>\n<answer>\n{C}\n</answer>\nafter", R, C),  # the answer ended
    (f"<think>\n{R}\nstill", f"{R}\nstill", None),  # cut off while thinking
]  # fmt: skip


def _fed(text: str, thinking: bool, seed: int) -> tuple[str, str]:
    return reasoning_streamed(new_stream("hunyuan_a13b", thinking), text, seed, 6)


@pytest.mark.parametrize(("text", "reasoning", "content"), THINKING)
@pytest.mark.parametrize("seed", range(4))
def test_reasoning_and_answer_whole_and_streamed(text, reasoning, content, seed):
    assert split(text, new_stream("hunyuan_a13b", True)) == (reasoning, content)
    assert _fed(text, True, seed) == (reasoning or "", content or "")


@pytest.mark.parametrize("seed", range(3))
def test_a_prompt_that_closed_the_thinking_leaves_the_answer_alone(seed):
    """The template wrote an empty thinking block (no thinking asked for): all of it is
    content, without its answer tags."""
    text = f"<answer>\n{C}\n</answer>"
    assert split(text, new_stream("hunyuan_a13b", False)) == (None, C)
    assert _fed(text, False, seed) == ("", C)


def test_reasoning_tokens_count_the_thinking():
    ids = list(range(6))
    pieces = ["<think>", "\nR", "\n</think>", "\n<answer>", "\nC", "\n</answer>"]
    stream = new_stream("hunyuan_a13b", True)
    assert split("".join(pieces), stream) == ("R", "C")
    assert reasoning_tokens(ids, stream, None, lambda t: pieces[t]) == 2  # "\nR", "\n</think>"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}}]  # fmt: skip
CALLS = ('<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
         '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}]</tool_calls>')  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_tool_calls_whole_and_streamed(seed):
    parser = PARSERS["hunyuan_a13b"].for_request(TOOLS)
    content, calls = parser.parse("Let me check.\n" + CALLS)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo", "days": 1})]  # fmt: skip
    got_content, got, _ = streamed(parser.stream(), "Hi " + CALLS, seed)
    assert got_content == "Hi"
    assert [json.loads(a) for _, a in got] == [json.loads(c.arguments) for c in calls]
    assert parser.parse("No call <tool_calls> here") == ("No call <tool_calls> here", [])


def test_detected_from_the_template_and_the_required_grammar_takes_its_calls():
    template = ("{% if tools %}... reply with <tool_calls>[{\"name\": ..., \"arguments\": ...}]"
                "</tool_calls>{% endif %}")  # fmt: skip
    assert detect(template) == "hunyuan_a13b"
    grammar = tool_grammar(TOOLS, "hunyuan_a13b")
    assert accepts(grammar, CALLS)
    assert not accepts(grammar, CALLS.replace('"days": 3', '"days": "3"'))
