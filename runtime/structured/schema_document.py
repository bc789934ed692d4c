"""Checks of a normalised JSON Schema as a whole document, following its local `$ref`s, for
`schema.check` (which rewrites each subschema in place of itself first):

* some finite value satisfies the schema (`Finite`: a required property or `minItems` that
  refers back to its own schema with no way to stop allows none);
* every `oneOf` is exclusive (xgrammar compiles an overlapping one as `anyOf`);
* every `propertyNames` allows strings only, and the `properties` names it refuses are left out
  (xgrammar writes whatever value the key schema allows as the key, unquoted).

Also the walk over a schema's subschemas (`subschemas`) and local references followed (`deref`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import jsonschema
from pagoda.runtime.structured.schema_rewrites import SchemaError

COMBINED = {"$ref", "enum", "const", "anyOf", "oneOf", "allOf"}
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_ONE = ("additionalProperties", "items", "propertyNames")


def string_keys(root: Any) -> None:
    """Every `propertyNames` of the normalised schema held to strings, in place. xgrammar
    writes whatever value a `propertyNames` schema allows as the key, unquoted (`{true: 1}`,
    `{1: 2}`: not JSON), so an untyped one (typed with every type by `schema.check`), a `$ref`
    to one, a type list or an `enum` with other values would let it write invalid JSON. A key
    schema is inlined and typed `string`; `true` (any name) is dropped."""
    for path, s in list(subschemas(root, "")):
        if "propertyNames" not in s:
            continue
        names = deref(root, s["propertyNames"])
        if names is True:
            del s["propertyNames"]
        elif isinstance(names, dict):
            s["propertyNames"] = _as_key(names, root, f"{path}/propertyNames")
            _listed_names_as_keys(s, root, path)


def _listed_names_as_keys(s: dict, root: Any, path: str) -> None:
    """`properties` names that `propertyNames` refuses left out of `s`, in place (xgrammar
    wrote them: `{"ABC": 1}` beside `"propertyNames": {"pattern": "^[a-z]+$"}`); no name can
    then be written, as propertyNames holds for every other name too. A required one: refused
    (no object satisfies the schema)."""
    props = s.get("properties")
    if not isinstance(props, dict) or not props:
        return
    cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    try:
        keys = cls(root, format_checker=cls.FORMAT_CHECKER).evolve(schema=s["propertyNames"])
        refused = [n for n in props if not keys.is_valid(n)]
    except Exception as e:  # a reference the validator cannot follow
        raise SchemaError(f"{path}/propertyNames", "propertyNames beside properties could not "
                          f"be checked against the listed names: {e}") from e  # fmt: skip
    required = [n for n in refused if n in (s.get("required") or ())]
    if required:
        raise SchemaError(f"{path}/required", f"required property {required[0]!r} does not "
                          "satisfy propertyNames: no object can satisfy this schema")  # fmt: skip
    if refused:
        s["properties"] = {n: v for n, v in props.items() if n not in refused}


def _as_key(s: dict, root: Any, path: str) -> dict:
    """A property-name schema allowing strings only (SchemaError if it allows none)."""
    out = dict(s)
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [_as_key(b, root, f"{path}/{key}/{i}")
                        for i, b in enumerate(deref(root, b) for b in out[key])
                        if isinstance(b, dict)]  # fmt: skip
    if "const" in out and not isinstance(out["const"], str):
        raise SchemaError(f"{path}/const", "property names are strings: this schema allows none")
    if isinstance(out.get("enum"), list):
        out["enum"] = [v for v in out["enum"] if isinstance(v, str)]
        if not out["enum"]:
            raise SchemaError(f"{path}/enum", "property names are strings: this schema allows "
                              "none")  # fmt: skip
    kinds = out.get("type")
    if kinds is None and not COMBINED & out.keys() - {"$ref"}:
        out["type"] = "string"
    elif kinds is not None:
        if "string" not in ([kinds] if isinstance(kinds, str) else kinds):
            raise SchemaError(f"{path}/type", "property names are strings: this schema allows "
                              "none")  # fmt: skip
        out["type"] = "string"
    return out


def check_one_ofs(root: Any) -> None:
    """Every `oneOf` of the normalised schema checked (its `$ref` branches followed)."""
    for path, s in subschemas(root, ""):
        if isinstance(s.get("oneOf"), list):
            _check_one_of(s["oneOf"], f"{path}/oneOf", root)


def _check_one_of(branches: list, path: str, root: Any = None) -> None:
    """oneOf is enforced exactly only when at most one branch can match any value: here, when
    the branches have distinct single types (integer and number overlap), or are objects told
    apart by a required property whose allowed values (`const` or `enum`, as pydantic's
    discriminated unions write them) no two branches share. `$ref` branches are followed."""
    branches = [deref(root, b) for b in branches]
    types = [b.get("type") if isinstance(b, dict) else None for b in branches]
    if all(isinstance(t, str) for t in types):
        kinds = ["number" if t == "integer" else t for t in types]
        if len(set(kinds)) == len(kinds):
            return
    if all(isinstance(b, dict) and b.get("type") == "object" for b in branches):
        common = set.intersection(*(set(b.get("required", ())) for b in branches))
        for name in sorted(common):
            values = [_values(deref(root, (b.get("properties") or {}).get(name))) for b in branches]
            if None in values:
                continue
            seen: list = []
            for vs in values:
                if any(v == w and isinstance(v, bool) == isinstance(w, bool)  # JSON equality
                       for v in vs for w in seen):  # fmt: skip
                    break
                seen += vs
            else:
                return
    raise SchemaError(
        path,
        "oneOf is supported only when its branches cannot overlap (distinct types, or a "
        "required property with distinct const or enum values per branch); use anyOf otherwise",
    )


def _values(s: Any) -> list | None:
    """The values a schema allows when it lists them (`const`, `enum`), else None."""
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return [s["const"]]
    if isinstance(s.get("enum"), list):
        return list(s["enum"])
    return None


class Finite:
    """Whether some finite value satisfies a schema. Only `$ref` makes a schema recursive, so
    the references' answers are found as a least fixpoint (all "no" until shown otherwise);
    keywords are read the way xgrammar writes them (an untyped schema with `required` is an
    object)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.known: dict[str, bool] = {}

    def ok(self) -> bool:
        refs = sorted(set(_refs(self.root)))
        self.known = dict.fromkeys(refs, False)
        changed = True
        while changed:
            changed = False
            for ref in refs:
                if not self.known[ref] and self.value(_resolve(self.root, ref)):
                    self.known[ref] = changed = True
        return self.value(self.root)

    def value(self, s: Any) -> bool:
        if not isinstance(s, dict):
            return s is not False
        if isinstance(s.get("$ref"), str):
            return self.known.get(s["$ref"], True)
        if "enum" in s or "const" in s:
            return True
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and not any(self.value(b) for b in s[key]):
                return False
        if isinstance(s.get("allOf"), list) and not all(self.value(b) for b in s["allOf"]):
            return False
        kinds = s.get("type")
        if kinds is None:
            if "required" in s or "properties" in s:
                kinds = ["object"]
            elif "items" in s or "prefixItems" in s or "minItems" in s:
                kinds = ["array"]
            else:
                return True
        kinds = [kinds] if isinstance(kinds, str) else kinds
        return any(self._kind(s, k) for k in kinds)

    def _kind(self, s: dict, kind: str) -> bool:
        if kind == "object":
            props, extra = s.get("properties") or {}, s.get("additionalProperties", True)
            return all(self.value(props.get(name, extra)) for name in s.get("required") or ())
        if kind == "array":
            need, prefix = s.get("minItems", 0), s.get("prefixItems") or []
            if not all(self.value(b) for b in prefix[:need]):
                return False
            return need <= len(prefix) or self.value(s.get("items", True))
        return True


