"""JSON Schemas before xgrammar: what it would enforce loosely is rewritten exactly or refused.

The property behind it: every output the compiled grammar allows validates against the schema
the client sent. Random walks through the grammar (random allowed tokens, ended by the closer)
check it for rewritten schemas and for random ones."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import xgrammar as xgr
from pagoda.runtime.structured import schema as schemas
from pagoda.runtime.structured.bitmask import soft_close
from pagoda.runtime.structured.matcher import GrammarState
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
        ({"type": "object", "required": ["a"], "additionalProperties": False}, "/required"),
        ({"type": "string", "pattern": "^(ab)+$", "maxLength": 5}, "/pattern"),
        ({"$ref": "https://example.com/schema.json"}, "/$ref"),
        ({"type": "strin"}, "/type"),
        ({"type": "integer", "minimum": "0"}, "/minimum"),
        ({"allOf": [{"type": "object", "additionalProperties": False}]}, "/allOf/0/additionalProperties"),
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
]  # fmt: skip


def test_rewrites_are_exact():
    s = schemas.check(REWRITTEN[0])
    assert "allOf" not in s and s["required"] == ["a", "b"]
    assert schemas.check(REWRITTEN[2]) == {"type": "string", "pattern": "^[A-Z]{3}$"}
    assert schemas.check(REWRITTEN[3])["pattern"] == "^[a-z]{2,4}$"
    assert schemas.check(REWRITTEN[4])["pattern"] == "^[0-9]{0,2}$"
    original = {"type": "object", "required": ["a"]}
    schemas.check(original)
    assert original == {"type": "object", "required": ["a"]}  # the client's dict is not changed


def _random_outputs(compiler, tok, schema, n: int, seed: int) -> list[str]:
    """n outputs of random allowed tokens, each ended by the closer within 80 tokens."""
    spec = StructuredOutputsParams(json=schema)
    compiled = compiler.compile(spec)
    closer = compiler.closer
    rng = random.Random(seed)
    mask = xgr.allocate_token_bitmask(1, compiler.vocab_size)
    outs = []
    for _ in range(n):
        state, ids = GrammarState(compiled), []
        for left in range(80, 0, -1):
            token, soft = state.steer(closer, left)
            if token is None:
                state.matcher.fill_next_token_bitmask(mask)
                if soft:  # as GrammarBitmask steers
                    token = soft_close(mask[0], closer.closes, compiler.vocab_size)
            if token is None:
                allowed = np.flatnonzero(
                    np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")
                )
                token = int(allowed[rng.randrange(len(allowed))])
            ids.append(token)
            state.accept(ids)
            if state.matcher.is_terminated():
                break
        assert state.matcher.is_terminated(), (schema, tok.decode(ids))
        outs.append(tok.decode(ids[:-1]))
    return outs


@pytest.mark.parametrize("schema", REWRITTEN)
def test_rewritten_schemas_only_allow_valid_output(schema, compiler, smol_tokenizer):
    for text in _random_outputs(compiler, smol_tokenizer, schema, 6, seed=0):
        jsonschema.validate(json.loads(text), schema)


def test_random_schemas_only_allow_valid_output(compiler, smol_tokenizer):
    rng = random.Random(2024)
    for i in range(25):
        schema = random_schema(rng)
        for text in _random_outputs(compiler, smol_tokenizer, schema, 2, seed=i):
            jsonschema.validate(json.loads(text), schema)
