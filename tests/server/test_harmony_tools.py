"""`--tool-call-parser openai` without a server: gpt-oss's harmony messages to functions become
tool calls, whole and streamed in every chunking, against a regular-expression reading of the
format; the chat endpoint's job (calls, finish reason, refused tool_choice values); tool results
and `reasoning_effort` rendered through a condensed gpt-oss template."""

from __future__ import annotations

import re

import pytest
import structured_testlib
from harmony_testlib import TEMPLATE
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.server import tools
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.harmony import HarmonyStream
from pagoda.runtime.server.harmony_tools import HarmonyToolParser
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest

MODEL = "m"
ANALYSIS = "<|channel|>analysis<|message|>Need it.<|end|>"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city": "Paris"}<|call|>')  # fmt: skip
CASES = [
    ANALYSIS + CALL,
    ANALYSIS + CALL.removesuffix("<|call|>"),  # the stop token's text left out
    # the recipient before the channel (the template's form), no analysis
    '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1}<|call|>',
    # a preamble (content), then two calls
    f"{ANALYSIS}<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>{CALL}"
    '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"b": "<|"}<|call|>',
    ANALYSIS + CALL[:-20],  # cut off inside the arguments
    f"{ANALYSIS}<|start|>assistant<|channel|>commentary to=browser.search<|message|>q<|end|>",
    f"{ANALYSIS}<|start|>assistant<|channel|>final<|message|>No call.<|return|>",
]
_MESSAGE = re.compile(r"<\|channel\|>(\w*)([^<]*(?:<\|constrain\|>[^<]*)?)<\|message\|>"
                      r"(.*?)(?=<\|end\|>|<\|return\|>|<\|call\|>|$)", re.S)  # fmt: skip
_TO = re.compile(r"to=functions\.(\S+)")


