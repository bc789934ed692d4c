"""Exact rewrites of JSON Schema keywords that xgrammar (0.2.x) would compile loosely, used by
`schema.check`: each returns a schema that allows exactly the values the client's allows (or a
subset xgrammar can enforce), or raises `SchemaError` naming where no exact rewrite exists.

* keywords beside `anyOf`/`oneOf` moved into every branch (`distribute`), values of `enum`/
  `const` filtered by the keywords beside them (`enum_within`);
* `allOf` of compatible object schemas merged; `required` names missing from `properties` given
  a schema there; `multipleOf` with a whole step on numbers made an integer schema;
* `minLength`/`maxLength` beside a `pattern` dropped when the pattern's width lies within them,
  or folded into a single repeated class's count;
* older drafts' spellings as 2020-12's, and date/time formats as exact patterns; lengths beside
  a format xgrammar writes itself dropped where every value of the format has them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jsonschema

try:  # Python's own regex parser, used for the width of a pattern only
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse  # type: ignore[no-redef]


class SchemaError(ValueError):
    """A schema that cannot be enforced exactly; `path` is where (JSON pointer style)."""

    def __init__(self, path: str | None, message: str) -> None:
        super().__init__(message if path is None else f"{message} (at {path or '/'})")
        self.path = path


# Keywords that constrain a value (others, known or not, are annotations: kept in place when a
# schema is rewritten)
ASSERTIONS = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "items", "prefixItems", "additionalItems", "contains", "allOf", "anyOf",
    "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies",
    "unevaluatedItems", "unevaluatedProperties", "$ref", "$dynamicRef", "$recursiveRef",
}  # fmt: skip
_SINGLE = re.compile(  # one atom (a class, an escape, a character or `.`) and its count
    r"^\^?((?:\[(?:\\.|[^\]\\])+\]|\\[dwsDWS]|\\.|[^\\()\[\]{}*+?|^$.]|\.))"
    r"(\*|\+|\?|\{\d+\}|\{\d+,\d*\})?\$?$"
)
# Date and time formats as exact patterns. xgrammar's own grammars allow year 0000, day 31 of
# every month (02-31), and second 60, which `date`/`datetime` (pydantic's, Python's, the
# `jsonschema` format checker's) refuse: `parse()` with a date field could fail. These allow
# years 0001-9999, each month's days (02-29 in leap years only), seconds 00-59, fractions of 1
# to 6 digits and Z or an offset, as the model writes them (upper case).
_YEAR = "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = ("((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
              "02-(0[1-9]|1[0-9]|2[0-8]))")  # fmt: skip
_LEAP_DAY = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)-02-29"
_DATE = f"({_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
# An IPv4 address without leading zeros in its numbers (RFC 2673's dotted-quad, what Python's
# `ipaddress` and so pydantic's IPv4Address take): xgrammar's own grammar allows `1.2.3.04`.
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
FORMAT_PATTERNS = {"date": f"^{_DATE}$", "date-time": f"^{_DATE}T{_TIME}$", "time": f"^{_TIME}$",
                   "ipv4": f"^({_OCTET}\\.){{3}}{_OCTET}$"}  # fmt: skip
# Formats xgrammar does not know (it lets any string through) written as the ASCII formats it
# enforces, whose values are all valid ones of these: an ASCII address is an internationalized
# one, a URI an IRI.
FORMAT_SUBSETS = {"idn-email": "email", "idn-hostname": "hostname", "iri": "uri",
                  "iri-reference": "uri-reference"}  # fmt: skip
# Formats xgrammar writes with grammars of its own, dropping `pattern`, `minLength` and
# `maxLength` beside them (`{"format": "uri", "maxLength": 12}` allowed any length): the lengths
# in characters that every value of the format has (least, most; None: no bound)
FORMAT_LENGTHS = {"email": (3, None), "hostname": (1, None), "ipv6": (2, None),
                  "uri": (2, None), "uri-reference": (0, None), "uri-template": (0, None),
                  "uuid": (36, 36), "duration": (3, None), "json-pointer": (0, None),
                  "relative-json-pointer": (1, None)}  # fmt: skip


def in_new_spellings(s: dict) -> dict:
    """Older drafts' keywords as 2020-12 spells them (xgrammar reads only those): a list
    `items` (draft 7 and before: a tuple) is `prefixItems`, its `additionalItems` the `items`;
    a boolean `exclusiveMinimum`/`exclusiveMaximum` (draft 4) makes `minimum`/`maximum`
    exclusive. The metaschema check has accepted these spellings for the schema's own draft."""
    if isinstance(s.get("items"), list):
        tuple_items, rest = s["items"], s.get("additionalItems")
        s = {k: v for k, v in s.items() if k not in ("items", "additionalItems")}
        s["prefixItems"] = tuple_items
        if rest is not None:
            s["items"] = rest
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(s.get(exclusive), bool):
            s = dict(s)
            if s.pop(exclusive) and bound in s:
                s[exclusive] = s.pop(bound)
    return s


