"""Tool calling on the request side: `tools`, `tool_choice`, `parallel_tool_calls` → the prompt
(through the model's own chat template) and, for `required` or a named function, a grammar.

* Checking: a tool needs a name (letters, digits, `_`, `-`; at most 64) unique in the list, and
  its `parameters` must be a JSON Schema constrained decoding can enforce; a named
  `tool_choice` must name one of the tools. Each failure is a 400 naming the field.
* Rendering: the tools go to the chat template as `tools=` (OpenAI's `{"type": "function",
  "function": {...}}` shape, as Hugging Face templates expect), and an assistant message's
  `tool_calls[].function.arguments` is handed over as an object. A template that never mentions
  `tools` gets them instead as a Hermes-style system prompt (the one Qwen 2.5's template writes),
  its assistant calls as `<tool_call>` blocks and `role: "tool"` results as `<tool_response>`
  blocks in a user turn; its output is then read with the `hermes` parser.
* Enforcing: `required` (one call or more; one if `parallel_tool_calls` is false) and a named
  function (exactly that call) compile to an xgrammar structural tag in the parser's own format,
  each call's arguments constrained by its `parameters` schema, so they always parse and match.
* `auto` with a tool marked `strict: true` (OpenAI's promise that arguments follow the schema;
  the Agents SDK's default): free text, but once the output starts a call (`TRIGGERS`) it must
  be a call to one of the tools with arguments matching its schema (hermes and llama3_json;
  one call without `parallel_tool_calls`).
* `auto` with a `response_format` (an agent with tools and an output type): the output is either
  calls, enforced as under `required`, or the answer in that format (`output_constraint`).
* `none`: the tools are left out of the prompt and the output is plain content.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.server import harmony_tools
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest
from pagoda.runtime.server.tool_parsers import PARSERS, ToolParser, detect
from pagoda.runtime.structured import schema as schemas
from pagoda.runtime.structured import schema_document
from pagoda.runtime.structured.params import StructuredOutputsParams

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
# (prefix, call begin with {name} and {key}, call end, separator, suffix) per parser
FORMATS = {
    "hermes": ("", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>", "\n", ""),
    "llama3_json": ("", '{{"name": "{name}", "parameters": ', "}", "; ", ""),
    "mistral": ("[TOOL_CALLS][", '{{"name": "{name}", "arguments": ', "}", ", ", "]"),
    # GLM-4.5: the arguments as <arg_key>/<arg_value> tags (xgrammar's glm_xml style), not JSON
    "glm45": ("", "<tool_call>{name}\n", "</tool_call>", "\n", ""),
    # Hunyuan-A13B: one JSON array of calls between <tool_calls> tags
    "hunyuan_a13b": (
        "<tool_calls>[",
        '{{"name": "{name}", "arguments": ',
        "}",
        ", ",
        "]</tool_calls>",
    ),
    # MiniMax-M2: one block of <invoke> tags, the arguments as <parameter> tags (minimax_xml)
    "minimax_m2": (
        "<minimax:tool_call>\n",
        '<invoke name="{name}">\n',
        "</invoke>",
        "\n",
        "\n</minimax:tool_call>",
    ),
}
# the formats whose arguments are tags, not JSON: xgrammar's style for each
XML_STYLES = {"glm45": "glm_xml", "minimax_m2": "minimax_xml"}
# tool_choice auto with strict tools: text that starts a call, per parser (mistral's marker is a
# special token, and its calls one JSON array; MiniMax-M2's calls one <minimax:tool_call> block:
# not enforced under auto)
TRIGGERS = {"hermes": "<tool_call>", "llama3_json": '{"name": "', "glm45": "<tool_call>"}
HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass
class ToolSetup:
    """A request's tool calling, decided before it runs."""

    parser: ToolParser | None  # None: output is plain content (tool_choice none)
    choice: str  # "none" | "auto" | "required" | "function"
    parallel: bool
    tools: list[dict[str, Any]]  # OpenAI tool objects, as the template receives them
    grammar: StructuredOutputsParams | None = None  # required / named function


def template_supports_tools(template: str | None) -> bool:
    return bool(template) and re.search(r"\btools\b", template) is not None


def parser_for(template: str | None, configured: str) -> str | None:
    """The parser in use: `--tool-call-parser`, else detected from the template (hermes for a
    template that does not render tools: Pagoda's own prompt writes that format)."""
    if configured != "auto":
        return configured
    if not template_supports_tools(template):
        return "hermes"
    return detect(template)


