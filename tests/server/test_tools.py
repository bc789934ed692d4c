"""Tool calling before the run: tools and tool results rendered through a chat template that
knows them (a Qwen 2.5-style template) and through one that does not (SmolLM2's: Pagoda's Hermes
prompt); the grammar of `required` / named calls in each parser's format; checks and 400s."""

from __future__ import annotations

import json

import pytest
import structured_testlib
import xgrammar as xgr
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.server import tools
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest
from pagoda.runtime.server.structured_outputs import spec_from_request
from pagoda.runtime.structured.compiler import compiler_for

QWEN_LIKE = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are helpful.{% endif %}

# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "user" or (message.role == "assistant" and not message.tool_calls) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{%- elif message.role == "assistant" %}
<|im_start|>assistant{% for tc in message.tool_calls %}{% set tc = tc.function %}
<tool_call>
{"name": "{{ tc.name }}", "arguments": {{ tc.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{%- elif message.role == "tool" %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather <now>",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}},
]  # fmt: skip
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]  # fmt: skip


def _request(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": HISTORY, "tools": TOOLS, **kw})


def _render(tokenizer, template, req):
    setup = tools.prepare(req, template, "auto")
    raw = [m.as_template_dict() for m in req.messages]
    messages, listed = tools.template_messages(raw, setup, template)
    t = Tokenizer(tokenizer.backend, chat_template=template, bos_token_id=None,
                  eos_token_ids=tokenizer.eos_token_ids)  # fmt: skip
    return setup, t.apply_chat_template(messages, tools=listed)


@pytest.fixture(scope="module")
def smol_tokenizer():
    return structured_testlib.smol_tokenizer()


def test_a_template_with_tools_renders_them_and_the_round_trip(smol_tokenizer):
    setup, text = _render(smol_tokenizer, QWEN_LIKE, _request())
    assert setup.parser.name == "hermes" and setup.choice == "auto"
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text  # no HTML escapes (<now>)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # an object
    assert "<tool_response>\n21 C\n</tool_response>" in text
    # tool_choice none: the template still shows the tools (vLLM's default); nothing is parsed
    setup, text = _render(smol_tokenizer, QWEN_LIKE, _request(tool_choice="none"))
    assert setup.parser is None and json.dumps(TOOLS[0], ensure_ascii=False) in text


def test_an_empty_tool_calls_list_renders_as_no_calls(smol_tokenizer):
    """`tool_calls: []` (as older SDKs sent a message back) says no calls: a template that
    tests `'tool_calls' in message` (Llama 3.1's) must not get an empty call list."""
    llama_like = ("{% for m in messages %}{% if 'tool_calls' in m %}[{{ m.tool_calls | length }} "
                  "calls]{% else %}{{ m.role }}: {{ m.content }}{% endif %};{% endfor %}")  # fmt: skip
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello", "tool_calls": []}]  # fmt: skip
    req = ChatCompletionRequest.model_validate({"messages": history})
    _, text = _render(smol_tokenizer, llama_like, req)
    assert text == "user: Hi;assistant: Hello;"


def test_a_template_without_tools_gets_the_hermes_prompt(smol_tokenizer):
    setup, text = _render(smol_tokenizer, smol_tokenizer.chat_template, _request())
    assert setup.parser.name == "hermes"
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>" in text
    # the history renders without tools too (tool_choice none): calls and results stay readable
    setup, text = _render(
        smol_tokenizer, smol_tokenizer.chat_template, _request(tool_choice="none")
    )
    assert setup.parser is None and "<tools>" not in text and "<tool_response>" in text


def _accepts(compiler, spec, text: str) -> bool:
    m = xgr.GrammarMatcher(compiler.compile(spec))
    return m.accept_string(text) and m.is_completed()


@pytest.fixture(scope="module")
def compiler(smol_tokenizer):
    return compiler_for(smol_tokenizer, smol_tokenizer.model_vocab_size)


@pytest.mark.parametrize(
    ("parser", "one", "two"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
         '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}',
         '{"name": "now", "parameters": {}}'),
    ],
)  # fmt: skip
def test_required_and_named_grammars(compiler, parser, one, two):
    req = _request()
    required = tools.tool_grammar(parser, req.tools, None, parallel=True)
    sep = tools.FORMATS[parser][3]
    assert _accepts(compiler, required, one) and _accepts(compiler, required, one + sep + two)
    assert not _accepts(compiler, required, "")  # at least one call
    assert not _accepts(compiler, required, one.replace('"Rome"', "7"))  # schema enforced
    single = tools.tool_grammar(parser, req.tools, None, parallel=False)
    assert _accepts(compiler, single, two) and not _accepts(compiler, single, one + sep + two)
    named = tools.tool_grammar(parser, req.tools, "now", parallel=True)
    assert _accepts(compiler, named, two) and not _accepts(compiler, named, one)


@pytest.mark.parametrize(
    ("parser", "call", "wrong"),
    [("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}'),
     ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}',
      '{"name": "nope", "parameters": {}}')],
)  # fmt: skip
def test_auto_with_strict_tools_enforces_what_starts_a_call(compiler, parser, call, wrong):
    """tool_choice auto, a tool with strict: true: free text, but a call that has begun must
    be a valid call; without strict (or with a response format) auto is not constrained."""
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, *TOOLS[1:]]
    setup = tools.prepare(_request(tools=strict), QWEN_LIKE, parser)
    assert setup.grammar is not None
    assert _accepts(compiler, setup.grammar, "Just text, no call.")
    assert _accepts(compiler, setup.grammar, "Let me look. " + call)
    m = xgr.GrammarMatcher(compiler.compile(setup.grammar))
    assert not m.accept_string(wrong)
    assert tools.prepare(_request(), QWEN_LIKE, parser).grammar is None
    assert tools.prepare(_request(tools=strict), QWEN_LIKE, "mistral").grammar is None