def enum_within(original: dict, s: dict, path: str) -> dict:
    """`enum`/`const` beside other keywords (xgrammar keeps only the values): the values that
    the whole schema accepts, checked with `jsonschema` against the client's own schema."""
    values = [original["const"]] if "const" in original else list(original.get("enum", []))
    if "const" in original and "enum" in original:
        values = [v for v in values if v in original["enum"]]
    cls = jsonschema.validators.validator_for(original, default=jsonschema.Draft202012Validator)
    try:
        validator = cls(original, format_checker=cls.FORMAT_CHECKER)  # formats assert here
        kept = [v for v in values if validator.is_valid(v)]
    except Exception as e:  # a $ref inside cannot be resolved from this subschema alone
        raise SchemaError(path, "enum or const beside keywords that refer elsewhere ($ref) "
                          "is not supported") from e  # fmt: skip
    if not kept:
        raise SchemaError(path, "no value of enum/const satisfies the keywords beside it: no "
                          "output can satisfy this schema")  # fmt: skip
    out = {k: v for k, v in s.items() if k not in ASSERTIONS}
    out["enum"] = kept
    return out


def distribute(s: dict, path: str, normalise: Callable[[Any, str], Any]) -> dict:
    """Keywords beside `anyOf`/`oneOf` (xgrammar ignores them) moved into every branch: a value
    matches (siblings and some branch) exactly when it matches some (siblings and branch). Each
    merged branch is normalised again (`normalise(branch, path)`)."""
    if "anyOf" in s and "oneOf" in s:
        raise SchemaError(f"{path}/oneOf", "anyOf and oneOf in one schema are not supported")
    key = "anyOf" if "anyOf" in s else "oneOf"
    siblings = {k: v for k, v in s.items() if k in ASSERTIONS and k != key}
    if not siblings:
        return s
    branches = []
    for i, branch in enumerate(s[key]):
        merged = with_siblings(branch, siblings, f"{path}/{key}/{i}")
        if merged is not None:
            branches.append(normalise(merged, f"{path}/{key}/{i}"))
    if not branches:
        raise SchemaError(f"{path}/{key}", f"no branch of {key} can hold together with the "
                          f"keywords beside {key}: no output can satisfy this schema")  # fmt: skip
    out = {k: v for k, v in s.items() if k not in ASSERTIONS}
    out[key] = branches
    return out


def with_siblings(branch: Any, siblings: dict, where: str) -> dict | None:
    """`branch` and `siblings` as one schema (None: the two exclude each other)."""
    if branch is True:
        return dict(siblings)
    if branch is False:
        return None
    if "$ref" in branch:
        raise SchemaError(where, "keywords beside anyOf/oneOf with a $ref branch are not "
                          "supported; move them into the branches")  # fmt: skip
    _check_closed(siblings, branch, f"{where}/properties", "beside anyOf/oneOf")
    _check_closed(branch, siblings, f"{where}/additionalProperties", "in this branch")
    merged = dict(branch)
    for key, value in siblings.items():
        if key not in merged or merged[key] == value:
            merged[key] = value
        elif key == "required":
            merged[key] = list(dict.fromkeys([*merged[key], *value]))
        elif key == "type":
            kinds = type_meet(merged[key], value)
            if not kinds:
                return None
            merged[key] = kinds[0] if len(kinds) == 1 else kinds
        elif key == "properties":
            props = dict(merged[key])
            for name, sub in value.items():
                if props.get(name, {}) in ({}, True, sub):  # open in the branch (or the same)
                    props[name] = sub
                elif sub not in ({}, True):
                    raise SchemaError(f"{where}/properties/{name}", "this property is "
                                      "constrained both in the branch and beside it")  # fmt: skip
            merged[key] = props
        else:
            raise SchemaError(f"{where}/{key}", f"{key} is set both in this branch and beside "
                              "it; keep one")  # fmt: skip
    return merged