def reference(text: str) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) by a regular expression: a message whose header (the text
    since the previous <|start|>) names `to=functions.NAME` is a call to NAME."""
    reasoning, content, calls = "", "", []
    for m in _MESSAGE.finditer(text):
        header = text[max(0, text.rfind("<|start|>", 0, m.start())) : m.start()] + m.group(2)
        if to := _TO.search(header):
            calls.append((to.group(1), m.group(3)))
        elif m.group(1) == "analysis":
            reasoning += m.group(3)
        else:
            content += m.group(3)
    return reasoning, content, calls


def streamed(pieces: list[str], parallel: bool = True):
    split, tools = HarmonyStream(calls=True), HarmonyToolParser().stream(parallel)
    reasoning, content, calls = "", "", {}
    for j, piece in enumerate(pieces):
        final = j == len(pieces) - 1
        r, c = split.feed(piece, final)
        delta = tools.feed(c, final)
        reasoning, content = reasoning + r, content + delta.get("content", "")
        for d in delta.get("tool_calls", []):
            if "id" in d:
                assert d["index"] == len(calls) and d["type"] == "function", d
                calls[d["index"]] = [d["function"]["name"], ""]
            calls[d["index"]][1] += d["function"]["arguments"]
    return reasoning, content, [tuple(c) for c in calls.values()]


def whole(text: str, parallel: bool = True):
    r, c = HarmonyStream(calls=True).feed(text, True)
    content, calls = HarmonyToolParser().parse(c, parallel)
    return r, content or "", [(t.name, t.arguments) for t in calls]


@pytest.mark.parametrize("text", CASES)
def test_calls_whole_and_streamed_in_every_chunking_agree_with_the_format(text):
    want = reference(text)
    assert whole(text) == want
    for cut in range(len(text) + 1):
        assert streamed([text[:cut], text[cut:]]) == want, cut
    assert streamed(list(text)) == want


def test_the_cases_say_what_they_mean():
    assert whole(CASES[0]) == ("Need it.", "", [("get_weather", '{"city": "Paris"}')])
    assert whole(CASES[3])[1:] == ("Checking.", [("get_weather", '{"city": "Paris"}'),
                                                 ("add", '{"b": "<|"}')])  # fmt: skip
    assert whole(CASES[3], parallel=False)[2] == [("get_weather", '{"city": "Paris"}')]
    assert streamed([CASES[3]], parallel=False)[2] == [("get_weather", '{"city": "Paris"}')]
    assert whole(CASES[5])[1:] == ("q", [])  # another recipient's message is content
    # without tools in play a call stays the commentary's content (`calls` off)
    assert HarmonyStream().feed(CASES[0], True) == ("Need it.", '{"city": "Paris"}')


def test_a_call_to_a_function_not_in_tools_is_dropped():
    """OpenAI never returns a call to a function the request does not list: gpt-oss's message
    to one is dropped (as a second call without parallel_tool_calls), whole and streamed."""
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    _, text = HarmonyStream(calls=True).feed(CASES[3], True)  # calls get_weather, then add
    content, calls = HarmonyToolParser.for_request(tools).parse(text)
    assert (content, [c.name for c in calls]) == ("Checking.", ["get_weather"])
    for cut in range(0, len(text) + 1, 7):
        stream, got = HarmonyToolParser.for_request(tools).stream(), []
        for j, piece in enumerate((text[:cut], text[cut:])):
            got += [d["function"]["name"] for d in stream.feed(piece, j == 1).get("tool_calls", [])
                    if "id" in d]  # fmt: skip
        assert got == ["get_weather"]
    assert [c.name for c in HarmonyToolParser().parse(text)[1]] == ["get_weather", "add"]


def test_arguments_stream_as_they_arrive():
    split, tools = HarmonyStream(calls=True), HarmonyToolParser().stream()
    head = CALL.split("<|message|>")[0]
    assert tools.feed(split.feed(ANALYSIS + head, False)[1]) == {}
    first = tools.feed(split.feed('<|message|>{"city": ', False)[1])["tool_calls"]
    assert first[0]["function"] == {"name": "get_weather", "arguments": '{"city": '}
    assert tools.feed(split.feed('"Paris"}<|ca', False)[1]) == {
        "tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]
    }
    assert tools.feed(split.feed("ll|>", True)[1], True) == {} and tools.called


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip


def _info(template: str = TEMPLATE) -> EngineInfo:
    tok = structured_testlib.smol_tokenizer()
    t = Tokenizer(tok.backend, chat_template=template, bos_token_id=None, eos_token_ids=[2])
    return EngineInfo(MODEL, 8192, t.vocab_size, t)


def _job(body: dict, info: EngineInfo | None = None):
    info = info or _info()
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **body}
    )
    ep = ChatEndpoint((MODEL,), tool_parser="openai", reasoning_parser="openai_gptoss")
    return ep, ep.prepare(req, info, TokenStrings(info.tokenizer)), req


def test_the_chat_job_answers_calls_and_their_finish_reason():
    ep, job, _ = _job({})
    message = ep.choice(job, 0, CASES[0], [])["message"]
    assert message["reasoning_content"] == "Need it." and message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert ep.finish_reason(job, 0, "stop") == "tool_calls"
    ep, job, _ = _job({"stream": True})
    got = [ep.delta(job, 0, CASES[0][j : j + 5], [], 0, j == 0, j + 5 >= len(CASES[0]))
           for j in range(0, len(CASES[0]), 5)]  # fmt: skip
    deltas = [d["delta"] for d in got if d is not None]
    assert deltas[0]["role"] == "assistant" and deltas[0]["content"] is None
    args = "".join(c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", []))
    assert args == '{"city": "Paris"}' and ep.finish_reason(job, 0, "stop") == "tool_calls"
    ep, job, _ = _job({"tool_choice": "none"})  # no parser: the call's body is content
    assert ep.choice(job, 0, CASES[0], [])["message"]["content"] == '{"city": "Paris"}'


def test_a_dropped_call_is_no_content_whole_as_streamed():
    """A call to a function the request does not list, or a call header cut short: the stream
    sends neither, and the whole response's content was the call's normalized text
    (`<|start|>functions.nope<|message|>...`), which no client should see."""
    for text in (CASES[0].replace("get_weather", "nope"), CASES[0][: CASES[0].index("json<|")]):
        ep, job, _ = _job({})
        message = ep.choice(job, 0, text, [])["message"]
        assert (message["content"], message.get("tool_calls")) == (None, None), text
        ep, job, _ = _job({"stream": True})
        got = [ep.delta(job, 0, text[j : j + 5], [], 0, j == 0, j + 5 >= len(text))
               for j in range(0, len(text), 5)]  # fmt: skip
        deltas = [d["delta"] for d in got if d is not None]
        assert not any(d.get("content") or d.get("tool_calls") for d in deltas), deltas
    # the dropped call alone, its one delta the last: content null, as the whole response's
    bare = CASES[0].replace("get_weather", "nope")
    bare = bare[bare.index("<|start|>") :]
    ep, job, _ = _job({})
    assert ep.choice(job, 0, bare, [])["message"]["content"] is None
    ep, job, _ = _job({"stream": True})
    assert ep.delta(job, 0, bare, [], 0, True, True)["delta"]["content"] is None


def test_what_is_not_enforced_on_harmony_is_a_400():
    """(tool_choice required or named is enforced: `test_tool_markers.py`)"""
    with pytest.raises(APIError) as e:
        _job({"response_format": {"type": "json_object"}})
    assert e.value.status == 400 and e.value.param == "response_format"


def test_the_parser_needs_the_harmony_reasoning_parser():
    with pytest.raises(ValueError, match="openai_gptoss"):
        ServerConfig(tool_call_parser="openai")
    assert ServerConfig(tool_call_parser="openai", reasoning_parser="openai_gptoss")


def test_a_tool_result_renders_as_gpt_oss_function_turn():
    info = _info()
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    ep, _, req = _job({"messages": messages}, info)
    _, text, _ = ep.prompt(req, info, tools.prepare(req, TEMPLATE, "openai"))
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '"{\\"city\\": \\"Paris\\"}"' not in text
    )  # fmt: skip  (arguments as an object)
    assert ('<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|>'
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Paris"}<|call|><|start|>functions.get_weather to=assistant'
            '<|channel|>commentary<|message|>"sunny"<|end|>') in text  # fmt: skip
    assert "// \ntype get_weather" in text  # a tool without a description renders


def test_reasoning_effort_is_the_templates_variable():
    info = _info()
    for effort in ("low", "high"):
        ep, _, req = _job({"reasoning_effort": effort}, info)
        assert f"Reasoning: {effort}<|end|>" in ep.prompt(req, info, None)[1]
    ep, _, req = _job({}, info)
    assert "Reasoning: medium<|end|>" in ep.prompt(req, info, None)[1]
    same = {"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "high"}}
    assert "Reasoning: high" in ep.prompt(_job(same, info)[2], info, None)[1]
    bad = [({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}},
            _info(), "disagree"),
           ({"reasoning_effort": "high"}, _info("{{ messages[0].content }} tools"),
            "does not read")]  # fmt: skip
    for body, where, word in bad:
        with pytest.raises(APIError) as e:
            _job(body, where)
        assert e.value.param == "reasoning_effort" and word in e.value.message
    with pytest.raises(ValueError):  # OpenAI's values only
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                              "reasoning_effort": "max"})  # fmt: skip
