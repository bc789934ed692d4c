"""A pattern's '"', backslashes and control characters (outside a class) match their JSON
escapes: xgrammar's grammar accepts the JSON text (as `json.dumps` writes it) of exactly the
samples the client's pattern matches, and any other text it accepts is the JSON of a matching
value; classes listing them are refused."""

from __future__ import annotations

import json
import re

import pytest
import xgrammar as xgr
from pagoda.runtime.structured import pattern_escapes
from pagoda.runtime.structured.schema_rewrites import SchemaError

# pattern → values: those it matches and those it does not (as Python's `re` reads it)
CASES = {
    '^a"b$': ['a"b', "ab", "a\\b"],
    '^He said "[a-z]+"$': ['He said "hi"', "He said hi", 'He said "Hi"'],
    '^[A-Z]:\\\\[^"\\\\]*$': ["C:\\x", 'C:\\x"y', "C:x", "C:\\"],
    "^a\\\\{1,2}b$": ["a\\b", "a\\\\b", "a\\\\\\b", "ab"],
    "^a\\nb\\t$": ["a\nb\t", "anbt", "a\\nb\\t"],
    '^"[^"]*"$': ['"abc"', '"a"b"', "abc"],
    "^x\\x22y\\u005cz\\0$": ['x"y\\z\0', "xyz"],
    '^a"{1,3}b$': ['a"b', 'a"""b', "ab", 'a""""b'],
}


def _accepts(pattern: str, value: str, raw: bool = False) -> bool:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}},
              "required": ["s"], "additionalProperties": False}  # fmt: skip
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                           strict_mode=True)  # fmt: skip
    text = f'"{value}"' if raw else json.dumps(value)
    return xgr.testing._is_grammar_accept_string(grammar, '{"s": ' + text + "}")


@pytest.mark.parametrize("pattern", CASES)
def test_the_grammar_writes_exactly_the_escaped_matches(pattern):
    escaped = pattern_escapes.escape(pattern, "/pattern")
    assert escaped != pattern
    for value in CASES[pattern]:
        assert _accepts(escaped, value) == bool(re.fullmatch(pattern, value)), value
        if _accepts(escaped, value, raw=True):  # the raw text: JSON of a matching value only
            assert re.fullmatch(pattern, json.loads(f'"{value}"')), value


@pytest.mark.parametrize("pattern", ['^["a]$', "^[\\\\x]$", "^[\\x00-\\x1f]$", "^[\\b]$",
                                     '^a("|x)+b$', "^x\\\\?y$"])  # fmt: skip
def test_classes_listing_them_and_xgrammars_regex_rule_are_refused(pattern):
    with pytest.raises(SchemaError):
        pattern_escapes.escape(pattern, "/pattern")


def test_patterns_without_them_are_left_as_they_are():
    for pattern in ("^[a-z]+$", '^[^"\\\\]+$', "^\\d{4}-\\d{2}$", "a.b", "^[ -~]*$"):
        assert pattern_escapes.escape(pattern, "/pattern") == pattern
