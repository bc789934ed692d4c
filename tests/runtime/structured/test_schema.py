"""JSON Schemas before xgrammar: what it would enforce loosely is rewritten exactly or refused.

The property behind it: every output the compiled grammar allows validates against the schema
the client sent. Random walks through the grammar (random allowed tokens, ended by the closer)
check it for rewritten schemas and for random ones."""

from __future__ import annotations

import functools
import json
import random

import jsonschema
import numpy as np
import pytest
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.structured import schema as schemas
from pagoda.runtime.structured.bitmask import GrammarBitmask
from pagoda.runtime.structured.params import StructuredOutputsParams
from structured_testlib import random_schema


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
        ({"not": {"type": "string"}}, "/not"),
        ({"type": "string", "if": {"minLength": 1}, "then": {"minLength": 2}}, "/if"),
        ({"type": "array", "contains": {"type": "integer"}}, "/contains"),
        ({"type": "object", "properties": {"a": {"dependentRequired": {"a": ["b"]}}}},
         "/properties/a/dependentRequired"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "/oneOf"),
        ({"oneOf": [{"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]},
                    {"type": "object", "properties": {"k": {"type": "string", "const": "b"}},
                     "required": ["k"]}]}, "/oneOf"),  # the values overlap
        ({"type": "object", "required": ["a"], "additionalProperties": False}, "/required"),
        ({"type": "string", "pattern": "^(ab)+$", "maxLength": 5}, "/pattern"),
        ({"$ref": "https://example.com/schema.json"}, "/$ref"),
        ({"type": "strin"}, "/type"),
        ({"type": "integer", "minimum": "0"}, "/minimum"),
        ({"allOf": [{"type": "object", "additionalProperties": False}]}, "/allOf/0/additionalProperties"),
        ({"type": "string", "allOf": [{"type": "integer"}]}, "/allOf/0/type"),
        ({"type": "number", "multipleOf": 0.5}, "/multipleOf"),
        # names beyond the required ones can repeat ({"a": 1, "a": 2}: one property, parsed)
        ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
         "/minProperties"),
        ({"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 2,
          "patternProperties": {"^x": {}}}, "/minProperties"),
        ({"multipleOf": 3}, "/multipleOf"),
        # xgrammar compiles these loosely: lookaround and inner anchors in patterns (dropped),
        # anchor and dynamic references (ignored: any JSON), keywords beside $ref (ignored)
        ({"type": "string", "pattern": "(?!a)."}, "/pattern"),
        ({"type": "string", "pattern": "^(?<=x)b$"}, "/pattern"),
        ({"type": "string", "pattern": "a^b"}, "/pattern"),
        ({"type": "string", "pattern": "(a$)+"}, "/pattern"),
        ({"type": "object", "patternProperties": {"(?=a)": {}}}, "/patternProperties"),
        # '"', backslash and controls a class lists (written into the JSON string unescaped:
        # `"a"b"`), or outside one where xgrammar's regex rule takes the escaped pattern
        ({"type": "string", "pattern": '^a("|x)+b$'}, "/pattern"),
        ({"type": "string", "pattern": '^["\\\\]{2}$'}, "/pattern"),
        ({"type": "string", "pattern": "^[\\x00-\\x1f]$"}, "/pattern"),
        ({"type": "object", "patternProperties": {'^"': {}}}, "/patternProperties"),
        ({"$defs": {"a": {"$anchor": "foo", "type": "integer"}}, "$ref": "#foo"}, "/$ref"),
        ({"$dynamicRef": "#x"}, "/$dynamicRef"),
        # a format xgrammar does not enforce (any string, "(" too) and no pattern can say
        ({"type": "object", "properties": {"r": {"type": "string", "format": "regex"}}},
         "/properties/r/format"),
        ({"format": "regex"}, "/format"),
        # a format xgrammar writes itself, beside keywords it then drops: lengths its values do
        # not all have (pydantic's HttpUrl: maxLength 2083), a pattern
        ({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083}, "/maxLength"),
        ({"type": "string", "format": "uuid", "minLength": 40}, "/minLength"),
        ({"type": "string", "format": "email", "pattern": "^[a-z]+@x[.]com$"}, "/pattern"),
        ({"type": "string", "format": "date", "pattern": "^2020"}, "/pattern"),
        # a listed name a patternProperties pattern matches too (xgrammar: the listed schema only)
        ({"type": "object", "properties": {"ab": {"type": "string"}},
          "patternProperties": {"^a": {"type": "integer"}}}, "/patternProperties"),
        # additionalProperties merged into anyOf branches would see the other side's names
        ({"type": "object", "additionalProperties": False,
          "anyOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]}]},
         "/anyOf/0/properties"),
        ({"type": "object", "properties": {"x": {"type": "integer"}},
          "anyOf": [{"properties": {"a": {"const": 1}}, "additionalProperties": False}]},
         "/anyOf/0/additionalProperties"),
        # integers beyond int64 (xgrammar writes them as floats) and \A, \Z (read as letters)
        ({"const": 123456789012345678901234567890}, "/const"),
        ({"enum": [1, [2**64]]}, "/enum"),
        ({"type": "string", "pattern": "^ab\\Z"}, "/pattern"),
        ({"type": "string", "pattern": "\\Aab$"}, "/pattern"),
        # a number range without a number of 6 decimals (xgrammar's grammar allowed `{"v": }`)
        ({"type": "object", "properties": {"v": {"type": "number", "minimum": 1.5e-6,
                                                 "maximum": 1.9e-6}}}, "/properties/v/maximum"),
        ({"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 1e-6},
         "/exclusiveMaximum"),
        # a required name propertyNames refuses
        ({"type": "object", "properties": {"ABC": {}}, "required": ["ABC"],
          "propertyNames": {"maxLength": 2}}, "/required"),
        ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "maximum": 3}, "/maximum"),
        # keywords beside enum/const or anyOf that no value or branch satisfies
        ({"enum": ["a", "b"], "type": "integer"}, ""),
        ({"type": "string", "const": "x", "maxLength": 0}, ""),
        ({"enum": [], "const": None}, ""),
        ({"enum": [1, 2], "const": 3}, ""),
        ({"anyOf": [{"type": "integer"}], "type": "string"}, "/anyOf"),
        ({"anyOf": [{"minimum": 1}], "oneOf": [{"type": "integer"}]}, "/oneOf"),
        ({"anyOf": [{"type": "integer", "minimum": 2}], "minimum": 1}, "/anyOf/0/minimum"),
        # no finite value (xgrammar's way-out shortcut built such text until the engine died)
        ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, ""),
        ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, ""),
        ({"$defs": {"a": {"properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                    "b": {"type": "array", "prefixItems": [{"$ref": "#/$defs/a"}],
                          "minItems": 1}}, "$ref": "#/$defs/a"}, ""),
    ],
)  # fmt: skip
def test_refused_with_the_path(schema, where):
    with pytest.raises(schemas.SchemaError) as e:
        schemas.check(schema)
    assert e.value.path == where


