"""Reasoning parsers without a server: the `<think> … </think>` split whole and streamed in every
chunking (vLLM's rules), when a reply thinks (the prompt's tail, qwen3's `enable_thinking`),
the grammar that starts at `</think>`, reasoning token counts, tool calls read from the answer
only, and `reasoning` on input messages."""

from __future__ import annotations

import json
import random

import pytest
import structured_testlib
import xgrammar as xgr
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.server import reasoning
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest
from pagoda.runtime.server.reasoning import ReasoningStream, split, thinks
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.structured_outputs import StructuredOutputs
from pagoda.runtime.structured.compiler import compiler_for
from pagoda.runtime.structured.params import StructuredOutputsParams
from prometheus_client import CollectorRegistry

MODEL = "m"
# Qwen3's shape: history replies keep their thinking; enable_thinking=false writes an empty
# block into the prompt
QWEN3 = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
# DeepSeek-R1's newer templates open the thinking in the prompt
R1 = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}  # fmt: skip


def reference(text: str, thinking: bool) -> tuple[str | None, str | None]:
    """vLLM's deepseek_r1 / qwen3 rules for a whole output: a `<think>` opening the output is
    dropped, the thinking runs to the first `</think>` (all of it without one)."""
    if not thinking:
        return None, text
    if text.lstrip().startswith("<think>"):
        text = text.lstrip()[len("<think>") :]
    if "</think>" not in text:
        return text, None
    r, _, c = text.partition("</think>")
    return r, c or None


def streamed(pieces: list[str], thinking: bool) -> tuple[str, str, ReasoningStream]:
    s, r, c = ReasoningStream(thinking), "", ""
    for j, piece in enumerate(pieces):
        dr, dc = s.feed(piece, final=j == len(pieces) - 1)
        r, c = r + dr, c + dc
    return r, c, s


CASES = [
    "<think>a plan</think>the answer",
    "\n <think>\nplan\n</think>\n\nanswer",
    "inside already</think>after",
    "truncated while thinking <thin",
    "</think>",
    "<think></think>",
    "no end < / </thin k> </think",
    "<think>one</think>two</think>three<think>",
    "<thinking is not the tag",
    "",
]


@pytest.mark.parametrize("text", CASES)
def test_whole_and_streamed_in_every_two_piece_chunking_agree_with_vllms_rules(text):
    want = reference(text, True)
    assert split(text, ReasoningStream(True)) == want
    for cut in range(len(text) + 1):
        r, c, _ = streamed([text[:cut], text[cut:]], True)
        assert (r, c or None) == want, cut
    r, c, _ = streamed(list(text) or [""], True)  # one character at a time: tags split
    assert (r, c or None) == want
    assert split(text, ReasoningStream(False)) == (None, text)
    assert streamed([text[:3], text[3:]], False)[:2] == ("", text)