def test_mistral_grammar(compiler):
    spec = tools.tool_grammar("mistral", _request().tools, None, parallel=True)
    text = '[TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "X"}}]'
    assert _accepts(compiler, spec, text)


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
        (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name"),
        (dict(tools=[TOOLS[1], TOOLS[1]]), "tools[1].function.name"),
        (dict(tools=None, tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "array", "uniqueItems": True}}}], tool_choice="required"),
         "tools[0].function.parameters"),
        # arguments are an object: another type is refused, even unenforced (tool_choice auto)
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "string"}}}], tool_choice="required"), "tools[0].function.parameters"),
        (dict(tools=[TOOLS[1], {"type": "function", "function": {"name": "f", "parameters": {
            "type": "array"}}}]), "tools[1].function.parameters"),
        # an invalid JSON Schema is refused under auto too (it was shown to the model as is)
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "objekt"}}}]), "tools[0].function.parameters"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"pattern": "(["}}}}}]),
         "tools[0].function.parameters"),
    ],
)  # fmt: skip
def test_bad_tools_are_400s_naming_the_field(kw, param):
    with pytest.raises(APIError) as e:
        tools.prepare(_request(**kw), QWEN_LIKE, "auto")
    assert e.value.status == 400 and e.value.param == param


def test_an_empty_tools_list_is_no_tools(smol_tokenizer):
    """`tools: []` (which some clients always send) lists no tool: accepted as no tools, the
    template gets none; a tool_choice that needs one is a 400 (OpenAI and vLLM refuse `[]`
    itself, code `empty_array`; it means no tools, so it is honoured here)."""
    setup, text = _render(smol_tokenizer, QWEN_LIKE, _request(tools=[], tool_choice="none"))
    assert setup is None and "<tools>" not in text
    with pytest.raises(APIError) as e:
        tools.prepare(_request(tools=[], tool_choice="auto"), QWEN_LIKE, "auto")
    assert e.value.param == "tool_choice" and e.value.code == "invalid_value"


def test_a_template_in_an_unknown_format():
    odd = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}"
    with pytest.raises(APIError) as e:
        tools.prepare(_request(), odd, "auto")
    assert e.value.param == "tool_choice"
    assert tools.prepare(_request(), odd, "llama3_json").parser.name == "llama3_json"
    setup = tools.prepare(_request(tool_choice="required"), odd, "auto")
    assert setup.parser.name == "hermes" and setup.grammar is not None


def test_arguments_nested_past_the_parser_depth_are_text(smol_tokenizer):
    """Arguments nested deeper than json.loads recurses were a RecursionError (a 500); they
    reach the template as the client's text, like any arguments that are not JSON."""
    deep = "[" * 50_000 + "]" * 50_000
    history = [HISTORY[0], {**HISTORY[1], "tool_calls": [{"id": "c", "type": "function",
               "function": {"name": "now", "arguments": deep}}]}]  # fmt: skip
    req = ChatCompletionRequest.model_validate({"messages": history, "tools": TOOLS})
    _, text = _render(smol_tokenizer, QWEN_LIKE, req)
    assert deep[:100] in text


