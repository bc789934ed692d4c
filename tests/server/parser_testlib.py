"""What the tool-call and reasoning parser tests share (test_tool_parsers.py and the
per-family ones: GLM-4.5, MiniMax-M2, Hunyuan): a stream fed pieces of random sizes and what
its deltas add up to, and the grammar `tool_choice` gives a parser."""

from __future__ import annotations

import json
import random

import pytest


def streamed(stream, text: str, seed: int, most: int = 7) -> tuple[str, list[list[str]], list]:
    """`text` fed to a tool-call `stream` in pieces of 1 to `most` characters (drawn with
    `seed`), then a final empty feed: the content, the calls ([name, arguments] by index) and
    the deltas. Each call's first delta is checked: its index new, type "function", a name and
    no arguments yet."""
    rng, deltas, i = random.Random(seed), [], 0
    while i < len(text):
        k = rng.randint(1, most)
        deltas.append(stream.feed(text[i : i + k]))
        i += k
    deltas.append(stream.feed("", final=True))
    calls: dict[int, list] = {}
    for d in deltas:
        for c in d.get("tool_calls", ()):
            if "id" in c:  # a call's first delta: id, type and name, no arguments yet
                assert c["index"] not in calls and c["type"] == "function"
                assert c["function"]["arguments"] == ""
                calls[c["index"]] = [c["function"]["name"], ""]
            calls[c["index"]][1] += c["function"].get("arguments", "")
    content = "".join(d.get("content", "") for d in deltas)
    return content, [calls[i] for i in sorted(calls)], deltas


def check_calls(parser, text: str, content, calls, seed: int) -> None:
    """A tool-call `parser` (a fresh one per call of it) reads `text` whole and as a stream
    split by `seed` the same: the `content` (None: none; "" streamed), the `calls` ([(name,
    arguments as a value)]), the same arguments text, unique ids, one call without
    parallel_tool_calls."""
    got_content, got = parser().parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert all(c.id.startswith("call_") for c in got) and len({c.id for c in got}) == len(got)
    assert [c.name for c in parser().parse(text, parallel=False)[1]] == [calls[0][0]]
    streamed_content, sent, _ = streamed(parser().stream(), text, seed)
    assert streamed_content == (content or "")
    assert [a for _, a in sent] == [c.arguments for c in got]  # the same JSON text
    assert [n for n, _ in sent] == [c.name for c in got]
    assert len(streamed(parser().stream(False), text, seed)[1]) == 1


def check_plain(parser, text: str) -> None:
    """Output that holds no call stays content, whole and streamed."""
    assert parser().parse(text) == (text, [])
    assert streamed(parser().stream(), text, 0)[:2] == (text, [])


def check_cut_short(parser, text: str, name: str, args: str) -> None:
    """A call cut short (max_tokens): the stream has sent its name and `args` so far, and the
    whole response reports the same call (finish_reason `length` tells it is cut)."""
    content, calls = parser().parse(text)
    assert (content, [(c.name, c.arguments) for c in calls]) == (None, [(name, args)])
    assert streamed(parser().stream(), text, 0)[:2] == ("", [[name, args]])


def family_tests(parser, cases: list, plain: list[str], cut: tuple[str, str, str]) -> tuple:
    """The call tests of a tag format's module (GLM-4.5's, MiniMax-M2's), bound there by name:
    `cases` (text, content, calls) whole and streamed (`check_calls`), `plain` texts that stay
    content, `cut` (text, name, arguments) a call cut short (`check_cut_short`)."""

    @pytest.mark.parametrize(("text", "content", "calls"), cases)
    @pytest.mark.parametrize("seed", range(4))
    def test_whole_and_streamed_outputs(text, content, calls, seed):
        check_calls(parser, text, content, calls, seed)

    @pytest.mark.parametrize("text", plain)
    def test_what_is_not_a_call_stays_content(text):
        check_plain(parser, text)

    def test_a_call_cut_short_is_reported_as_streamed():
        """max_tokens inside a value: the stream has sent the call's start and its complete
        arguments, and the whole response reports the same call."""
        check_cut_short(parser, *cut)

    return (test_whole_and_streamed_outputs, test_what_is_not_a_call_stays_content,
            test_a_call_cut_short_is_reported_as_streamed)  # fmt: skip


def reasoning_streamed(stream, text: str, seed: int, most: int) -> tuple[str, str]:
    """`text` fed to a reasoning `stream` in pieces of 1 to `most` characters (drawn with
    `seed`), the last one final: (the reasoning, the content) it gave."""
    rng, thought, content, i = random.Random(seed), "", "", 0
    while i <= len(text):
        k = rng.randint(1, most)
        t, c = stream.feed(text[i : i + k], final=i + k >= len(text))
        thought, content, i = thought + t, content + c, i + k
    return thought, content


def tool_grammar(tools: list[dict], parser: str, choice="required"):
    """The xgrammar grammar of a chat request with `tools` and `tool_choice` `choice` under
    `--tool-call-parser parser` (its structural tag); the request gets that parser."""
    import xgrammar as xgr
    from pagoda.runtime.server.protocol import ChatCompletionRequest
    from pagoda.runtime.server.tools import prepare

    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                tools=tools, tool_choice=choice)  # fmt: skip
    setup = prepare(req, "{{ tools }}", parser)
    assert setup.parser.name == parser
    return xgr.Grammar.from_structural_tag(setup.grammar.structural_tag)


def accepts(grammar, text: str) -> bool:
    """Whether `grammar` accepts all of `text`."""
    import xgrammar as xgr

    return xgr.testing._is_grammar_accept_string(grammar, text)
