"""DeepSeek's tool calls (`--tool-call-parser deepseek_v3|deepseek_v31`), as vLLM's
deepseekv3/deepseekv31 parsers read them: whole outputs, and streams split at every point (and a
character at a time) give the same calls and content; what holds no call's header stays content;
tool_choice required or named gets a grammar (what it takes: `test_tool_markers.py`)."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime import options
from pagoda.runtime.server import tools
from pagoda.runtime.server.protocol import ChatCompletionRequest
from pagoda.runtime.server.tool_parser_deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from pagoda.runtime.server.tool_parsers import PARSERS

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
ARGS = '{"city": "Paris", "note": "a ``` b\\n"}'


def v3(name: str, args: str) -> str:
    return f"{CALL}function{SEP}{name}\n```json\n{args}\n```{CALL_END}"


def v31(name: str, args: str) -> str:
    return f"{CALL}{name}{SEP}{args}{CALL_END}"


CASES = {  # parser -> [(text, content, [(name, arguments)])]
    "deepseek_v3": [
        (BEGIN + v3("get_weather", ARGS) + END, None, [("get_weather", ARGS)]),
        ("Let me check. " + BEGIN + v3("get_weather", ARGS) + "\n" + v3("now", "{}") + END,
         "Let me check. ", [("get_weather", ARGS), ("now", "{}")]),
    ],
    "deepseek_v31": [
        (BEGIN + v31("get_weather", ARGS) + END, None, [("get_weather", ARGS)]),
        ("Let me check.\n" + BEGIN + v31("get_weather", ARGS) + v31("now", "{}") + END,
         "Let me check.\n", [("get_weather", ARGS), ("now", "{}")]),
    ],
}  # fmt: skip
PLAIN = ["No call: 2 + 2 = 4.", BEGIN, f"a {BEGIN}{CALL}get_weather", "<｜tool▁calls"]


def streamed(name: str, pieces: list[str], parallel: bool = True) -> tuple[str | None, list]:
    stream, content, calls = PARSERS[name]().stream(parallel), "", []
    for j, piece in enumerate(pieces):
        delta = stream.feed(piece, final=j == len(pieces) - 1)
        content += delta.get("content", "")
        for d in delta.get("tool_calls", []):
            if "id" in d:
                assert d["index"] == len(calls) and d["id"].startswith("call_")
                calls.append([d["function"]["name"], ""])
            calls[d["index"]][1] += d["function"]["arguments"]
    return content or None, [tuple(c) for c in calls]


@pytest.mark.parametrize(("name", "case"), [(n, c) for n, cs in CASES.items() for c in cs])
def test_whole_and_every_chunking_agree(name, case):
    text, content, calls = case
    got_content, got = PARSERS[name]().parse(text)
    assert (got_content, [(c.name, c.arguments) for c in got]) == (content, calls)
    assert all(json.loads(c.arguments) is not None for c in got)
    assert [c.name for c in PARSERS[name]().parse(text, parallel=False)[1]] == [calls[0][0]]
    for cut in range(len(text) + 1):
        assert streamed(name, [text[:cut], text[cut:]]) == (content, calls), cut
    assert streamed(name, list(text)) == (content, calls)  # a character at a time
    assert streamed(name, list(text), parallel=False) == (content, calls[:1])


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("text", PLAIN)
def test_what_is_not_a_complete_call_stays_content(name, text):
    assert PARSERS[name]().parse(text) == (text, [])
    for cut in range(len(text) + 1):
        assert streamed(name, [text[:cut], text[cut:]]) == (text, []), cut


def test_the_other_format_is_not_read_as_a_call():
    assert DeepSeekV31Parser().parse(CASES["deepseek_v3"][0][0])[1][0].name == "function"
    text = CASES["deepseek_v31"][0][0]  # no ```json line: V3's reader sees no call
    assert DeepSeekV3Parser().parse(text) == (text, [])


def test_the_flag_names_them_and_detect_never_picks_them():
    assert {"deepseek_v3", "deepseek_v31"} <= set(options.TOOL_CALL_PARSERS) & set(PARSERS)
    assert not PARSERS["deepseek_v3"].markers and not PARSERS["deepseek_v31"].markers


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_required_or_named_gets_a_grammar_and_auto_none(name, choice):
    def req(tool_choice):
        return ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
             "tool_choice": tool_choice})  # fmt: skip

    setup = tools.prepare(req(choice), None, name)
    assert setup.parser.name == name and setup.grammar.field == "tools"
    setup = tools.prepare(req("auto"), None, name)
    assert setup.parser.name == name and setup.grammar is None


def test_the_chat_job_answers_calls_whole_and_streamed():
    import structured_testlib
    from pagoda.runtime.engine.info import EngineInfo
    from pagoda.runtime.model.tokenizer import Tokenizer
    from pagoda.runtime.server.chat import ChatEndpoint
    from pagoda.runtime.server.logprobs import TokenStrings

    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    t = Tokenizer(structured_testlib.smol_tokenizer().backend, chat_template=template,
                  bos_token_id=None, eos_token_ids=[2])  # fmt: skip
    info = EngineInfo("m", 8192, t.vocab_size, t)
    text, content, calls = CASES["deepseek_v31"][1]
    for stream in (False, True):
        req = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}],
             "tools": [*TOOLS, NOW], "stream": stream})  # fmt: skip
        ep = ChatEndpoint(("m",), tool_parser="deepseek_v31")
        job = ep.prepare(req, info, TokenStrings(t))
        assert job.params.skip_special_tokens is False  # the markers may be special tokens
        if not stream:
            message = ep.choice(job, 0, text, [])["message"]
            got = [(c["function"]["name"], c["function"]["arguments"]) for c in
                   message["tool_calls"]]  # fmt: skip
            assert (message["content"], got) == (content, calls)
        else:
            deltas = [ep.delta(job, 0, text[j : j + 3], [], 0, j == 0, j + 3 >= len(text))
                      for j in range(0, len(text), 3)]  # fmt: skip
            ds = [d["delta"] for d in deltas if d is not None]
            assert "".join(d.get("content") or "" for d in ds) == content
            args = "".join(c["function"]["arguments"] for d in ds for c in d.get("tool_calls", []))
            assert args == ARGS + "{}"
        assert ep.finish_reason(job, 0, "stop") == "tool_calls"
