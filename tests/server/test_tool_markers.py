"""`tool_choice` required and named for the formats whose call markers are special tokens
(gpt-oss's harmony, DeepSeek V3 / V3.1: `tool_markers.py`): the grammar takes each format's
calls, markers as the tokens they are, and nothing else (no call, a call to another tool,
arguments off the schema, a marker spelled out in text). Before, a 400."""

from __future__ import annotations

import pytest
import xgrammar as xgr
from marker_tools_testlib import marker_tokenizer
from pagoda.runtime.server import tools
from pagoda.runtime.server.protocol import ChatCompletionRequest
from pagoda.runtime.structured.compiler import compiler_for

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}},
]  # fmt: skip
WEATHER, NOW = '{"city": "Rome"}', "{}"
CALL_V3 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
CALL_V31 = "<｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
BLOCK = "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>"
HARMONY_CALL = "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}"
ANALYSIS = "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def marked():
    tok = marker_tokenizer()
    return tok, compiler_for(tok, tok.vocab_size)


def _grammar(parser: str, tok, choice, parallel: bool = True):
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": choice,
         "parallel_tool_calls": parallel})  # fmt: skip
    return tools.prepare(req, "{{ tools }}", parser, tok).grammar


def _accepts(marked, spec, text: str, as_text: bool = False) -> bool:
    tok, compiler = marked
    ids = tok.encode_as_text(text) if as_text else tok.encode(text, add_special_tokens=False)
    m = xgr.GrammarMatcher(compiler.compile(spec))
    return all(m.accept_token(t) for t in ids) and m.is_completed()


def _calls(parser: str, *calls: tuple[str, str]) -> str:
    if parser == "openai":
        return "".join(HARMONY_CALL.format(*c) for c in calls)
    one = CALL_V3 if parser == "deepseek_v3" else CALL_V31
    return BLOCK.format("\n".join(one.format(*c) for c in calls))


NAMED = {"type": "function", "function": {"name": "now"}}


@pytest.mark.parametrize("parser", ["openai", "deepseek_v3", "deepseek_v31"])
def test_required_and_named_calls_in_the_format(marked, parser):
    required = _grammar(parser, marked[0], "required")
    weather, now = _calls(parser, ("get_weather", WEATHER)), _calls(parser, ("now", NOW))
    assert _accepts(marked, required, weather) and _accepts(marked, required, now)
    assert not _accepts(marked, required, "")  # a call is required
    assert not _accepts(marked, required, _calls(parser, ("get_weather", '{"city": 7}')))
    assert not _accepts(marked, required, _calls(parser, ("other", NOW)))
    assert not _accepts(marked, required, weather, as_text=True)  # markers are the tokens
    named = _grammar(parser, marked[0], NAMED)
    assert _accepts(marked, named, now) and not _accepts(marked, named, weather)
    both = _calls(parser, ("get_weather", WEATHER), ("now", NOW))
    if parser == "openai":  # one call a turn; the analysis may come first
        assert _accepts(marked, required, ANALYSIS + weather)
        assert not _accepts(marked, required, both)
    else:
        assert _accepts(marked, required, both)
        assert not _accepts(marked, _grammar(parser, marked[0], "required", parallel=False), both)