def _refs(s: Any):
    if isinstance(s, dict):
        if isinstance(s.get("$ref"), str):
            yield s["$ref"]
        for v in s.values():
            yield from _refs(v)
    elif isinstance(s, list):
        for v in s:
            yield from _refs(v)


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local reference points at (True where it cannot be found: xgrammar
    reports that itself)."""
    node = root
    for part in ref[2:].split("/") if ref.startswith("#/") else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return True
    return node


def subschemas(s: Any, path: str):
    """(path, schema) of `s` and every schema inside it (not `enum`/`const` data)."""
    if not isinstance(s, dict):
        return
    yield path, s
    for key in SCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            for k, v in s[key].items():
                yield from subschemas(v, f"{path}/{key}/{k}")
    for key in SCHEMA_LISTS:
        if isinstance(s.get(key), list):
            for i, v in enumerate(s[key]):
                yield from subschemas(v, f"{path}/{key}/{i}")
    for key in SCHEMA_ONE:
        yield from subschemas(s.get(key), f"{path}/{key}")


def deref(root: Any, s: Any) -> Any:
    """`s` with local `$ref`s followed (a few hops; what cannot be followed is left)."""
    for _ in range(32):
        if not (isinstance(s, dict) and isinstance(s.get("$ref"), str)):
            break
        target = _resolve(root, s["$ref"])
        if target is True or target is s:
            break
        s = target
    return s