# Mistral's templates take back only calls whose ids are 9 letters and digits (they raise on any
# other id, the call's and the result's): a template in that format with that check
MISTRAL_LIKE = """{%- for message in messages %}
{%- if message.role == "user" %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS][INST]{{ message.content }}[/INST]
{%- elif message.tool_calls %}[TOOL_CALLS][{% for tc in message.tool_calls %}
{%- if tc.id | length != 9 or not tc.id.isalnum() %}{{ raise_exception("ids of 9 letters and digits only") }}{% endif %}
{{- tc.function | tojson }}{% endfor %}]</s>
{%- elif message.role == "tool" %}
{%- if message.tool_call_id | length != 9 %}{{ raise_exception("ids of 9 letters and digits only") }}{% endif %}
[TOOL_RESULTS]{{ message.content }}[/TOOL_RESULTS]
{%- endif %}{%- endfor %}"""


def test_mistral_calls_round_trip_through_a_mistral_template(smol_tokenizer):
    """The ids the mistral parser gives calls (whole and streamed) are what Mistral's templates
    take back, so the call and its result render in the next turn."""
    parser = tools.PARSERS["mistral"]()
    output = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    whole = parser.parse(output)[1][0].openai()
    streamed = parser.stream().feed(output, final=True)["tool_calls"][0]
    for call in (whole, {"id": streamed["id"], "type": "function", "function": whole["function"]}):
        history = [HISTORY[0], {"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": call["id"], "content": "21 C"}]  # fmt: skip
        req = ChatCompletionRequest.model_validate({"messages": history, "tools": TOOLS})
        setup, text = _render(smol_tokenizer, MISTRAL_LIKE, req)
        assert setup.parser.name == "mistral"
        assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]' in text
        assert "[TOOL_RESULTS]21 C[/TOOL_RESULTS]" in text


@pytest.mark.parametrize(
    "parameters",
    [{}, {"properties": {"a": {"type": "integer"}}},
     {"anyOf": [{"type": "object"}, {"type": "string"}]},
     {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object"}}}],
)  # fmt: skip
def test_enforced_arguments_are_always_an_object(compiler, parameters):
    """A `parameters` schema without `type` (`{}` too) held the arguments of a required call to
    any JSON value (5, "s", null): they are a JSON object, as OpenAI's calls always are."""
    fn = {"name": "f", "parameters": parameters}
    req = _request(tools=[{"type": "function", "function": fn}], tool_choice="required")
    spec = tools.prepare(req, QWEN_LIKE, "auto").grammar
    call = '<tool_call>\n{{"name": "f", "arguments": {}}}\n</tool_call>'
    assert _accepts(compiler, spec, call.format("{}"))
    for args in ("5", '"s"', "null", "[]"):
        assert not _accepts(compiler, spec, call.format(args)), args


def test_parameters_referring_to_a_schema_without_type_object_are_400s():
    fn = {"name": "f", "parameters": {"$ref": "#/$defs/A", "$defs": {"A": {}}}}
    with pytest.raises(APIError) as e:
        tools.prepare(_request(tools=[{"type": "function", "function": fn}]), QWEN_LIKE, "auto")
    assert e.value.param == "tools[0].function.parameters"


@pytest.mark.parametrize("strict", [False, True])
def test_auto_with_a_response_format_allows_calls_or_the_answer(compiler, strict):
    """tool_choice auto with a response format (an agent with tools and an output type): the
    output is tool calls or an answer in the format. The format alone made calls impossible."""
    listed = [{**t, "function": {**t["function"], "strict": strict}} for t in TOOLS]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"temp": {"type": "integer"}}, "required": ["temp"],
        "additionalProperties": False}}}  # fmt: skip
    req = _request(tools=listed, response_format=fmt)
    setup = tools.prepare(req, QWEN_LIKE, "auto")
    spec = tools.output_constraint(setup, req.tools, spec_from_request(req))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert _accepts(compiler, spec, call)
    assert _accepts(compiler, spec, '{"temp": 21}')
    for wrong in ('{"temp": "warm"}', "It is warm.", '<tool_call>\n{"name": "nope", '
                  '"arguments": {}}\n</tool_call>', call + '{"temp": 21}'):  # fmt: skip
        assert not _accepts(compiler, spec, wrong), wrong
    # required / named stay exclusive of a format; none leaves the format alone
    with pytest.raises(APIError):
        tools.output_constraint(tools.prepare(_request(tools=listed, tool_choice="required"),
                                              QWEN_LIKE, "auto"), req.tools, spec_from_request(req))  # fmt: skip
    none = _request(tools=listed, response_format=fmt, tool_choice="none")
    assert tools.output_constraint(tools.prepare(none, QWEN_LIKE, "auto"), none.tools,
                                   spec_from_request(none)).kind == "json"  # fmt: skip
