"""GLM-4.5 served end to end through the `openai` SDK (`pagoda serve --reasoning-parser glm45`,
the tool-call parser detected from the template): a tiny random-weight Glm4MoeForCausalLM written
by transformers, the embedded model's tokenizer with GLM's markers added (`<think>`,
`<tool_call>`, `<arg_key>` ... as single, non-special tokens, as GLM's vocabulary has them), and a
chat template of GLM-4.5's shape (tools listed in a system turn with its call format, calls
written back as key/value tags, `enable_thinking: false` closing an empty thinking block).

The oracle is /v1/completions of the same prompt ids, which no parser touches: its text split
and read by vLLM's glm45 rules, written out here. The random model's thinking is steered by
`allowed_token_ids` and a seed (it writes the markers at random places); its calls by the tool's
grammar, which the completions request repeats as a structural tag written out here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from marker_serve_testlib import (
    ASK,
    TOOLS,
    WEATHER,
    check_call_whole_and_streamed,
    serve,
    write_marker_model,
)
from server_testlib import chat_prompt_ids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TEMPLATE = (
    "[gMASK]<sop>"
    "{%- if tools -%}<|system|>\n# Tools\n\n<tools>\n"
    "{%- for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}\n{% endfor %}</tools>\n\n"
    "For each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>\n{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>\n<think>{{ m.reasoning_content or '' }}"
    "</think>\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}\n<tool_call>{{ tc.function.name }}\n"
    "{%- for k, v in tc.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v if v is string else v | tojson }}</arg_value>\n{% endfor %}</tool_call>"
    "{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}<|observation|>\n<tool_response>\n{{ m.content }}\n"
    "</tool_response>"
    "{%- elif m.role == 'system' -%}<|system|>\n{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking %}\n<think></think>{% endif -%}"
    "{%- endif -%}"
)
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
           "<arg_value>", "</arg_value>"]  # fmt: skip
ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "[gMASK]", "<sop>"]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[openai.OpenAI, dict[str, int]]]:
    path = tmp_path_factory.mktemp("glm45")
    backend = write_marker_model(
        path, "Glm4Moe", TEMPLATE, MARKERS, ROLES, hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        first_k_dense_replace=0, tie_word_embeddings=True)  # fmt: skip
    ids = {t: backend.token_to_id(t) for t in ("<think>", "</think>")}
    ids.update({w: backend.token_to_id(w) for w in ("Ġsunny", "Ġrain", "Ġis", "Ċ")})
    assert None not in ids.values(), ids
    # no --tool-call-parser: `auto` must read GLM-4.5's template as glm45's, not hermes'
    with serve(path, "glm45") as client:
        yield client, ids


def prompt_ids(client: openai.OpenAI, **extra) -> list[int]:
    return chat_prompt_ids(client, **{"messages": ASK, **extra})


def glm45_split(text: str) -> tuple[str | None, str | None]:
    """vLLM's glm45 rule: thinking only where the output opens with <think>, up to </think>
    (to the end when it never closes, as vLLM streams it)."""
    head = text.lstrip()
    if not head.startswith("<think>"):
        return None, text or None
    thought, end, answer = head[len("<think>") :].partition("</think>")
    return thought, (answer or None) if end else None


def _thinking_tokens(text: str) -> int:
    """The tokens between an opening <think> and </think> (or the end): with the allowed
    tokens (each a word, a newline or a marker), one per piece."""
    body = text.lstrip().removeprefix("<think>").split("</think>")[0]
    return len(re.findall(r" \w+|\n|<think>", body))


def test_the_thinking_splits_whole_and_streamed(served):
    client, ids = served
    model = client.models.list().data[0].id
    seen = set()
    for seed in range(6):
        kw = dict(model=model, max_tokens=10, temperature=1.0, seed=seed)
        extra = {"allowed_token_ids": list(ids.values()), "logit_bias": {str(ids["<think>"]): 2}}
        text = client.completions.create(prompt=prompt_ids(client), **kw, extra_body=extra)
        text = text.choices[0].text
        thought, answer = glm45_split(text)
        r = client.chat.completions.create(messages=ASK, **kw, extra_body=extra)
        m = r.choices[0].message
        assert (m.reasoning_content, m.reasoning, m.content) == (thought, thought, answer), text
        n = r.usage.completion_tokens_details.reasoning_tokens  # <think> and </think>: 1 each
        assert n == (0 if thought is None else _thinking_tokens(text)), text
        chunks = client.chat.completions.create(messages=ASK, **kw, extra_body=extra, stream=True)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        streamed = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        assert streamed == (thought or "") and "".join(d.content or "" for d in deltas) == (
            answer or "")  # fmt: skip
        seen.add("none" if thought is None else "closed" if "</think>" in text else "cut")
    assert {"none", "closed"} <= seen, seen  # both rules ran, not only one


def test_with_thinking_off_all_of_it_is_content(served):
    client, ids = served
    model = client.models.list().data[0].id
    extra = {"allowed_token_ids": list(ids.values()), **NO_THINKING}
    kw = dict(model=model, max_tokens=10, temperature=1.0, seed=3)
    text = client.completions.create(prompt=prompt_ids(client, **NO_THINKING), **kw,
                                     extra_body={"allowed_token_ids": extra["allowed_token_ids"]})  # fmt: skip
    m = client.chat.completions.create(messages=ASK, **kw, extra_body=extra).choices[0].message
    assert (m.content, m.reasoning_content) == (text.choices[0].text, None)


def read_call(text: str) -> tuple[str, dict[str, Any]]:
    """GLM-4.5's one call, typed by WEATHER (strings raw, the rest JSON), as vLLM reads it."""
    m = re.fullmatch(r"<tool_call>(.*?)\n(.*)</tool_call>", text, re.DOTALL)
    assert m, text
    args = {}
    for k, v in re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", m[2], re.S):
        typed = WEATHER["properties"][k.strip()]["type"] == "string"
        args[k.strip()] = v.strip() if typed else json.loads(v)
    return m[1].strip(), args


def test_a_named_tool_call_whole_and_streamed(served):
    """tool_choice naming the tool (thinking off): the call in GLM-4.5's tags, each value of
    its schema's type, as the text /v1/completions writes under the same structural tag."""
    client, _ = served
    model = client.models.list().data[0].id
    tag = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<tool_call>get_weather\n", "end": "</tool_call>",
        "content": {"type": "json_schema", "json_schema": WEATHER, "style": "glm_xml"}}}  # fmt: skip
    kw = dict(model=model, max_tokens=60, temperature=0)
    text = client.completions.create(
        prompt=prompt_ids(client, tools=TOOLS, **NO_THINKING),
        **kw,
        extra_body={"structured_outputs": {"structural_tag": tag}},
    )
    name, args = read_call(text.choices[0].text)
    assert isinstance(args["code"], str) and isinstance(args["days"], int)
    call = dict(**kw, messages=ASK, tools=TOOLS, extra_body=NO_THINKING,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    _, final, again = check_call_whole_and_streamed(client, call, name, args)
    assert final.message.content is None
    r = client.chat.completions.create(model=model, messages=again, tools=TOOLS, max_tokens=2,
                                       extra_body=NO_THINKING)  # fmt: skip
    assert r.choices[0].finish_reason == "length"
