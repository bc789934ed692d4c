"""Validate custom resources against the CRD's own schema, the way the API server would.

* OpenAPI v3 structural schema via jsonschema (Draft 4 semantics, as Kubernetes uses), made
  strict: objects with `properties` reject unknown fields unless they preserve them (what
  `kubectl apply` gets from the server's strict field validation);
* the `x-kubernetes-validations` CEL rules, evaluated with cel-python on every node they guard;
* structural defaulting (`apply_defaults`), to compare defaulted and raw specs.

Messages read like the API server's: `spec.autoscaling: minReplicas must be <= maxReplicas`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import celpy
import jsonschema


def version_schema(crd: Mapping[str, Any], version: str = "v1alpha1") -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


def strict(schema: Any) -> Any:
    """A copy of the schema where objects with declared properties reject unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _path(parts: Any) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "<root>"


def schema_errors(schema: Mapping[str, Any], doc: Any) -> list[str]:
    validator = jsonschema.Draft4Validator(strict(schema))
    return [
        f"{_path(e.absolute_path)}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


def _cel_nodes(schema: Mapping[str, Any], doc: Any, path: list[Any]):
    if not isinstance(schema, Mapping):
        return
    if schema.get("x-kubernetes-validations"):
        yield path, schema["x-kubernetes-validations"], doc
    if isinstance(doc, Mapping):
        for key, sub in (schema.get("properties") or {}).items():
            if key in doc:
                yield from _cel_nodes(sub, doc[key], [*path, key])
    if isinstance(doc, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(doc):
            yield from _cel_nodes(schema["items"], item, [*path, i])


@functools.cache
def _program(rule: str) -> Any:
    """A rule compiled once per session (compiling is most of a validation's time)."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(schema: Mapping[str, Any], doc: Any) -> list[str]:
    errors = []
    for path, rules, value in _cel_nodes(schema, doc, []):
        activation = {"self": celpy.json_to_cel(value)}
        for rule in rules:
            try:
                result = _program(rule["rule"]).evaluate(activation)
                ok = isinstance(result, celpy.celtypes.BoolType) and bool(result)
            except celpy.CELEvalError:
                ok = False
            if not ok:
                errors.append(
                    f"{_path(path)}: {rule.get('message') or 'failed rule: ' + rule['rule']}"
                )
    return errors


def validate(crd: Mapping[str, Any], doc: Mapping[str, Any]) -> list[str]:
    """All problems with `doc` as a custom resource of `crd` (empty when valid)."""
    group = crd["spec"]["group"]
    errors = []
    api_version = doc.get("apiVersion", "")
    if api_version.split("/")[0] != group or doc.get("kind") != crd["spec"]["names"]["kind"]:
        errors.append(f"apiVersion/kind: expected {group}/... {crd['spec']['names']['kind']}")
    version = api_version.split("/")[-1]
    schema = version_schema(crd, version)
    errors += schema_errors(schema, doc)
    if not errors:  # CEL rules run on schema-valid objects only (as in the API server)
        errors += cel_errors(schema, doc)
    return errors


def apply_defaults(schema: Mapping[str, Any], doc: Any) -> Any:
    """Structural defaulting: fill `default`s of absent properties of present objects."""
    if isinstance(doc, Mapping) and schema.get("properties"):
        out = dict(doc)
        for key, sub in schema["properties"].items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(sub, out[key])
        return out
    if isinstance(doc, list) and isinstance(schema.get("items"), Mapping):
        return [apply_defaults(schema["items"], item) for item in doc]
    return doc


def defaults(schema: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every declared default as {dotted.path: value}."""
    found: dict[str, Any] = {}
    for key, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if "default" in sub:
            found[path] = sub["default"]
        found |= defaults(sub, path)
    return found
