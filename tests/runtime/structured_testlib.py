"""Structured-output test helpers: the embedded tokenizer, and random grammars (JSON Schemas over
the keywords xgrammar enforces, regexes, EBNF grammars) from a seeded `random.Random`."""

from __future__ import annotations

import random
import string
from typing import Any


def smol_tokenizer():
    """The embedded model's tokenizer alone (no weights), with the model's vocabulary size."""
    from pagoda.runtime.model.gguf_loader import _reader, read_config, read_tokenizer
    from pagoda.runtime.model.loader import resolve_model_path

    reader = _reader(resolve_model_path("smollm2-135m"))
    config = read_config(reader)
    tok = read_tokenizer(reader, config)
    tok.model_vocab_size = config.vocab_size
    return tok


WORDS = ["alpha", "beta", "gamma", "delta", "red", "green", "blue", "north", "south", "x"]


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A JSON Schema of nested objects, arrays (minItems/maxItems), enums, patterns, numeric
    ranges, required, additionalProperties false and anyOf."""
    kinds = ["string", "integer", "number", "boolean", "enum", "pattern", "null"]
    if depth < 2:
        kinds += ["object", "array", "anyOf"] * 2
    kind = rng.choice(kinds)
    if kind == "string":
        s: dict[str, Any] = {"type": "string"}
        if rng.random() < 0.5:
            s["maxLength"] = rng.randint(1, 12)
            s["minLength"] = rng.randint(0, s["maxLength"])
        return s
    if kind == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.7:
            lo = rng.randint(-1000, 1000)
            s.update(minimum=lo, maximum=lo + rng.randint(0, 5000))
        return s
    if kind == "number":
        s = {"type": "number"}
        if rng.random() < 0.6:
            lo = round(rng.uniform(-100, 100), 2)
            s.update(minimum=lo, maximum=round(lo + rng.uniform(0.5, 500), 2))
        return s
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "null":
        return {"type": "null"}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1)}
        lo = rng.randint(0, 2)
        s.update(minItems=lo, maxItems=lo + rng.randint(0, 3))
        return s
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    names = rng.sample(WORDS, rng.randint(1, 4))
    props = {n: random_schema(rng, depth + 1) for n in names}
    s = {"type": "object", "properties": props}
    s["required"] = [n for n in names if rng.random() < 0.7]
    if rng.random() < 0.7:
        s["additionalProperties"] = False
    return s


PATTERNS = [
    r"^[a-z]{2,6}$",
    r"^\d{3}-\d{4}$",
    r"^[A-Z][a-z]+$",
    r"^(yes|no|maybe)$",
    r"^[a-f0-9]{8}$",
    r"^v\d+\.\d+\.\d+$",
]


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A regex of literals, classes, alternations and bounded/unbounded repeats."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        k = rng.random()
        if k < 0.3:
            parts.append(rng.choice(WORDS))
        elif k < 0.6:
            cls = rng.choice(["[a-z]", "[0-9]", "[A-Za-z_]", "[ ,.]"])
            parts.append(cls + rng.choice(["", "+", "*", "{1,3}", "{2}", "?"]))
        elif depth < 2:
            alts = [random_regex(rng, depth + 1) for _ in range(rng.randint(2, 3))]
            parts.append("(" + "|".join(alts) + ")" + rng.choice(["", "?", "*"]))
        else:
            parts.append(rng.choice(string.ascii_lowercase))
    return "".join(parts)


def random_ebnf(rng: random.Random) -> str:
    """A small recursive EBNF grammar (lists of items, nested brackets, alternatives)."""
    item = " | ".join(f'"{w}"' for w in rng.sample(WORDS, rng.randint(2, 4)))
    sep = rng.choice(['", "', '";"', '" "'])
    return (
        f"root ::= list | nested\n"
        f"list ::= item ({sep} item)*\n"
        f'nested ::= "[" (root)? "]"\n'
        f"item ::= {item} | [0-9]+\n"
    )
