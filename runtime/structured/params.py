"""StructuredOutputsParams: what a request constrains its output to, validated once at the door.

Named like vLLM's `StructuredOutputsParams` (and its HTTP extra `structured_outputs`): exactly
one of `json` (a JSON Schema), `json_object`, `regex`, `choice`, `grammar` (EBNF / GBNF, or Lark)
or `structural_tag` (xgrammar's). The OpenAI `response_format` maps onto `json` / `json_object`,
and tool calling onto a `grammar` built by the server.

Torch- and xgrammar-free: a spec is plain, hashable data. `key` is what the grammar cache is
keyed on (with the tokenizer); `field` names the request field the spec came from, so that a
schema that fails to compile is answered with a 400 naming that field. The compiled grammar
rides along in `compiled` (set by the server after compiling off the event loop; the offline
`LLM` path leaves it None and the engine compiles on first use).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.sampling.params import ParamError

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
MAX_SPEC_CHARS = 1 << 20  # a schema, regex or grammar longer than this is refused (400)
MAX_CHOICES = 1024


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | None = None  # JSON Schema text (a dict or bool schema is serialised once)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # EBNF (GBNF, as llama.cpp / xgrammar), or Lark without `::=`
    structural_tag: str | None = None  # xgrammar structural tag (JSON text)
    # No free whitespace between JSON tokens (vLLM's `disable_any_whitespace`, default on here:
    # small models otherwise loop on newlines); False allows up to `MAX_WHITESPACE` per run.
    disable_any_whitespace: bool = True
    field: str = dataclasses.field(
        default="structured_outputs", compare=False
    )  # the request's field
    # The constraint the client asked for, where this spec wraps it (a reasoning model's answer
    # grammar is a structural tag: server/reasoning.py): the metrics' label; None: `kind`
    asked: str | None = dataclasses.field(default=None, compare=False)
    compiled: Any = dataclasses.field(
        default=None, compare=False, repr=False
    )  # xgrammar CompiledGrammar

    def __post_init__(self) -> None:
        if self.json is not None and not isinstance(self.json, str):
            object.__setattr__(self, "json", _schema_text(self.json, self.field))
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice, self.field))
        if self.structural_tag is not None and not isinstance(self.structural_tag, str):
            object.__setattr__(self, "structural_tag", _dump(self.structural_tag, self.field))
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            what = "none" if not given else ", ".join(given)
            raise ParamError(
                self.field,
                f"{self.field} must set exactly one of {', '.join(KINDS)} (got {what})",
            )
        for k in ("json", "regex", "grammar", "structural_tag"):
            value = getattr(self, k)
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                raise ParamError(self.field, f"{self.field}: {k} must be a non-empty string")
            if len(value) > MAX_SPEC_CHARS:
                raise ParamError(
                    self.field, f"{self.field}: {k} is longer than {MAX_SPEC_CHARS} characters"
                )
        if not isinstance(self.disable_any_whitespace, bool):
            raise ParamError(self.field, f"{self.field}: disable_any_whitespace must be a boolean")

    @property
    def kind(self) -> str:
        """Which constraint this is: one of `KINDS` (the metric label, too)."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def compact_json(self) -> bool:
        """JSON without free whitespace: its text never holds a byte below 0x20."""
        return self.kind in ("json", "json_object") and self.disable_any_whitespace

    @property
    def key(self) -> tuple:
        """What identifies the compiled grammar (for one tokenizer)."""
        value = getattr(self, self.kind)
        return (self.kind, value, self.disable_any_whitespace)

    def with_compiled(self, compiled: Any) -> StructuredOutputsParams:
        """This spec carrying its compiled grammar."""
        return dataclasses.replace(self, compiled=compiled)


def _dump(value: Any, where: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ParamError(where, f"{where} is not serialisable as JSON: {e}") from e


def _schema_text(schema: Any, where: str) -> str:
    """A JSON Schema (object or boolean) as compact JSON text (property order kept: it is the
    order the output writes them in)."""
    if not isinstance(schema, (dict, bool)):
        raise ParamError(where, f"{where} must be a JSON Schema object")
    return _dump(schema, where)


def _choices(choice: Any, where: str) -> tuple[str, ...]:
    if isinstance(choice, str) or not isinstance(choice, (list, tuple)):
        raise ParamError(where, f"{where}: choice must be a list of strings")
    if not choice or len(choice) > MAX_CHOICES:
        raise ParamError(where, f"{where}: choice must hold 1 to {MAX_CHOICES} strings")
    if any(not isinstance(c, str) or not c for c in choice):
        raise ParamError(where, f"{where}: choice entries must be non-empty strings")
    if sum(map(len, choice)) > MAX_SPEC_CHARS:
        raise ParamError(where, f"{where}: choice is longer than {MAX_SPEC_CHARS} characters")
    return tuple(choice)


def parse_schema_text(text: str, where: str) -> Any:
    """The JSON value of a schema given as text (400 naming `where` when it is not JSON)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ParamError(where, f"{where} is not valid JSON: {e}") from e