def test_refusals_reach_the_client_as_param_errors(compiler):
    from pagoda.runtime.sampling.params import ParamError

    spec = StructuredOutputsParams(json={"uniqueItems": True}, field="response_format")
    with pytest.raises(ParamError) as e:
        compiler.compile(spec)
    assert e.value.field == "response_format"
    assert "uniqueItems" in e.value.message


REWRITTEN = [
    # allOf of objects: merged (xgrammar drops the second branch's required)
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    # required name without a property schema: written anyway
    {"type": "object", "required": ["id", "name"], "properties": {"id": {"type": "integer"}}},
    # lengths implied by the pattern: dropped; one repeated class: folded into its count
    {"type": "string", "pattern": "^[A-Z]{3}$", "minLength": 3, "maxLength": 3},
    {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4},
    {"type": "string", "pattern": "[0-9]*", "maxLength": 2},
    # disjoint oneOf: kept (xgrammar enforces it exactly)
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
         "required": ["kind", "x"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"],
         "additionalProperties": False}]},
    # pydantic's discriminated union (`Field(discriminator="kind")`): $ref branches whose
    # `Literal` tags are `const` beside `type`
    {"$defs": {"Cat": {"properties": {"kind": {"const": "cat", "title": "Kind", "type": "string"},
                                      "lives": {"title": "Lives", "type": "integer"}},
                       "required": ["kind", "lives"], "title": "Cat", "type": "object"},
               "Dog": {"properties": {"kind": {"const": "dog", "title": "Kind", "type": "string"},
                                      "breed": {"title": "Breed", "type": "string"}},
                       "required": ["kind", "breed"], "title": "Dog", "type": "object"}},
     "properties": {"pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
                                              "propertyName": "kind"},
                            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                            "title": "Pet"}},
     "required": ["pet"], "title": "Disc", "type": "object"},
    # multipleOf: kept on integers, a whole step on numbers makes them integers
    {"type": "integer", "multipleOf": 7, "minimum": -50, "maximum": 50},
    {"type": "number", "multipleOf": 5, "minimum": 1, "maximum": 100},
    # older drafts' spellings: a draft-7 tuple (`items` list, `additionalItems`), draft 4's
    # boolean `exclusiveMinimum` (xgrammar refused both)
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "string", "maxLength": 3}, {"type": "integer"}],
     "additionalItems": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 5,
              "exclusiveMaximum": False}}, "required": ["n"]},
    # formats xgrammar writes: the way out must still close them (e-mail's name part loops)
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"},
     "when": {"type": "string", "format": "date-time"}}, "required": ["email", "when"]},
    # '"', backslash and controls in a pattern (outside a class): matched escaped
    {"type": "object", "properties": {
        "q": {"type": "string", "pattern": '^"[a-z ]{1,8}"$'},
        "path": {"type": "string", "pattern": "^[A-Z]:\\\\[^\\\\]{1,5}$"},
        "lines": {"type": "string", "pattern": "^a\\nb\\t\\x01$"},
        "quotes": {"type": "string", "pattern": '^x"{1,3}$'},
        "repeat": {"type": "string", "pattern": "^(a\\\\){1,3}$"}},
     "required": ["q", "path", "lines", "quotes", "repeat"]},
    # an untyped allOf branch beside a type (read as any type, then met with the parent's)
    {"type": "string", "allOf": [{"format": "date"}]},
]  # fmt: skip


