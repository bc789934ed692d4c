"""Structural tags (xgrammar's `structural_tag` spec) checked as every other spec is, before
xgrammar compiles them.

* vLLM's older form, `{"type": "structural_tag", "structures": [{"begin", "schema", "end"}],
  "triggers": [...]}` (the one vLLM's docs show, which vLLM compiles through xgrammar's
  deprecated API), is read as the triggered tags it means: any text, and where a trigger is
  written, one of the structures (its begin, JSON matching its schema, its end).
* Every JSON Schema inside (`json_schema` and `qwen_xml_parameter` formats) goes through
  `schema.check`, and every `regex` format's pattern through `check_pattern`: xgrammar compiles
  them as loosely inside a tag as alone (`uniqueItems`, `propertyNames` without a type, ...),
  so they are rewritten or refused with a 400 naming where, as a `json` spec's are.
"""

from __future__ import annotations

import json
from typing import Any

from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.structured import schema as schemas
from pagoda.runtime.structured.pattern_check import check_pattern

SCHEMA_FORMATS = ("json_schema", "qwen_xml_parameter")


def normalise(text: str, where: str) -> str:
    """The structural tag `text` checked (ParamError naming `where`), as JSON text."""
    try:
        tag = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ParamError(where, f"{where} is not valid JSON: {e}") from e
    if isinstance(tag, dict) and "structures" in tag and "format" not in tag:
        tag = _from_structures(tag, where)
    try:
        return json.dumps(_checked(tag, ""), ensure_ascii=False)
    except schemas.SchemaError as e:
        raise ParamError(where, f"{where}: {e}") from e
    except RecursionError as e:
        raise ParamError(where, f"{where} is nested too deeply") from e


def _from_structures(tag: dict, where: str) -> dict:
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ParamError(where, f"{where}: structures and triggers must be lists")
    tags = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict) or any(k not in s for k in ("begin", "schema", "end")):
            raise ParamError(where, f"{where}: structures[{i}] must have begin, schema and end")
        tags.append({"type": "tag", "begin": s["begin"], "end": s["end"],
                     "content": {"type": "json_schema", "json_schema": s["schema"]}})  # fmt: skip
    return {"type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}  # fmt: skip


def _checked(node: Any, path: str) -> Any:
    """`node` with the schemas and patterns inside it checked (`path`: where, for errors)."""
    if isinstance(node, list):
        return [_checked(v, f"{path}/{i}") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in SCHEMA_FORMATS and "json_schema" in node:
        try:  # a tag's masks are not held to printable bytes: length bounds as patterns
            return {**node, "json_schema": schemas.check(node["json_schema"], length_patterns=True)}
        except schemas.SchemaError as e:
            raise schemas.SchemaError(None, f"{e} in the schema at {path}/json_schema") from e
    if kind == "regex" and isinstance(node.get("pattern"), str):
        check_pattern(node["pattern"], f"{path}/pattern")
        return node
    return {k: _checked(v, f"{path}/{k}") for k, v in node.items()}