def _check_closed(closed: dict, other: dict, path: str, at: str) -> None:
    """SchemaError where `closed`'s additionalProperties would, once merged, cover names that
    only `other` lists: it sees the properties of its own schema alone, so `{"additionalProperties":
    false, "anyOf": [{"properties": {"a": ...}, "required": ["a"]}]}` allows no "a" (nor any
    object), while the merged branch would allow it."""
    if closed.get("additionalProperties", True) in (True, {}):
        return
    own = closed.get("properties") or {}
    extra = [n for n in other.get("properties") or {} if n not in own]
    if extra or other.get("patternProperties"):
        what = f"property {extra[0]!r}" if extra else "patternProperties"
        raise SchemaError(path, f"additionalProperties {at} applies "
                          f"to {what}, which only the other side lists: moving it into the "
                          "branches would change what it allows; list the properties beside "
                          "additionalProperties")  # fmt: skip


def type_meet(a: Any, b: Any) -> list[str]:
    """The JSON types both `type` values allow (integer is a number)."""
    a, b = ([a] if isinstance(a, str) else list(a)), ([b] if isinstance(b, str) else list(b))
    out = [t for t in a if t in b or (t == "integer" and "number" in b)]
    out += [t for t in b if t == "integer" and "number" in a and t not in out]
    return out


def merge_all_of(s: dict, path: str) -> dict:
    """`allOf` folded into its parent where the branches' keywords do not conflict."""
    merged = {k: v for k, v in s.items() if k != "allOf"}
    for i, branch in enumerate(s["allOf"]):
        where = f"{path}/allOf/{i}"
        if branch is True:
            continue
        if not isinstance(branch, dict) or "$ref" in branch or "anyOf" in branch:
            raise SchemaError(where, "allOf is supported only over inline object schemas")
        for key, value in branch.items():
            if key == "properties":
                props = dict(merged.get("properties", {}))
                for name, sub in value.items():
                    if name in props and props[name] != sub:
                        raise SchemaError(f"{where}/properties/{name}",
                                          "allOf branches constrain this property differently")  # fmt: skip
                    props[name] = sub
                merged["properties"] = props
            elif key == "required":
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            elif key == "additionalProperties":
                raise SchemaError(f"{where}/additionalProperties",
                                  "additionalProperties inside allOf is not supported")  # fmt: skip
            elif key == "type" and "type" in merged:  # an untyped branch reads as every type
                kinds = type_meet(merged["type"], value)
                if not kinds:
                    raise SchemaError(f"{where}/type", "allOf branches allow no common type")
                merged["type"] = kinds[0] if len(kinds) == 1 else kinds
            elif key in merged and merged[key] != value:
                raise SchemaError(f"{where}/{key}", f"allOf branches disagree on {key}")
            else:
                merged[key] = value
    return merged


def fill_required(s: dict, path: str) -> None:
    """Give every required name a schema in `properties` (xgrammar only writes the listed
    ones); with additionalProperties false such a name can never be written: refused."""
    required = s.get("required")
    if not isinstance(required, list) or not required:
        return
    props = s.get("properties", {})
    missing = [r for r in required if r not in props]
    if not missing:
        return
    extra = s.get("additionalProperties", True)
    if extra is False:
        raise SchemaError(
            f"{path}/required",
            f"required property {missing[0]!r} is not in properties and additionalProperties "
            "is false: no object can satisfy this schema",
        )
    s["properties"] = {**props, **{r: extra if isinstance(extra, dict) else {} for r in missing}}