def test_rewrites_are_exact():
    s = schemas.check(REWRITTEN[0])
    assert "allOf" not in s and s["required"] == ["a", "b"]
    assert schemas.check(REWRITTEN[2]) == {"type": "string", "pattern": "^[A-Z]{3}$"}
    assert schemas.check(REWRITTEN[3])["pattern"] == "^[a-z]{2,4}$"
    assert schemas.check(REWRITTEN[4])["pattern"] == "^[0-9]{0,2}$"
    assert schemas.check(REWRITTEN[9])["type"] == "integer"
    assert schemas.check(REWRITTEN[-1]) == schemas.check({"type": "string", "format": "date"})
    escaped = schemas.check(REWRITTEN[-2])["properties"]
    assert [escaped[k]["pattern"] for k in ("q", "path", "lines")] == [
        '^\\\\"[a-z ]{1,8}\\\\"$',
        "^[A-Z]:\\\\\\\\[^\\\\]{1,5}$",
        "^a\\\\nb\\\\t\\\\u0001$",
    ]
    original = {"type": "object", "required": ["a"]}
    schemas.check(original)
    assert original == {"type": "object", "required": ["a"]}  # the client's dict is not changed


@functools.cache
def _odd_tokens(compiler) -> np.ndarray:
    return np.array([i for i, b in enumerate(compiler.decoded_vocab)
                     if b and (b[0] < 0x20 or b[0] >= 0x80 or b'"' in b or b"\\" in b)])  # fmt: skip


