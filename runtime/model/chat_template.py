"""The Jinja environment chat templates are rendered in: transformers' own (what the models'
templates are written and tested against), sandboxed.

As `transformers.utils.chat_template_utils` sets it up: `trim_blocks`/`lstrip_blocks`, the
`loopcontrols` extension (`{% break %}`, `{% continue %}`), a `{% generation %}` block (which
transformers uses to find the assistant's tokens for training; here its body is rendered as
is), `tojson` without HTML escapes, `raise_exception` and `strftime_now` (Llama 3.2's and
Mistral's templates write today's date with it; without it they fell back to a date fixed in
the template, so the prompt differed from the one transformers and vLLM render).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: the body, rendered as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = _strftime_now
    return env
