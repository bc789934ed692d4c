"""`--reasoning-parser openai_gptoss` without a server: gpt-oss's harmony replies split into the
analysis channel's reasoning and the other channels' content, whole and streamed in every
chunking (markers split across chunks), against a regular-expression reading of the format; the
reasoning token count; the chat endpoint's job (special tokens kept, structured outputs refused,
a reply's message and its stream deltas)."""

from __future__ import annotations

import random
import re

import pytest
import structured_testlib
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.server import reasoning
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.harmony import HarmonyStream
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest

MODEL = "m"
ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"
CASES = [
    f"{ANALYSIS}We need 2+2.<|end|>{FINAL}It is 4.<|return|>",
    f"{ANALYSIS}We need 2+2.<|end|>{FINAL}It is 4.",  # the EOS's text left out
    f" {ANALYSIS}a < b <| c<|end|>{FINAL}<|x|> ok<|end|>",  # "<" and "<|" in bodies
    f"{ANALYSIS}truncated while thinking <|en",
    "<|channel|>final<|message|>straight to it<|return|>",
    f"{ANALYSIS}plan<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check."
    f"<|end|>{FINAL}done",  # a commentary preamble: content
    f"{ANALYSIS}call<|end|><|start|>assistant to=functions.add<|channel|>commentary "
    '<|constrain|>json<|message|>{"a": 1}<|call|>',
    f"{ANALYSIS}one<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|>{FINAL}x",
    f"{ANALYSIS}<|end|>{FINAL}",
    "plain text from a model that does not write harmony <|end|>",
    "<|chan",
    "",
]
_MESSAGE = re.compile(r"<\|channel\|>(\w*)[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>"
                      r"(.*?)(?=<\|end\|>|<\|return\|>|<\|call\|>|$)", re.S)  # fmt: skip


def reference(text: str) -> tuple[str, str]:
    """(reasoning, content): each message's body by its channel, read by a regular expression;
    text that opens with no harmony marker is content."""
    if not text.lstrip().startswith(("<|channel|>", "<|start|>")):
        return "", text
    bodies = _MESSAGE.findall(text)
    return ("".join(b for c, b in bodies if c == "analysis"),
            "".join(b for c, b in bodies if c != "analysis"))  # fmt: skip


def streamed(pieces: list[str]) -> tuple[str, str, HarmonyStream]:
    s, r, c = HarmonyStream(), "", ""
    for j, piece in enumerate(pieces):
        dr, dc = s.feed(piece, final=j == len(pieces) - 1)
        r, c = r + dr, c + dc
    return r, c, s


@pytest.mark.parametrize("text", CASES)
def test_whole_and_streamed_in_every_chunking_agree_with_the_format(text):
    want = reference(text)  # (truncated: a marker's beginning was body text after all)
    assert streamed([text])[:2] == want
    for cut in range(len(text) + 1):
        assert streamed([text[:cut], text[cut:]])[:2] == want, cut
    assert streamed(list(text) or [""])[:2] == want  # one character at a time


def test_random_outputs_and_chunkings():
    rng = random.Random(3)
    atoms = [ANALYSIS, FINAL, "<|end|>", "<|return|>", "<|start|>assistant", "<", "|", "x", " "]
    for _ in range(400):
        text = ANALYSIS + "".join(rng.choice(atoms) for _ in range(rng.randrange(10)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(pieces)[:2] == reference(text), (text, pieces)


def test_the_stream_holds_back_only_headers_and_what_may_begin_a_marker():
    s = HarmonyStream()
    assert s.feed("<|chan", False) == ("", "")  # may open the reply
    assert s.feed("nel|>analysis<|mess", False) == ("", "")  # a header
    assert s.feed("age|>think <", False) == ("think ", "")  # "<" may begin <|end|>
    assert s.pending == "<"
    assert s.feed("b> <|e", False) == ("<b> ", "")
    assert s.feed("nd|><|start|>assistant<|channel|>final<|message|>4", False) == ("", "4")
    assert s.feed("2<|return|>", True) == ("", "2")


def test_reasoning_tokens_are_those_inside_analysis_bodies():
    texts = {1: "<|channel|>", 2: "analysis", 3: "<|message|>", 4: "a", 5: "b", 6: "<|end|>",
             7: "<|start|>", 8: "assistant", 9: "final", 10: "c"}  # fmt: skip
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 1, 9, 3, 10]
    _, _, s = streamed(["".join(texts[i] for i in ids)])
    assert reasoning.reasoning_tokens(ids, s, None, texts.__getitem__) == 2
    _, _, s = streamed(["".join(texts[i] for i in ids[:5])])  # cut while thinking
    assert reasoning.reasoning_tokens(ids[:5], s, None, texts.__getitem__) == 2


HARMONY_TEMPLATE = (  # the shape of gpt-oss's: the reply opens after <|start|>assistant
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def _job(body: dict):
    tok = structured_testlib.smol_tokenizer()
    t = Tokenizer(tok.backend, chat_template=HARMONY_TEMPLATE, bos_token_id=None,
                  eos_token_ids=[2])  # fmt: skip
    info = EngineInfo(MODEL, 8192, t.vocab_size, t)
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                **body})  # fmt: skip
    ep = ChatEndpoint((MODEL,), reasoning_parser="openai_gptoss")
    return ep, ep.prepare(req, info, TokenStrings(t))


def test_the_chat_job_keeps_special_tokens_and_splits_the_reply():
    ep, job = _job({})
    assert job.params.skip_special_tokens is False and job.reasoning is True
    text = CASES[0]
    message = ep.choice(job, 0, text, [])["message"]
    assert (message["reasoning_content"], message["content"]) == ("We need 2+2.", "It is 4.")
    assert message["reasoning"] == message["reasoning_content"]
    _, job = _job({"stream": True})
    deltas = [ep.delta(job, 0, text[j : j + 4], [], 0, j == 0, j + 4 >= len(text))
              for j in range(0, len(text), 4)]  # fmt: skip
    got = [d["delta"] for d in deltas if d is not None]
    assert "".join(d.get("reasoning_content", "") for d in got) == "We need 2+2."
    assert "".join(d.get("content", "") for d in got) == "It is 4."


def test_structured_outputs_are_refused_and_the_config_takes_the_name():
    with pytest.raises(APIError) as e:
        _job({"response_format": {"type": "json_object"}})
    assert e.value.status == 400 and e.value.param == "response_format"
    assert ServerConfig(reasoning_parser="openai_gptoss").reasoning_parser == "openai_gptoss"


@pytest.mark.parametrize("text", [CASES[4], f"{ANALYSIS}<|end|>{FINAL}x", "plain"])
def test_a_reply_without_analysis_text_has_null_reasoning_as_vllm(text):
    ep, job = _job({})  # vLLM's parse_chat_output: empty reasoning is None, not ""
    message = ep.choice(job, 0, text, [])["message"]
    assert message["reasoning_content"] is None and message["reasoning"] is None
    assert message["content"]