def _random_outputs(compiler, tok, schema, n: int, seed: int, free_ws: bool = False) -> list[str]:
    """n outputs of 80 tokens at most, each token drawn at random from those the step's mask
    (`GrammarBitmask`, as the engine applies it) allows, favouring odd ones: bytes below 0x20,
    quotes, backslashes, pieces of multi-byte characters."""
    vocab = compiler.vocab_size
    odd = _odd_tokens(compiler)
    spec = StructuredOutputsParams(json=schema, disable_any_whitespace=not free_ws)
    spec = spec.with_compiled(compiler.compile(spec))
    gb = GrammarBitmask(tok, vocab, torch.device("cpu"))
    rng = np.random.default_rng(seed)
    outs = []
    for k in range(n):
        req = Request(f"w{k}", [1], SamplingParams(max_tokens=80, structured_outputs=spec),
                      eos_token_ids=tok.eos_token_ids)  # fmt: skip
        while not req.is_finished:
            weights = rng.random(vocab, dtype=np.float32)
            weights[odd] += 1.0
            logits = torch.from_numpy(weights[None].copy())
            gb.apply(logits, [req], [0])
            w = np.where(np.isfinite(logits[0].numpy()), weights, 0.0)
            token = int(rng.choice(vocab, p=w / w.sum()))
            req.append_token(token)
            req.check_stop_token()
        assert req.status.finish_reason == "stop", (schema, tok.decode(req.output_token_ids))
        outs.append(tok.decode(req.output_token_ids[:-1]))
    return outs


@pytest.mark.parametrize("schema", REWRITTEN)
def test_rewritten_schemas_only_allow_valid_output(schema, compiler, smol_tokenizer):
    for text in _random_outputs(compiler, smol_tokenizer, schema, 3, seed=0):
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("free_ws", [False, True])
def test_random_schemas_only_allow_valid_output(compiler, smol_tokenizer, free_ws):
    rng = random.Random(2024)
    for i in range(30):
        schema = random_schema(rng)
        for text in _random_outputs(compiler, smol_tokenizer, schema, 1, i, free_ws):
            jsonschema.validate(json.loads(text), schema)


