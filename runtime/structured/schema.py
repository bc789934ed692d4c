"""JSON Schemas checked and normalised before xgrammar compiles them, so that every output the
grammar allows validates against the schema the client sent.

xgrammar (0.2.x) compiles some keywords loosely without an error: it ignores `uniqueItems`,
`not`, `if`/`then`/`else`, `multipleOf` on numbers, `contains`, `dependentRequired`/
`dependentSchemas`, `minLength` and `maxLength` beside a `pattern`, the second branch of an
`allOf`, `required` names that are not in `properties`, `pattern`/`minLength`/`maxLength`
beside a `format` it writes itself, the `patternProperties` schema of a name `properties` lists,
the `format: "regex"` assertion; it writes integers beyond 64 bits in `enum`/`const` as floats,
reads `\\A`/`\\Z` as letters, writes `properties` names `propertyNames` refuses, allowed an
empty value for a number range with no number of 6 decimals, and turns an overlapping `oneOf`
into `anyOf`. A grammar that allows invalid output is worse than a refusal, so (as vLLM does for
features its xgrammar backend lacks):

* what can be said exactly in keywords xgrammar enforces is rewritten (`schema_rewrites.py`):
  `allOf` of compatible object schemas is merged; a `required` name missing from `properties`
  gets an open schema there; lengths already implied by a pattern are dropped, or folded into
  a repeated class's count; a number schema with a whole `multipleOf` becomes an integer one;
  a pattern's '"', backslashes and control characters match their JSON escapes
  (`pattern_escapes.py`);
* what cannot is refused: `check` raises `SchemaError(path, message)`, a 400 naming the keyword
  (this module walks the schema, refuses what has no rewrite and checks patterns
  (`pattern_check.py`); `schema_document.py` then checks the whole schema, references
  followed: `oneOf`, property names, and that some finite value satisfies it).

The schema itself is first checked against its metaschema with `jsonschema` (bad types,
unknown `type` names, a non-regex `pattern`): also a 400 with the path.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

import jsonschema
from pagoda.runtime.structured import pattern_escapes
from pagoda.runtime.structured.pattern_check import check_pattern
from pagoda.runtime.structured.schema_document import (
    COMBINED,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_ONE,
    Finite,
    check_one_ofs,
    string_keys,
)
from pagoda.runtime.structured.schema_rewrites import (
    ASSERTIONS,
    FORMAT_LENGTHS,
    FORMAT_PATTERNS,
    FORMAT_SUBSETS,
    SchemaError,
    distribute,
    enum_within,
    fill_required,
    format_lengths,
    in_new_spellings,
    merge_all_of,
    multiple_of,
    optional_groups_as_alternatives,
    pattern_lengths,
)

# Keywords whose constraint xgrammar does not enforce (see the module docstring).
UNSUPPORTED = {
    "uniqueItems": "uniqueItems: true",
    "not": "not",
    "if": "if/then/else",
    "then": "if/then/else",
    "else": "if/then/else",
    "contains": "contains",
    "minContains": "minContains",
    "maxContains": "maxContains",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
    "unevaluatedItems": "unevaluatedItems",
    "unevaluatedProperties": "unevaluatedProperties",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
}
# xgrammar's compile time grows with the cube of an object's optional properties (here: 256 in
# 0.06 s, 1000 in 3 s, 2000 in 36 s; 10000, extrapolated, over an hour on a thread nobody can
# stop): bounded
MAX_OPTIONAL_PROPERTIES = 256  # per object
MAX_PROPERTIES = 4096  # in a whole schema (4000 required ones compile in about 1 s)
NUMBER_DECIMALS = 6  # decimal places xgrammar (0.2.x) writes in a number with a range
# keywords of one type that xgrammar drops from a schema without `type`
_TYPED_KEYWORDS = {"minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                   "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
                   "minProperties", "maxProperties"}  # fmt: skip
_ANY_TYPE = ("string", "number", "boolean", "null", "object", "array")
_LOCAL_REF = re.compile(r"^#(?:/.*)?$", re.DOTALL)


def check(schema: Any, length_patterns: bool = False) -> Any:
    """The schema checked against its metaschema and normalised for xgrammar (a new object;
    the argument is not changed); SchemaError for what cannot be enforced. `length_patterns`:
    strings with minLength/maxLength become patterns of as many characters (for grammars whose
    masks cannot rule out control bytes: xgrammar lets such strings hold them raw)."""
    if isinstance(schema, bool):
        if not schema:
            raise SchemaError("", "the schema `false` allows no output")
        return schema
    check_valid(schema)
    try:
        out = _normalise(schema, "", length_patterns)
        string_keys(out)
        check_one_ofs(out)
        total = _count_properties(out)
    except RecursionError as e:
        raise SchemaError("", "the schema is nested too deeply") from e
    if total > MAX_PROPERTIES:
        raise SchemaError("", f"the schema lists {total} properties, more than the "
                          f"{MAX_PROPERTIES} constrained decoding compiles in time")  # fmt: skip
    if not Finite(out).ok():
        raise SchemaError("", "no finite JSON value satisfies this schema: a required property "
                          "or minItems refers back to the schema with no way to stop")  # fmt: skip
    return out


def _count_properties(s: Any) -> int:
    if isinstance(s, list):
        return sum(_count_properties(v) for v in s)
    if not isinstance(s, dict):
        return 0
    own = len(s["properties"]) if isinstance(s.get("properties"), dict) else 0
    return own + sum(_count_properties(v) for v in s.values() if isinstance(v, (dict, list)))


def check_valid(schema: Any) -> None:
    """SchemaError unless `schema` is a JSON Schema (an object or a boolean) that its
    metaschema accepts (whether or not constrained decoding could enforce it)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError("", "a JSON Schema must be an object or a boolean")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/" + "/".join(map(str, e.absolute_path))
        raise SchemaError(where, f"invalid JSON Schema: {e.message}") from e
    except RecursionError as e:
        raise SchemaError("", "the schema is nested too deeply") from e


