"""A JSON Schema `pattern` that matches '"', a backslash or a control character, rewritten to
match the escaped JSON text of such strings instead of their value.

xgrammar (0.2.9) matches a string's `pattern` against the text between the quotes and writes
what the pattern matches as it is: `^a"b$` gave `"a"b"`, not JSON. Rewritten, `^a\\\\"b$` (a
backslash, then '"') gives `"a\\"b"`, whose value is `a"b`, which the client's pattern matches.
Each such character outside a character class becomes the one escape `json.dumps` writes for
it (`\\"`, `\\\\`, `\\n`, `\\u0001`), in a group where a quantifier follows it.

What stays refused: such a character listed in a class (`["a]`, `[\\x00-\\x1f]`: `rewrite`),
and a rewritten pattern xgrammar compiles to its regex rule rather than to grammar
rules: that rule never writes a backslash followed by '"' or another backslash
(`^a(\\\\"|x)+b$` accepts `"axb"`, not `"a\\"b"`), so the string could never be finished.
Which patterns go there is xgrammar's choice (most repeated groups or classes alone do:
`^[a-z]+$`; `^\\\\"[a-z ]+\\\\"$` and `^[A-Z]:\\\\\\\\[^\\\\"]*$` do not); `escape` asks it.
"""

from __future__ import annotations

import functools
import json

from pagoda.runtime.structured.schema_rewrites import SchemaError

_SHORT = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_HEX = {"x": 2, "u": 4, "U": 8}
_QUANTIFIERS = "*+?{"


def needs_escape(c: str) -> bool:
    return c in '"\\' or ord(c) < 0x20


def _escaped(c: str) -> str:
    """The regex that matches `c` as JSON text writes it (json.dumps' escape)."""
    return "".join("\\" + x if x in "\\" else x for x in json.dumps(c)[1:-1])


def rewrite(pattern: str, path: str) -> str:
    """`pattern` with each '"', backslash and control character outside a class matching its
    JSON escape (the same string where it has none); SchemaError for one that a class lists
    (a negated class, `.` and ranges are fine: xgrammar leaves them out there)."""
    out: list[str] = []
    i, n, changed = 0, len(pattern), False
    while i < n:
        if pattern[i] == "[":
            j = _class_end(pattern, i, path)
            out.append(pattern[i:j])
            i = j
            continue
        value, j = _char_at(pattern, i)
        if value is None or not needs_escape(value):
            out.append(pattern[i:j])
        else:
            changed = True
            atom = _escaped(value)
            out.append(f"(?:{atom})" if pattern[j : j + 1] in tuple(_QUANTIFIERS) else atom)
        i = j
    return "".join(out) if changed else pattern


def _char_at(pattern: str, i: int) -> tuple[str | None, int]:
    """(the one character the pattern's text at `i` stands for, or None for a metacharacter
    or class escape; where the text after it starts)."""
    c, n = pattern[i], len(pattern)
    if c != "\\":
        return (None if c in ".^$*+?{}()|" else c), i + 1
    if i + 1 >= n:
        return None, n
    e, j = pattern[i + 1], i + 2
    if e in '"\\':
        return e, j
    if e in _SHORT:
        return _SHORT[e], j
    width = _HEX.get(e, 0)
    if width and _is_hex(pattern[j : j + width], width):
        return chr(int(pattern[j : j + width], 16)), j + width
    if e == "0":
        k = j
        while k < min(n, j + 2) and pattern[k] in "01234567":
            k += 1
        return chr(int(pattern[i + 1 : k], 8)), k
    return None, j  # \d, \w, \s, \b, a backreference, an escaped metacharacter


def _class_end(pattern: str, i: int, path: str) -> int:
    """Where the class opening at `i` ends; SchemaError where it lists a character that needs
    an escape (it would be written raw)."""
    j, n = i + 1, len(pattern)
    negated = pattern.startswith("^", j)
    j += negated
    first = True
    while j < n and (pattern[j] != "]" or first):  # a leading `]` is a literal (Python's)
        if pattern.startswith("\\b", j):  # a backspace in a class (a word boundary outside)
            value, k = "\b", j + 2
        else:
            value, k = _char_at(pattern, j) if pattern[j] == "\\" else (pattern[j], j + 1)
        if value is not None and needs_escape(value) and not negated:
            raise SchemaError(path, f"a pattern whose class lists {value!r} is not supported "
                              "by constrained decoding: xgrammar would write it into the JSON "
                              "string unescaped (outside a class it is written escaped)")  # fmt: skip
        j, first = k, False
    return j + 1


# Python's `\s` (str.isspace) without the controls xgrammar never writes raw in a string:
# xgrammar's (ECMA 262's) also matches U+FEFF, which Python's, and so the client's check, do not
_PY_SPACE = " \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def python_whitespace(pattern: str) -> str:
    """`pattern` with each `\\s` written as the characters Python's `re` matches there (a
    class of them, or its members inside a class), so that it keeps no U+FEFF. A negated class
    keeps its `\\s` (xgrammar's leaves out U+FEFF too: a subset of Python's)."""
    out: list[str] = []
    i, n, in_class, negated = 0, len(pattern), False, False
    while i < n:
        c = pattern[i]
        if c == "\\" and pattern.startswith("s", i + 1) and not negated:
            out.append(_PY_SPACE if in_class else f"[{_PY_SPACE}]")
            i += 2
            continue
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class, negated = True, pattern.startswith("^", i + 1)
            out.append(c)
            i += 1
            for lead in ("^", "]"):  # a leading `]` is a literal (Python's reading)
                if pattern.startswith(lead, i):
                    out.append(lead)
                    i += 1
            continue
        if c == "]" and in_class:
            in_class = negated = False
        out.append(c)
        i += 1
    return "".join(out)


def _is_hex(text: str, width: int) -> bool:
    return len(text) == width and all(c in "0123456789abcdefABCDEF" for c in text)


def escape(pattern: str, path: str) -> str:
    """`rewrite(pattern)`, checked to compile to xgrammar's grammar rules (SchemaError where it
    would go to its regex rule, which never writes the escapes)."""
    out = rewrite(pattern, path)
    if out != pattern and not _grammar_rules(out):
        raise SchemaError(path, "a pattern that matches '\"', a backslash or a control "
                          "character outside a class is written escaped where xgrammar compiles "
                          "it to grammar rules; this one goes to its regex rule (as most "
                          "repeated groups do), which never writes the escapes: leave those "
                          "characters out, or write that part without repetition")  # fmt: skip
    return out


@functools.lru_cache(maxsize=256)
def _grammar_rules(pattern: str) -> bool:
    import xgrammar as xgr

    schema = json.dumps({"type": "string", "pattern": pattern})
    try:
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
    except (RuntimeError, ValueError):
        return False
    return "Regex(" not in str(grammar)