# (schema, texts): xgrammar (0.2.9) alone accepted the first text of each, which the schema does
# not allow: keywords beside anyOf/oneOf and enum/const were dropped; now they are moved into the
# branches, or the values filtered, exactly (texts in xgrammar's compact form: ", " and ": ")
LOOSE = [
    ({"anyOf": [{"type": "integer"}], "minimum": 5}, ["1", "6"]),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}], "minimum": 5, "maxLength": 1},
     ["1", '"ab"', "6", '"a"']),
    ({"type": "integer", "anyOf": [{"minimum": 5}, {"maximum": 1}]}, ["3", '"x"', "6", "0"]),
    ({"type": "array", "items": {"type": "integer"}, "anyOf": [{"minItems": 2}]}, ["[1]", "[1, 2]"]),
    ({"type": "string", "anyOf": [{"maxLength": 2}]}, ['"abc"', '"ab"']),
    ({"type": "string", "enum": ["a", "bb", 3], "maxLength": 1}, ['"bb"', "3", '"a"']),
    ({"type": "integer", "enum": [1, 5], "maximum": 2}, ["5", "1"]),
    # keywords of one type in a schema without `type`
    ({"additionalProperties": {"maxLength": 0}}, ['{"a": "x"}', '{"a": ""}', '{"a": 1}']),
    ({"minimum": 3}, ["1", "5", '"x"']),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, ["{}", '{"a": "x"}', '{"a": 1}']),
    # an optional group in a pattern: xgrammar let its first element be skipped alone
    ({"type": "string", "pattern": "^a(x[0-9]{1,3})?$"}, ['"a0"', '"a00"', '"a"', '"ax0"']),
    ({"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,2})?$"}, ['"1x5"', '"12"', '"1.5"']),
    ({"type": "object", "patternProperties": {"^k(_[0-9]+)?$": {"type": "integer"}},
      "additionalProperties": False}, ['{"k1": 1}', '{"k": 1}', '{"k_1": 1}']),
    # propertyNames without `type` (typed with every type above): keys that are not strings,
    # not JSON at all ({true: 1}), were written; so were an enum's other values
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]{1,3}$"},
      "additionalProperties": {"type": "integer"}}, ["{true: 1}", "{1: 1}", '{"ab": 1}']),
    ({"type": "object", "propertyNames": {"$ref": "#/$defs/n"}, "$defs": {"n": {"maxLength": 2}},
      "additionalProperties": {"type": "integer"}}, ["{null: 1}", '{"abc": 1}', '{"ab": 1}']),
    ({"type": "object", "propertyNames": {"enum": [1, "a"]}}, ["{1: 1}", '{"a": 1}']),
    # formats: ipv4 with leading zeros (refused by Python's ipaddress: pydantic's IPv4Address);
    # idn-email, left unconstrained by xgrammar, as an ASCII address
    ({"type": "string", "format": "ipv4"}, ['"1.2.3.04"', '"1.2.3.4"', '"10.200.0.255"']),
    ({"type": "string", "format": "idn-email"}, ['"no at sign"', '"ab@example.com"']),
    # formats: an enum's values that are not of the format; a format beside a type list (it
    # was left to xgrammar's own date grammar: 02-31); lengths every uuid has (kept)
    ({"type": "string", "format": "date", "enum": ["2020-01-01", "nope"]},
     ['"nope"', '"2020-01-01"']),
    ({"type": ["string", "null"], "format": "date"}, ['"2021-02-31"', '"2021-02-28"', "null"]),
    ({"type": "string", "format": "uuid", "minLength": 36, "maxLength": 40},
     ['"123e4567-e89b-12d3-a456"', '"123e4567-e89b-12d3-a456-426614174000"']),
    # additionalProperties beside anyOf branches that list no other names: still merged
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
     ["{}", '{"c": 1}', '{"a": 1}']),
    # listed names propertyNames refuses (xgrammar wrote them); a range with numbers of 6
    # decimals (more are not written: a subset)
    ({"type": "object", "properties": {"ABC": {"type": "integer"}, "abc": {"type": "integer"}},
      "propertyNames": {"pattern": "^[a-z]+$"}}, ['{"ABC": 1}', '{"abc": 1}']),
    ({"type": "number", "minimum": 1e-6, "maximum": 2e-6}, ["", "0.000001"]),
    # `\s` as Python reads it: xgrammar's (ECMA's) also matched U+FEFF
    ({"type": "string", "pattern": "^a\\sb$"}, ['"a\ufeffb"', '"a b"', '"a\u3000b"']),
    ({"type": "string", "pattern": "^[\\s,]{2}$"}, ['"\ufeff,"', '", "']),
    # a property whose schema is `false` must not appear (xgrammar refused the schema)
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": False}, "required": ["a"]},
     ['{"a": 1, "b": 2}', '{"a": 1}']),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "texts"), LOOSE)
def test_keywords_xgrammar_drops_are_enforced(schema, texts, compiler):
    import xgrammar as xgr

    grammar = compiler.compile(StructuredOutputsParams(json=schema))
    for text in texts:
        matcher = xgr.GrammarMatcher(grammar)
        accepted = matcher.accept_string(text) and matcher.is_completed()
        try:
            value = json.loads(text)
        except ValueError:
            assert not accepted, (schema, text)
            continue
        check = jsonschema.Draft202012Validator.FORMAT_CHECKER
        valid = jsonschema.Draft202012Validator(schema, format_checker=check).is_valid(value)
        assert accepted == valid, (schema, text, accepted)