def multiple_of(s: dict, path: str) -> dict:
    """xgrammar enforces `multipleOf` on integers only (it drops it for numbers): a number
    schema with a whole multipleOf becomes an integer one (its outputs are multiples); others
    are refused."""
    step, kind = s["multipleOf"], s.get("type")
    whole = isinstance(step, int) or (isinstance(step, float) and step.is_integer())
    if kind == "integer" and whole:
        return s
    if kind == "number" and whole:
        return {**s, "type": "integer", "multipleOf": int(step)}
    raise SchemaError(
        f"{path}/multipleOf",
        "multipleOf is supported for integer and number schemas with a whole step only",
    )


def pattern_lengths(s: dict, path: str) -> dict:
    """minLength/maxLength beside a pattern (xgrammar keeps only the pattern): dropped when the
    pattern's own width lies within them, folded into a single repeated class's count, else
    refused."""
    lo, hi = s.get("minLength", 0), s.get("maxLength")
    pattern = s["pattern"]
    try:
        width_lo, width_hi = sre_parse.parse(pattern).getwidth()
    except Exception as e:  # Python's dialect differs from ECMA 262 on a few escapes
        raise SchemaError(f"{path}/pattern", f"cannot read the pattern: {e}") from e
    out = {k: v for k, v in s.items() if k not in ("minLength", "maxLength")}
    # xgrammar matches a pattern against the whole string, anchored or not: its width bounds
    # the string's length (an unanchored pattern is stricter there than JSON Schema's search)
    if width_lo >= lo and (hi is None or width_hi <= hi):
        return out
    m = _SINGLE.match(pattern)
    if m:
        atom, rep = m.group(1), m.group(2) or "{1}"
        a, b = _counts(rep)
        a, b = max(a, lo), b if hi is None else (hi if b is None else min(b, hi))
        if b is not None and a > b:
            raise SchemaError(
                f"{path}/pattern", "pattern and minLength/maxLength exclude each other"
            )
        out["pattern"] = f"^{atom}{{{a},{'' if b is None else b}}}$"
        return out
    raise SchemaError(
        f"{path}/pattern",
        "minLength/maxLength beside a pattern are supported when the pattern's own length "
        "range lies within them, or when the pattern is one repeated character class",
    )


def format_lengths(s: dict, path: str) -> dict:
    """`pattern`, `minLength` and `maxLength` beside a format xgrammar writes itself (it drops
    them): lengths every value of the format has dropped, anything else refused."""
    fmt = s["format"]
    if "pattern" in s:
        raise SchemaError(f"{path}/pattern", f'pattern beside format "{fmt}" is not supported '
                          "(constrained decoding would enforce only one of them); keep one")  # fmt: skip
    least, most = FORMAT_LENGTHS[fmt]
    lo, hi = s.get("minLength", 0), s.get("maxLength")
    if lo <= least and (hi is None or (most is not None and most <= hi)):
        return {k: v for k, v in s.items() if k not in ("minLength", "maxLength")}
    key = "minLength" if lo > least else "maxLength"
    raise SchemaError(f"{path}/{key}", f'{key} beside format "{fmt}" is not supported '
                      "(constrained decoding enforces the format alone; its values can be "
                      "longer or shorter); drop the length or use a pattern instead of the format")  # fmt: skip


def _counts(rep: str) -> tuple[int, int | None]:
    if rep == "*":
        return 0, None
    if rep == "+":
        return 1, None
    if rep == "?":
        return 0, 1
    body = rep[1:-1]
    if "," not in body:
        return int(body), int(body)
    a, b = body.split(",")
    return int(a), int(b) if b else None


def optional_groups_as_alternatives(pattern: str) -> str:
    """`(X)?` written `(X|)` (the same language). xgrammar 0.2.9 matches a JSON Schema `pattern`
    with an optional group wrongly: `^a(x[0-9]{1,3})?$` accepts `a0` (as if the group's first
    element could be skipped alone). Its `regex` path is right; the alternative form is right in
    both. A lazy or possessive `?` after the group goes too (a full match is the same)."""
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):  # a leading `]` is a literal (Python's reading)
                out.append("]")
                i += 1
            continue
        elif c == ")" and pattern.startswith("?", i + 1):
            out.append("|)")
            i += 2 + (pattern[i + 2 : i + 3] in ("?", "+"))
            continue
        out.append(c)
        i += 1
    return "".join(out)
