"""MiniMax-M2 served end to end through the `openai` SDK (`pagoda serve --reasoning-parser
minimax_m2`, the tool-call parser detected from the template): a tiny random-weight
MiniMaxM2ForCausalLM written by transformers, the embedded model's tokenizer with MiniMax's
markers added (`<think>`, `</think>`, `<minimax:tool_call>`, `</minimax:tool_call>` as single,
non-special tokens), and a chat template of MiniMax-M2's shape (its role markers, tools listed
in the system turn with the `<invoke>` / `<parameter>` call format, calls written back in it,
the reply opened with `<think>\\n`).

The oracle is /v1/completions of the same prompt ids, which no parser touches: its text split
and read by MiniMax's own rules, written out here (the thinking up to `</think>`; each
`<invoke name=...>`'s `<parameter>` values stripped and typed by the tool's schema)."""

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
    "]~!b[]~b]system\nYou are a helpful assistant."
    "{%- if tools %}\n\n# Tools\n<tools>\n"
    "{%- for tool in tools %}<tool>{{ tool.function | tojson(ensure_ascii=False) }}</tool>\n"
    "{% endfor %}</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass "
    'parameters:\n\n<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter '
    'name="param-key-1">param-value-1</parameter>\n...\n</invoke>\n</minimax:tool_call>'
    "{%- endif %}[e~[\n"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}]~b]user\n{{ m.content }}[e~[\n"
    "{%- elif m.role == 'assistant' -%}]~b]ai\n{{ m.content or '' }}"
    "{%- if m.tool_calls %}\n<minimax:tool_call>\n{% for tc in m.tool_calls %}"
    '<invoke name="{{ tc.function.name }}">\n{% for k, v in tc.function.arguments.items() %}'
    '<parameter name="{{ k }}">{{ v if v is string else v | tojson }}</parameter>\n'
    "{% endfor %}</invoke>\n{% endfor %}</minimax:tool_call>{% endif %}[e~[\n"
    "{%- elif m.role == 'tool' -%}]~b]tool\n<response>{{ m.content }}</response>[e~[\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}]~b]ai\n<think>\n{%- endif -%}"
)
MARKERS = ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[openai.OpenAI, dict[str, int]]]:
    path = tmp_path_factory.mktemp("minimax_m2")
    backend = write_marker_model(
        path, "MiniMaxM2", TEMPLATE, MARKERS, hidden_size=32, intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        rotary_dim=8, num_local_experts=4, num_experts_per_tok=2, bos_token_id=1,
        eos_token_id=2)  # fmt: skip
    ids = {w: backend.token_to_id(w) for w in ("</think>", "Ġsunny", "Ġrain", "Ċ")}
    assert None not in ids.values(), ids
    # no --tool-call-parser: `auto` must read the template's <minimax:tool_call> as minimax_m2
    with serve(path, "minimax_m2") as client:
        yield client, ids


def test_the_thinking_splits_whole_and_streamed(served):
    """The template opens `<think>` in the prompt: the reply is thinking up to `</think>`, the
    rest content (all of it thinking when cut off before)."""
    client, ids = served
    model = client.models.list().data[0].id
    prompt = chat_prompt_ids(client, messages=ASK)
    seen = set()
    for seed in range(8):
        kw = dict(model=model, max_tokens=4, temperature=1.0, seed=seed)
        extra = {"allowed_token_ids": list(ids.values())}
        text = client.completions.create(prompt=prompt, **kw, extra_body=extra).choices[0].text
        thought, end, answer = text.partition("</think>")
        want = (thought, answer or None) if end else (text, None)
        m = client.chat.completions.create(messages=ASK, **kw, extra_body=extra).choices[0]
        assert (m.message.reasoning_content, m.message.content) == want, text
        chunks = client.chat.completions.create(messages=ASK, **kw, extra_body=extra, stream=True)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == want[0]
        assert "".join(d.content or "" for d in deltas) == (want[1] or "")
        seen.add("closed" if end else "cut")
    assert seen == {"closed", "cut"}, seen  # both cases ran


def read_call(text: str) -> tuple[str, dict[str, Any]]:
    """MiniMax-M2's one call, as its own parser reads it: values stripped, typed by WEATHER."""
    m = re.fullmatch(r'\s*<minimax:tool_call>\s*<invoke name="(.*?)">(.*)</invoke>\s*'
                     r"</minimax:tool_call>\s*", text, re.DOTALL)  # fmt: skip
    assert m, text
    args = {}
    for k, v in re.findall(r'<parameter name="(.*?)">(.*?)</parameter>', m[2], re.DOTALL):
        typed = WEATHER["properties"][k]["type"] == "string"
        args[k] = v.strip() if typed else json.loads(v)
    return m[1], args


def test_a_required_tool_call_whole_and_streamed(served):
    """tool_choice required after the thinking: the call in MiniMax-M2's tags, each value of its
    schema's type, as the text /v1/completions writes under the same structural tag after a
    closed thinking block; it goes back through the template with its result."""
    client, ids = served
    model = client.models.list().data[0].id
    call_tag = {"type": "sequence", "elements": [
        {"type": "const_string", "value": "<minimax:tool_call>\n"},
        {"type": "tag", "begin": '<invoke name="get_weather">\n', "end": "</invoke>",
         "content": {"type": "json_schema", "json_schema": WEATHER, "style": "minimax_xml"}},
        {"type": "const_string", "value": "\n</minimax:tool_call>"}]}  # fmt: skip
    thinking = {"type": "sequence", "elements": [
        {"type": "regex", "pattern": r"([ \t\r\n]*<think>)?"},
        {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": "</think>"},
        call_tag]}  # fmt: skip
    kw = dict(model=model, max_tokens=80, temperature=0, logit_bias={str(ids["</think>"]): 30})
    text = client.completions.create(
        prompt=chat_prompt_ids(client, messages=ASK, tools=TOOLS), **kw,
        extra_body={"structured_outputs": {"structural_tag": {"type": "structural_tag",
                                                              "format": thinking}}},
    ).choices[0].text  # fmt: skip
    thought, _, rest = text.partition("</think>")
    name, args = read_call(rest)
    assert isinstance(args["code"], str) and isinstance(args["days"], int)
    call = dict(**kw, messages=ASK, tools=TOOLS, tool_choice="required")
    whole, _, _ = check_call_whole_and_streamed(client, call, name, args)
    assert whole.message.reasoning_content == thought