def prepare(
    req: ChatCompletionRequest, template: str | None, configured: str, tokenizer: Any = None
) -> ToolSetup | None:
    """Check the request's tool fields; None when it has no tools (and asks for none).
    `tokenizer`: the model's, whose tokens a grammar names where a format's markers are
    tokens (`tool_markers`)."""
    tools, choice = req.tools, req.tool_choice
    if not tools:  # `tools: []` lists no tool: as if left out (nothing reaches the template)
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice other than 'none' requires at least one tool in "
                           "tools", param="tool_choice", code="invalid_value")  # fmt: skip
        return None
    names: set[str] = set()
    for i, t in enumerate(tools):
        name = t.function.name
        if not _NAME.match(name):
            raise APIError(
                400,
                f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-', got "
                f"{name[:80]!r}",
                param=f"tools[{i}].function.name",
                code="invalid_value",
            )
        if name in names:
            raise APIError(400, f"tools[{i}].function.name: {name!r} is given twice",
                           param=f"tools[{i}].function.name", code="invalid_value")  # fmt: skip
        names.add(name)
        check_parameters(t.function.parameters, f"tools[{i}].function.parameters")
    kind = "auto" if choice is None else choice if isinstance(choice, str) else "function"
    if kind == "function" and choice.function.name not in names:
        raise APIError(
            400,
            f"tool_choice names {choice.function.name[:80]!r}, which is not among the tools",
            param="tool_choice.function.name",
            code="invalid_value",
        )
    parallel = req.parallel_tool_calls is not False
    listed = [t.model_dump(exclude_none=True) for t in tools]
    if configured == harmony_tools.NAME:
        listed = [harmony_tools.described(t) for t in listed]
    if kind == "none":
        return ToolSetup(None, kind, parallel, listed)
    name = parser_for(template, configured)
    if name is None:
        if kind == "auto":
            raise APIError(
                400,
                "tool_choice auto: this model's chat template renders tools in a format no "
                "tool-call parser here reads; start the server with --tool-call-parser",
                param="tool_choice",
                code="unsupported_value",
            )
        name = "hermes"
    setup = ToolSetup(PARSERS[name].for_request(listed), kind, parallel, listed)
    if kind != "auto":
        only = choice.function.name if kind == "function" else None
        setup.grammar = tool_grammar(name, tools, only, parallel, tokenizer=tokenizer)
    elif name in TRIGGERS and any(t.function.strict for t in tools):
        setup.grammar = tool_grammar(name, tools, None, parallel, free=True)
    return setup


def output_constraint(
    setup: ToolSetup | None, tools: list | None, answer: StructuredOutputsParams | None
) -> StructuredOutputsParams | None:
    """What the output is held to: the request's own constraint (`answer`), the tools' grammar,
    or, with tool_choice auto and a `response_format`, either tool calls or an answer in that
    format (OpenAI's meaning: the format is the answer's; the Agents SDK sends both for an agent
    with tools and an output type). vLLM's `structured_outputs` holds the whole output, calls
    included, as in vLLM."""
    if setup is None or setup.parser is None:  # no tools, or tool_choice none
        return answer
    if answer is None:
        return setup.grammar
    if setup.choice != "auto":
        raise APIError(400, "tool_choice required or a named function cannot be combined with "
                       "response_format or structured_outputs", param="tool_choice",
                       code="invalid_value")  # fmt: skip
    if not answer.field.startswith("response_format") or setup.parser.name not in FORMATS:
        return answer  # (a harmony reply's format is refused with its reasoning parser)
    return tool_grammar(setup.parser.name, tools or [], None, setup.parallel, answer=answer)


def check_parameters(parameters: dict[str, Any] | None, where: str) -> None:
    """A tool's `parameters` must be a valid JSON Schema of an object (as OpenAI requires:
    arguments are a JSON object), whether or not the call will be enforced."""
    if parameters is None:
        return
    try:
        schemas.check_valid(parameters)
    except schemas.SchemaError as e:
        raise APIError(400, f"{where}: {e}", param=where, code="invalid_value") from e
    kind = parameters.get("type", "object")
    if "$ref" in parameters and "type" not in parameters:  # the type of what it refers to
        target = schema_document.deref(parameters, parameters)
        kind = target.get("type") if isinstance(target, dict) and target is not parameters else None
    if kind != "object":
        got = "a $ref to a schema without it" if kind is None else f"type {json.dumps(kind)[:80]}"
        raise APIError(400, f"{where} must be a JSON Schema of type \"object\" (a call's "
                       f"arguments are a JSON object), got {got}",
                       param=where, code="invalid_value")  # fmt: skip