def test_recursive_schemas_with_a_way_to_stop_are_kept():
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["kids"]}  # fmt: skip
    assert schemas.check(tree) == tree
    either = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "integer"}]},
                        "b": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                              "required": ["x"]}}, "$ref": "#/$defs/b"}  # fmt: skip
    assert schemas.check(either) == either


def test_pydantic_schemas_keep_compiling():
    """Enum classes (`enum` beside `type`), Optional (`anyOf` beside `default`), $ref with a
    description: rewritten, not refused."""
    s = schemas.check({"$defs": {"C": {"enum": ["r", "b"], "title": "C", "type": "string"}},
                       "properties": {"c": {"$ref": "#/$defs/C", "description": "a colour"},
                                      "o": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                                            "default": None, "title": "O"}},
                       "required": ["c"], "type": "object"})  # fmt: skip
    assert s["$defs"]["C"] == {"enum": ["r", "b"], "title": "C"}
    assert s["properties"]["o"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]


DATES = {"type": "object", "properties": {
    "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "date-time"},
    "h": {"type": "string", "format": "time"}}, "required": ["d", "t", "h"]}  # fmt: skip


def _is_time(value: str) -> bool:
    import datetime

    return datetime.time.fromisoformat(value.replace("Z", "+00:00")).tzinfo is not None


def test_dates_and_times_are_real_ones(compiler, smol_tokenizer):
    """xgrammar's date grammar allowed year 0000, 02-31 and second 60, which pydantic's and
    Python's date types (what `parse()` builds) refuse; the way out wrote 0000-01-01."""
    import datetime

    for text in _random_outputs(compiler, smol_tokenizer, DATES, 4, seed=1):
        value = json.loads(text)
        datetime.date.fromisoformat(value["d"])
        datetime.datetime.fromisoformat(value["t"].replace("Z", "+00:00"))
        assert _is_time(value["h"])
    import xgrammar as xgr

    for fmt, parse in (("date", datetime.date.fromisoformat),
                       ("date-time", lambda v: datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))),
                       ("time", _is_time)):  # fmt: skip
        spec = StructuredOutputsParams(json={"type": "string", "format": fmt})
        m = xgr.GrammarMatcher(compiler.compile(spec))
        assert m.accept_string('"')
        plan = compiler.closer.plan(m, 64)
        parse(json.loads('"' + smol_tokenizer.decode(plan)))


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    def atom() -> str:
        if depth > 1 or rng.random() < 0.5:
            return rng.choice(["a", "x", "[0-9]", "0"])
        inner = _random_pattern(rng, depth + 1)
        return (
            f"({inner})" if rng.random() < 0.7 else f"({inner}|{_random_pattern(rng, depth + 1)})"
        )

    quants = ["", "", "?", "*", "+", "{1,2}", "{2}", "{0,2}"]
    return "".join(atom() + rng.choice(quants) for _ in range(rng.randint(1, 3)))


def test_patterns_match_as_python_reads_them(compiler):
    """Random patterns (groups, alternatives, counts), every string of up to 3 characters:
    the grammar accepts exactly what `re.fullmatch` does (xgrammar alone got 12 of 146 such
    patterns wrong, each with an optional group)."""
    import itertools
    import re

    import xgrammar as xgr

    rng = random.Random(7)
    strings = ["".join(p) for n in range(4) for p in itertools.product("ax01", repeat=n)]
    for _ in range(40):
        body = _random_pattern(rng)
        grammar = compiler.compile(StructuredOutputsParams(json={"type": "string",
                                                                 "pattern": f"^{body}$"}))  # fmt: skip
        for text in strings:
            m = xgr.GrammarMatcher(grammar)
            accepted = m.accept_string(json.dumps(text)) and m.is_completed()
            assert accepted == (re.fullmatch(body, text) is not None), (body, text)
