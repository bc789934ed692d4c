"""What the tool-call and reasoning parser tests share (test_tool_parsers.py and the
per-family ones: GLM-4.5, MiniMax-M2, Hunyuan): a stream fed pieces of random sizes and what
its deltas add up to, and the grammar `tool_choice` gives a parser."""

from __future__ import annotations

import random


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
