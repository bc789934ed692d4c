"""Regular expressions refused where xgrammar (0.2.x) would compile them loosely: lookaround
(dropped inside JSON Schema patterns), `\\A`/`\\Z` (read as letters), anchors other than at the
start and end (dropped); and, for a pattern a JSON string's value is matched by (a
`patternProperties` name), a literal '"', backslash or control character, which it would write
into the string unescaped. Read with Python's own regex parser. For `schema.check` (`pattern`,
`patternProperties`), the `regex` structured output and structural tags' `regex` formats."""

from __future__ import annotations

from pagoda.runtime.structured.schema_rewrites import SchemaError

try:  # Python's own regex parser, to find the lookarounds and anchors xgrammar drops
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse  # type: ignore[no-redef]

_AT_START = {sre_parse.AT_BEGINNING, sre_parse.AT_BEGINNING_STRING}
_AT_END = {sre_parse.AT_END, sre_parse.AT_END_STRING}
_REPEATS = tuple(
    getattr(sre_parse, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
    if hasattr(sre_parse, n)
)  # fmt: skip


def check_pattern(pattern: str, path: str | None, in_json: bool = False) -> None:
    """SchemaError for regex features xgrammar compiles loosely: lookaround (it drops it inside
    JSON Schema patterns) and anchors other than at the start and end (it drops them). `in_json`
    (a `patternProperties` name, matched by a JSON string's value): also a literal '"',
    backslash or control character, which xgrammar writes into the string unescaped (`^a"b$`
    gave `"a"b"`, not JSON), also in a class; ranges leave '"' and backslash out. A `pattern`'s
    are written escaped instead (`pattern_escapes`)."""
    try:
        parsed = sre_parse.parse(pattern)
    except Exception:  # not Python's dialect: left to xgrammar's own parser
        return
    items = list(_regex_items(list(parsed), True, True))
    for op, av, at_start, at_end in items:
        _check_regex_item(op, av, at_start, at_end, path)
    if in_json:
        for op, av, _, _ in items:
            _check_json_literal(op, av, path)


def _regex_items(items: list, first: bool, last: bool):
    """(op, av, at_start, at_end) of every item of a parsed pattern, nested ones included."""
    for i, (op, av) in enumerate(items):
        at_start, at_end = first and i == 0, last and i == len(items) - 1
        yield op, av, at_start, at_end
        if op is sre_parse.BRANCH:
            for alt in av[1]:
                yield from _regex_items(list(alt), at_start, at_end)
        elif op is sre_parse.SUBPATTERN:
            yield from _regex_items(list(av[-1]), at_start, at_end)
        elif op in _REPEATS:
            yield from _regex_items(list(av[2]), False, False)
        elif op is getattr(sre_parse, "ATOMIC_GROUP", None):
            yield from _regex_items(list(av), False, False)


def _check_regex_item(op, av, at_start: bool, at_end: bool, path: str | None) -> None:
    if op is sre_parse.AT and av in (sre_parse.AT_BEGINNING_STRING, sre_parse.AT_END_STRING):
        raise SchemaError(path, "\\A and \\Z are not supported by constrained decoding (it "
                          "reads them as the letters A and Z); use ^ and $")  # fmt: skip
    if op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        raise SchemaError(path, "lookahead and lookbehind are not supported by "
                          "constrained decoding")  # fmt: skip
    if op is sre_parse.AT and not ((av in _AT_START and at_start) or (av in _AT_END and at_end)):
        raise SchemaError(path, "anchors (^, $, \\b) are supported at the start and end "
                          "of the pattern only")  # fmt: skip


def _unescaped(c: int) -> bool:
    return c < 0x20 or c in (0x22, 0x5C)


def _check_json_literal(op, av, path: str | None) -> None:
    bad = None
    if op is sre_parse.LITERAL and _unescaped(av):
        bad = chr(av)
    elif op is sre_parse.IN and (not av or av[0][0] is not sre_parse.NEGATE):
        for kind, v in av:
            if kind is sre_parse.LITERAL and _unescaped(v):
                bad = chr(v)
            elif kind is sre_parse.RANGE and v[0] < 0x20:  # ranges leave '"' and '\' out
                bad = chr(v[0])
    if bad is not None:
        raise SchemaError(path, f"a pattern that matches {bad!r} is not supported by "
                          "constrained decoding: xgrammar would write '\"', backslashes "
                          "and control characters into the JSON string unescaped")  # fmt: skip