def arguments_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The schema a call's arguments are held to: `parameters` as an object schema (a schema
    without `type`, `{}` included, would let the grammar write any JSON value: a number, a
    string, null), and no arguments at all without `parameters`."""
    if parameters is None:
        return NO_PARAMETERS
    if "type" in parameters or "$ref" in parameters:  # `$ref`: its target is checked below
        return parameters
    return {**parameters, "type": "object"}


def _arguments(parser: str, i: int, parameters: dict[str, Any] | None) -> Any:
    """The structural tag format of tools[i]'s arguments in `parser`'s calls."""
    import xgrammar as xgr
    from xgrammar import structural_tag as st

    where = f"tools[{i}].function.parameters"
    try:
        # length-bounded strings as patterns: a tool grammar's tags hold newlines, so its
        # masks cannot rule out control bytes (see `GrammarCompiler.printable`)
        schema = schemas.check(arguments_schema(parameters), length_patterns=True)
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=False, strict_mode=True
        )
    except schemas.SchemaError as e:
        raise APIError(400, f"{where}: {e}", param=where, code="invalid_value") from e
    except (RuntimeError, ValueError) as e:
        raise APIError(400, f"{where}: invalid JSON Schema: {e}", param=where,
                       code="invalid_value") from e  # fmt: skip
    if parser in XML_STYLES:  # the same schema, written as the format's tags
        return st.JSONSchemaFormat(json_schema=schema, style=XML_STYLES[parser])
    return st.GrammarFormat(grammar=str(grammar))


def tool_grammar(
    parser: str, tools: list, only: str | None, parallel: bool, free: bool = False,
    answer: StructuredOutputsParams | None = None, tokenizer: Any = None,
) -> StructuredOutputsParams:  # fmt: skip
    """The structural tag forcing calls in `parser`'s format: exactly `only`, else at least one
    of the tools (just one without `parallel`), each with arguments matching its schema. `free`
    (tool_choice auto with strict tools): any text, but what starts a call (`TRIGGERS`) must go
    on as a call to one of the tools with arguments matching its schema. `answer` (tool_choice
    auto with a response format): either such calls or an answer in that format. Formats whose
    markers are tokens (`tool_markers`: harmony, DeepSeek) name them in `tokenizer`."""
    from pagoda.runtime.server import tool_markers  # (imports xgrammar: here, as xgrammar is)
    from xgrammar import structural_tag as st

    calls = [(t.function.name, _arguments(parser, i, t.function.parameters))
             for i, t in enumerate(tools) if only is None or t.function.name == only]  # fmt: skip
    if parser in tool_markers.PARSERS:  # (tool_choice required or named only)
        body: Any = tool_markers.marked_calls(parser, calls, parallel, tokenizer)
        return _structural_tag(st.StructuralTag(format=body).model_dump_json())
    prefix, begin, end, sep, suffix = FORMATS[parser]
    tags = [st.TagFormat(begin=begin.format(name=name), content=content, end=end)
            for name, content in calls]  # fmt: skip
    if free:
        body = st.TriggeredTagsFormat(
            triggers=[TRIGGERS[parser]], tags=tags, stop_after_first=not parallel
        )
    elif only is not None:
        body = tags[0]
    else:
        body = st.TagsWithSeparatorFormat(
            tags=tags, separator=sep, at_least_one=True, stop_after_first=not parallel
        )
    if prefix or suffix:
        body = st.SequenceFormat(elements=[st.ConstStringFormat(value=prefix), body,
                                           st.ConstStringFormat(value=suffix)])  # fmt: skip
    if answer is not None:
        from pagoda.runtime.structured.compiler import spec_grammar

        try:
            grammar = spec_grammar(answer)
        except ParamError as e:
            raise APIError(400, e.message, param=e.field, code="invalid_value") from e
        body = st.OrFormat(elements=[body, st.GrammarFormat(grammar=str(grammar))])
    return _structural_tag(st.StructuralTag(format=body).model_dump_json())


def _structural_tag(text: str) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(structural_tag=text, field="tools")
    except ParamError as e:
        raise APIError(400, e.message, param="tools", code="invalid_value") from e


def template_messages(
    messages: list[dict[str, Any]], setup: ToolSetup | None, template: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template. A template that renders tools gets them under
    `tool_choice: none` too (vLLM's default, and OpenAI's: the model knows its tools but answers
    in content); Pagoda's own hermes prompt, which asks for calls, only when they are in play."""
    if template_supports_tools(template):
        return [_arguments_as_objects(m) for m in messages], setup.tools if setup else None
    active = setup is not None and setup.choice != "none"
    out = [_hermes_message(m) for m in messages]
    if active:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in setup.tools)
        prompt = HERMES_SYSTEM.format(tools=listed)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content', '')}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


def _arguments_as_objects(m: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's call arguments as objects (templates write them with tojson)."""
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        return m
    fixed = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            # not JSON (or nested past the parser's depth): the template gets the text
            with contextlib.suppress(ValueError, RecursionError):
                fn = {**fn, "arguments": json.loads(fn["arguments"])}
            c = {**c, "function": fn}
        fixed.append(c)
    return {**m, "tool_calls": fixed}


def _hermes_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message for a template without tools: calls and results written out in Hermes form."""
    role = m.get("role")
    if role == "tool":
        return {"role": "user",
                "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"}  # fmt: skip
    calls = m.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        blocks = []
        for c in _arguments_as_objects(m)["tool_calls"]:
            fn = c.get("function", {}) if isinstance(c, dict) else {}
            call = {"name": fn.get("name"), "arguments": fn.get("arguments", {})}
            blocks.append(f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>")
        text = m.get("content") or ""
        content = "\n".join([text, *blocks] if text else blocks)
        return {k: v for k, v in m.items() if k != "tool_calls"} | {"content": content}
    return m