def test_random_outputs_and_chunkings():
    rng = random.Random(7)
    atoms = ["<think>", "</think>", "<", "/", "think", ">", "t", " ", "\n", "x"]
    for _ in range(400):
        text = "".join(rng.choice(atoms) for _ in range(rng.randrange(12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        r, c, _ = streamed(pieces, True)
        assert (r, c or None) == reference(text, True), (text, pieces)


def test_the_stream_holds_back_only_what_may_begin_a_marker():
    s = ReasoningStream(True)
    assert s.feed("<th", False) == ("", "")  # may open the output
    assert s.feed("ink>plan <", False) == ("plan ", "")  # "<" may begin </think>
    assert s.pending == "<"
    assert s.feed("b> </thi", False) == ("<b> ", "")
    assert s.feed("nk>\nok", False) == ("", "\nok")
    assert s.feed("</think> more", False) == ("", "</think> more")  # content from here on
    assert (s.begin_at, s.end_at) == (7, 16)  # in <think>plan <b> </think>


def test_when_a_reply_thinks():
    assert thinks("deepseek_r1", "<|im_start|>assistant\n", None)
    assert thinks("deepseek_r1", "<|im_start|>assistant\n<think>\n", None)
    assert not thinks("deepseek_r1", "<|im_start|>assistant\n<think>\n\n</think>\n\n", None)
    assert thinks("deepseek_r1", "a</think>b<think>", None)
    assert thinks("qwen3", "<|im_start|>assistant\n", {"enable_thinking": True})
    assert not thinks("qwen3", "<|im_start|>assistant\n", {"enable_thinking": False})
    assert not thinks(None, "<|im_start|>assistant\n<think>\n", None)


def test_reasoning_tokens_count_the_thinking_between_the_markers():
    texts = {1: "<think>", 2: "a", 3: "b", 4: "</think>", 5: "c", 6: "</", 7: "think", 8: ">"}
    ids = [1, 2, 3, 4, 5]
    _, _, s = streamed(["".join(texts[i] for i in ids)], True)
    assert reasoning.reasoning_tokens(ids, s, 4, texts.get) == 2  # by the marker's token
    assert reasoning.reasoning_tokens(ids, s, None, texts.get) == 2  # by the text's positions
    ids = [2, 3, 6, 7, 8, 5]  # a marker of three tokens, no opening tag
    _, _, s = streamed(["".join(texts[i] for i in ids)], True)
    assert reasoning.reasoning_tokens(ids, s, 4, texts.get) == 2
    _, _, s = streamed(["ab"], True)  # never ended: all of it
    assert reasoning.reasoning_tokens([2, 3], s, 4, texts.get) == 2
    assert reasoning.reasoning_tokens([2, 3], ReasoningStream(False), 4, texts.get) == 0
    assert reasoning.reasoning_tokens([2, 3], None, 4, texts.get) == 0


@pytest.fixture(scope="module")
def tok():
    return structured_testlib.smol_tokenizer()


def test_the_grammar_starts_at_the_end_marker(tok):
    """Free thinking (an opening <think> or none), then exactly the answer's grammar; the
    output cannot end inside the thinking."""
    spec = StructuredOutputsParams(json=json.dumps(TOOL["function"]["parameters"]),
                                   field="response_format")  # fmt: skip
    compiled = compiler_for(tok, tok.model_vocab_size).compile(reasoning.after_reasoning(spec))
    eos = tok.eos_token_ids[0]

    def run(text: str) -> tuple[bool, bool]:
        m = xgr.GrammarMatcher(compiled)
        return m.accept_string(text), m.accept_token(eos)

    assert run('<think>so {"b": 2}? no</think>{"a": 1}') == (True, True)
    assert run('\n<think>x</think>{"a": 1}') == (True, True)
    assert run('already inside {"c": 0}</think>{"a": 1}') == (True, True)
    assert run("still thinking {") == (True, False)  # EOS masked while thinking
    assert not run('x</think>{"b": 1}')[0]
    assert not run('x</think> {"a": 1}')[0]  # the grammar from the first character on
    assert not run('x</think>{"a": 1}</think>')[0]


def test_the_metric_counts_the_constraint_the_client_asked_for():
    """A reasoning model's answer grammar is a structural tag around the client's constraint;
    `pagoda:structured_output_requests_total` is labelled by the client's (json, regex, ...)."""
    registry = CollectorRegistry()
    so = StructuredOutputs(MODEL, registry)
    asked = [StructuredOutputsParams(json='{"type": "integer"}', field="response_format"),
             StructuredOutputsParams(regex="[0-9]+"), StructuredOutputsParams(choice=("a", "b"))]  # fmt: skip
    for spec in asked:
        wrapped = reasoning.after_reasoning(spec)
        assert wrapped.kind == "structural_tag"
        so.count(wrapped.with_compiled(None))  # as the server counts it: compiled
    tools = reasoning.after_reasoning(StructuredOutputsParams(regex="x", field="tools"))
    so.count(tools)
    for label in ("json", "regex", "choice", "tool_calls"):
        value = registry.get_sample_value(
            "pagoda:structured_output_requests_total", {"model_name": MODEL, "type": label}
        )
        assert value == 1.0, label
    assert registry.get_sample_value(
        "pagoda:structured_output_requests_total", {"model_name": MODEL, "type": "structural_tag"}
    ) is None  # fmt: skip


def _job(t: Tokenizer, parser: str, body: dict):
    info = EngineInfo(MODEL, 8192, t.vocab_size, t)
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                **body})  # fmt: skip
    return ChatEndpoint((MODEL,), reasoning_parser=parser).prepare(req, info, TokenStrings(t))


def _tok(tok, template: str) -> Tokenizer:
    return Tokenizer(tok.backend, chat_template=template, bos_token_id=None, eos_token_ids=[2])


def test_the_prompts_tail_decides_whether_the_reply_thinks(tok):
    q, r1 = _tok(tok, QWEN3), _tok(tok, R1)
    assert _job(q, "qwen3", {}).reasoning is True
    assert _job(q, "qwen3", {"chat_template_kwargs": {"enable_thinking": False}}).reasoning is False
    # deepseek_r1 reads no enable_thinking, but the block the template wrote is closed
    assert (
        _job(q, "deepseek_r1", {"chat_template_kwargs": {"enable_thinking": False}}).reasoning
        is False
    )
    assert _job(r1, "deepseek_r1", {}).reasoning is True  # the template opened <think>
    history = [{"role": "user", "content": "1+1?"},
               {"role": "assistant", "content": "2", "reasoning_content": "one and one"},
               {"role": "user", "content": "2+2?"}]  # fmt: skip
    job = _job(q, "qwen3", {"messages": history})
    assert "</think>" in job.prompt_texts[0] and job.reasoning is True  # history's is not ours
    partial = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>hm"}]
    cont = {"messages": partial, "continue_final_message": True, "add_generation_prompt": False}
    assert _job(q, "qwen3", cont).reasoning is True
    partial[-1]["content"] = "<think>hm</think>The"
    assert _job(q, "qwen3", cont).reasoning is False
    assert (
        _job(
            q, "qwen3", {"response_format": {"type": "json_object"}}
        ).params.structured_outputs.kind
        == "structural_tag"
    )
    off = _job(q, "qwen3", {"response_format": {"type": "json_object"},
                            "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    assert off.params.structured_outputs.kind == "json_object"  # no thinking: as without a parser
    assert _job(q, None, {}).reasoning is None


def test_tool_calls_are_read_from_the_answer_never_from_the_thinking(tok):
    t = _tok(tok, R1)  # no tools in it: Pagoda's Hermes prompt
    job = _job(t, "deepseek_r1", {"tools": [TOOL]})
    ep = job.endpoint
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    text = f"maybe {call}? no.</think>{call.replace('1', '2')}"
    message = ep.choice(job, 0, text, [])["message"]
    assert message["reasoning"] == message["reasoning_content"] == f"maybe {call}? no."
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"a": 2}']
    job = _job(t, "deepseek_r1", {"tools": [TOOL]})
    deltas = [ep.delta(job, 0, text[j : j + 5], [], 0, j == 0, j + 5 >= len(text))
              for j in range(0, len(text), 5)]  # fmt: skip
    got = [d["delta"] for d in deltas if d is not None]
    assert "".join(d.get("reasoning_content", "") for d in got) == f"maybe {call}? no."
    calls = [c for d in got for c in d.get("tool_calls") or ()]
    assert "".join(c["function"].get("arguments", "") for c in calls) == '{"a": 2}'
    assert not any(d.get("content") for d in got)
    job = _job(t, "deepseek_r1", {"tools": [TOOL]})
    message = ep.choice(job, 0, f"only thinking {call}", [])["message"]  # max_tokens hit
    assert message["content"] is None and "tool_calls" not in message


def test_reasoning_is_read_on_assistant_messages_as_reasoning_content():
    def parse(m: dict) -> ChatCompletionRequest:
        msgs = [{"role": "user", "content": "q"}, m, {"role": "user", "content": "again"}]
        return parse_request(json.dumps({"messages": msgs}).encode(), ChatCompletionRequest)

    req = parse({"role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "r"})
    assert req.messages[1].as_template_dict()["reasoning_content"] == "r"
    assert parse({"role": "assistant", "content": "a", "reasoning": "r"}).messages[1].as_template_dict() == {
        "role": "assistant", "content": "a", "reasoning_content": "r"}  # fmt: skip
    with pytest.raises(APIError) as e:
        parse({"role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "s"})
    assert e.value.status == 400 and e.value.param == "messages[1].reasoning"
    with pytest.raises(APIError) as e:
        parse({"role": "user", "content": "a", "reasoning": "r"})
    assert e.value.param == "messages[1].reasoning"


def test_the_server_config_refuses_unknown_parsers():
    assert ServerConfig(reasoning_parser="qwen3").reasoning_parser == "qwen3"
    with pytest.raises(ValueError, match="reasoning_parser must be one of qwen3, deepseek_r1"):
        ServerConfig(reasoning_parser="granite")