def _normalise(s: Any, path: str, lp: bool = False) -> Any:
    if not isinstance(s, dict):
        return s
    s = in_new_spellings(s)
    _refuse_unsupported(s, path)
    out = dict(s)
    for key in SCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            out[key] = {k: _normalise(v, f"{path}/{key}/{k}", lp) for k, v in s[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(s.get(key), list):
            out[key] = [_normalise(v, f"{path}/{key}/{i}", lp) for i, v in enumerate(s[key])]
    for key in SCHEMA_ONE:
        if isinstance(s.get(key), dict):
            out[key] = _normalise(s[key], f"{path}/{key}", lp)
    if "allOf" in out:
        out = merge_all_of(out, path)
    if "$ref" in out and _assertions(out, "$ref"):
        raise SchemaError(f"{path}/{_assertions(out, '$ref')[0]}", "keywords beside $ref are "
                          "not supported (xgrammar ignores them); move them into the "
                          "referenced schema")  # fmt: skip
    if ("enum" in out or "const" in out) and (
        _assertions(out, "enum", "const") or ("enum" in out and "const" in out)
    ):
        return enum_within(s, out, path)
    if "anyOf" in out or "oneOf" in out:
        out = distribute(out, path, lambda b, where: _normalise(b, where, lp))
    fill_required(out, path)
    _check_pattern_overlap(out, path)
    _check_min_properties(out, path)
    _drop_forbidden_properties(out)
    props = out.get("properties")
    if isinstance(props, dict) and len(props) > MAX_OPTIONAL_PROPERTIES:
        optional = len(set(props) - set(out.get("required") or ()))
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise SchemaError(f"{path}/properties", f"{optional} optional properties in one "
                              f"object: constrained decoding compiles at most "
                              f"{MAX_OPTIONAL_PROPERTIES} in time; make more of them required "
                              "or nest them")  # fmt: skip
    if "type" not in out and _TYPED_KEYWORDS & out.keys() and not COMBINED & out.keys():
        # xgrammar reads an untyped schema as any value and drops these keywords: as a list of
        # every type it applies each keyword to its own type (the others are unconstrained)
        out["type"] = list(_ANY_TYPE)
    if "multipleOf" in out:
        out = multiple_of(out, path)
    _check_number_range(out, path)
    return _string_keywords(out, s, path, lp)


def _refuse_unsupported(s: dict, path: str) -> None:
    """SchemaError for what constrained decoding cannot enforce in `s` itself: an `UNSUPPORTED`
    keyword, a `$ref` outside the document, a pattern the grammar cannot hold."""
    for key, what in UNSUPPORTED.items():
        if key in s and not (key == "uniqueItems" and s[key] is False):
            raise SchemaError(f"{path}/{key}", f"{what} is not supported by constrained decoding")
    if "$ref" in s and not _LOCAL_REF.match(str(s["$ref"])):
        raise SchemaError(f"{path}/$ref", "only local JSON pointer references (#/...) are "
                          "supported")  # fmt: skip
    for key in ("const", "enum"):
        if key in s and _huge_int(s[key]):
            raise SchemaError(f"{path}/{key}", f"integers beyond 64 bits in {key} are not "
                              "supported by constrained decoding (it writes them as floats: "
                              "1.2345678901234568e+29)")  # fmt: skip
    kinds = s.get("type", "string")
    if s.get("format") == "regex" and "string" in (kinds if isinstance(kinds, list) else [kinds]):
        # xgrammar lets any string through (a regex's syntax is no regular language), while the
        # `jsonschema` format checker refuses "(" as a regex
        raise SchemaError(f"{path}/format", 'format "regex" is not supported by constrained '
                          "decoding (use a pattern)")  # fmt: skip
    if isinstance(s.get("pattern"), str):  # '"', '\\' and controls: `pattern_escapes`
        check_pattern(s["pattern"], f"{path}/pattern")
    for key in s.get("patternProperties") or ():
        check_pattern(key, f"{path}/patternProperties", in_json=True)


def _check_number_range(s: dict, path: str) -> None:
    """SchemaError for a number range holding no number of at most `NUMBER_DECIMALS` decimal
    places: xgrammar writes numbers in a range with that many at most, and for such a range its
    grammar allowed an empty value (`{"v": }`, not JSON) rather than none."""
    kinds = s.get("type")
    if "number" not in ([kinds] if isinstance(kinds, str) else kinds or ()):
        return
    lows = [(k, s[k]) for k in ("minimum", "exclusiveMinimum") if _is_number(s.get(k))]
    highs = [(k, s[k]) for k in ("maximum", "exclusiveMaximum") if _is_number(s.get(k))]
    if not lows or not highs:
        return
    step = Decimal(1).scaleb(-NUMBER_DECIMALS)
    # the least multiple of `step` above every lower bound, and whether it is below the upper
    least = max((Decimal(repr(v)) / step).to_integral_value(ROUND_FLOOR) + 1
                if k == "exclusiveMinimum" else (Decimal(repr(v)) / step).to_integral_value(
                    ROUND_CEILING) for k, v in lows) * step  # fmt: skip
    if all(least < Decimal(repr(v)) if k == "exclusiveMaximum" else least <= Decimal(repr(v))
           for k, v in highs):  # fmt: skip
        return
    key = highs[0][0]
    raise SchemaError(f"{path}/{key}", f"no number of at most {NUMBER_DECIMALS} decimal places "
                      "lies in this range, and constrained decoding writes numbers in a range "
                      f"with at most {NUMBER_DECIMALS}; widen the range")  # fmt: skip


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _huge_int(value: Any) -> bool:
    """Whether a JSON value holds an integer outside int64 (xgrammar's `const`/`enum` writes
    those as floats, which `json.loads` reads as another value)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return not -(1 << 63) <= value < (1 << 63)
    if isinstance(value, dict):
        return any(_huge_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_huge_int(v) for v in value)
    return False


def _string_keywords(out: dict, s: dict, path: str, lp: bool) -> dict:
    """`out` (normalised from `s`) with its string keywords as xgrammar enforces them: a format
    it does not know as the one it does or as a pattern, lengths folded into the pattern (`lp`:
    lengths as a pattern even without one), optional groups as alternatives."""
    written = out.get("format")  # the schema's (or a merged allOf branch's) own name
    if written in FORMAT_SUBSETS:
        out["format"] = FORMAT_SUBSETS[written]
    kinds = out.get("type")
    strings = "string" in ([kinds] if isinstance(kinds, str) else kinds or ())
    if out.get("format") in FORMAT_PATTERNS and strings:
        if "pattern" in out:  # xgrammar would keep one of the two
            raise SchemaError(f"{path}/pattern", f'pattern beside format "{written}" is not '
                              "supported (constrained decoding would enforce only one of them); "
                              "keep one")  # fmt: skip
        out = {k: v for k, v in out.items() if k != "format"}
        out["pattern"] = FORMAT_PATTERNS[written]
    elif out.get("format") in FORMAT_LENGTHS and strings:
        out = format_lengths(out, path)
    if "pattern" in out and ("minLength" in out or "maxLength" in out):
        out = pattern_lengths(out, path)
    elif lp and ("minLength" in out or "maxLength" in out):
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", None)
        out["pattern"] = f"^.{{{lo},{'' if hi is None else hi}}}$"
    if isinstance(out.get("pattern"), str):
        out["pattern"] = optional_groups_as_alternatives(out["pattern"])
        out["pattern"] = pattern_escapes.escape(out["pattern"], f"{path}/pattern")
        out["pattern"] = pattern_escapes.python_whitespace(out["pattern"])
    if isinstance(out.get("patternProperties"), dict):
        out["patternProperties"] = {optional_groups_as_alternatives(k): v
                                    for k, v in out["patternProperties"].items()}  # fmt: skip
    return out


def _check_pattern_overlap(s: dict, path: str) -> None:
    """SchemaError for a listed property whose name a `patternProperties` pattern also matches,
    under another schema: its value must satisfy both, but xgrammar writes it under the
    `properties` schema alone (`{"ab": "x"}` beside `"^a": {"type": "integer"}`)."""
    props, patterns = s.get("properties"), s.get("patternProperties")
    if not isinstance(props, dict) or not isinstance(patterns, dict):
        return
    for pattern, sub in patterns.items():
        if sub in (True, {}):
            continue
        try:
            matched = [n for n in props if props[n] != sub and re.search(pattern, n)]
        except re.error:  # not Python's dialect: xgrammar's parser reports it
            continue
        if matched:
            raise SchemaError(f"{path}/patternProperties", f"property {matched[0]!r} also "
                              f"matches patternProperties {pattern!r}, whose schema differs: its "
                              "value must satisfy both, which constrained decoding does not "
                              "combine; write the combined schema under properties, or use a "
                              "pattern that does not match the name")  # fmt: skip


def _check_min_properties(s: dict, path: str) -> None:
    """SchemaError for a `minProperties` that only names beyond the required ones can meet, in
    an object that allows other names: xgrammar cannot keep those distinct (`{"a": 1, "a": 2}`,
    one property once parsed), so it would count a name written twice as two. The required
    properties (listed, each written once) and closed objects are counted exactly."""
    extra = s.get("additionalProperties")
    names_open = isinstance(extra, dict) or extra is True or "patternProperties" in s or (
        "propertyNames" in s)  # fmt: skip
    least = s.get("minProperties")
    if names_open and isinstance(least, int) and least > len(set(s.get("required") or ())):
        raise SchemaError(f"{path}/minProperties", "minProperties beyond the required "
                          "properties is not supported where other names are allowed "
                          "(additionalProperties, patternProperties, propertyNames): constrained "
                          "decoding cannot keep those names distinct, and a name written twice "
                          "counts once")  # fmt: skip


def _drop_forbidden_properties(s: dict) -> None:
    """Properties whose schema is `false` (the name must not appear) left out, in place, of an
    object that writes listed names only (xgrammar's strict mode: no `additionalProperties`,
    `patternProperties` or `propertyNames`): it never writes them then, where it refused the
    whole schema. A required one has no value: `Finite` refuses the schema."""
    props = s.get("properties")
    if not isinstance(props, dict):
        return
    forbidden = {k for k, v in props.items() if v is False}
    names_open = s.get("additionalProperties", False) is not False or any(
        k in s for k in ("patternProperties", "propertyNames")
    )
    if not forbidden or names_open or forbidden & set(s.get("required") or ()):
        return
    s["properties"] = {k: v for k, v in props.items() if v is not False}


def _assertions(s: dict, *but: str) -> list[str]:
    """The keywords of `s` that constrain a value, other than `but`."""
    return [k for k in s if k in ASSERTIONS and k not in but]
