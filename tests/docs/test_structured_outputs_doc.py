"""docs/structured-outputs.md's SDK examples, run as written (only the port differs) with the
`openai` SDK against `pagoda serve` on the embedded model, one namespace for all blocks as a
reader pasting them into one session would have."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "structured-outputs.md"
DEFAULT_BASE = "127.0.0.1:8000"
CALLS = {"create", "parse", "stream"}  # client.chat.completions.* / client.completions.*


def python_blocks() -> list[tuple[int, str]]:
    """(line of the opening fence, code) of every ```python block."""
    text = PAGE.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m[1])
        for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)
    ]


def requests_without_a_budget(code: str) -> list[str]:
    """The SDK calls in `code` that send a request without `max_tokens`."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in CALLS or "completions" not in ast.unparse(node.func.value):
            continue
        if not {k.arg for k in node.keywords} & {"max_tokens", "max_completion_tokens"}:
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_the_budget_check_sees_calls() -> None:
    assert requests_without_a_budget("client.chat.completions.create(model=M)") == [
        "line 1: client.chat.completions.create(...)"
    ]
    assert requests_without_a_budget("client.completions.create(model=M, max_tokens=5)") == []
    assert sum(len(re.findall(r"completions\.(?:create|parse)", b)) for _, b in python_blocks()) > 5


def test_every_request_sets_max_tokens() -> None:
    """Without a budget a request on the embedded model may run to the end of its 8,192-token
    context at OpenAI's default temperature (minutes on a CPU: the page would seem to hang)."""
    missing = [
        f"block at line {line}, {call}"
        for line, code in python_blocks()
        for call in requests_without_a_budget(code)
    ]
    assert missing == [], "\n".join(missing)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_sdk_examples_run_as_written(served: str) -> None:
    pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    ns: dict = {"__name__": "docs_example"}
    printed: list[list[str]] = []
    after: list[dict] = []  # the names after each block (later blocks reuse `tools`, `r`)
    for line, code in python_blocks():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(on(served, code), f"{PAGE.name}:{line}", "exec"), ns)
        printed.append(out.getvalue().splitlines())
        after.append(dict(ns))
    assert len(printed) == 7, "a block was added or removed: check what this test asserts"
    (city_json,) = printed[1]  # the json_schema example prints its content: schema-valid JSON
    jsonschema.validate(json.loads(city_json), after[1]["schema"])
    assert isinstance(after[2]["city"], after[2]["City"])  # parse() gave the pydantic model
    name, arguments = printed[4][0].split(" ", 1)  # `required`: a call with valid arguments
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), after[4]["tools"][0]["function"]["parameters"])
    message = after[5]["message"]  # tools with a response_format: calls or the parsed Report
    assert message.tool_calls or isinstance(message.parsed, after[5]["Report"]), message
    assert printed[6] and printed[6][0].startswith("0 get_weather"), printed[6]


def on(base: str, code: str) -> str:
    """The code with `make serve`'s address replaced by the test server's."""
    return code.replace(DEFAULT_BASE, base)


def test_the_examples_talk_to_make_serves_address() -> None:
    (first, *_) = python_blocks()
    assert f'base_url="http://{DEFAULT_BASE}/v1"' in first[1]
