"""GrammarCompiler: cached per spec (LRU bounded in bytes), failures remembered, compiles off the
event loop (which keeps running: xgrammar releases the GIL) with a time bound, one compile per
spec however many ask; special tokens never allowed as text; specs validated at the door."""

from __future__ import annotations

import asyncio
import time

import pytest
import xgrammar as xgr
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.structured.compiler import GrammarCompiler
from pagoda.runtime.structured.params import MAX_SPEC_CHARS
from pagoda.runtime.structured.params import StructuredOutputsParams as Spec

PATTERN = "^[a-z]{%d,%d}[0-9]{2,%d}$"


def slow_spec(n: int, salt: int = 0) -> Spec:
    """A schema whose patterns take xgrammar ~0.1 s each to compile here."""
    props = {f"p{i}_{salt}": {"type": "string", "pattern": PATTERN % (i % 7 + 1, 40 + i, 30 + i)}
             for i in range(n)}  # fmt: skip
    return Spec(json={"type": "object", "properties": props})


@pytest.fixture
def fresh(smol_tokenizer):
    """A compiler of its own (empty cache) that records its compiles."""
    comp = GrammarCompiler(smol_tokenizer, smol_tokenizer.model_vocab_size)
    comp.compiled_kinds = []
    comp.observer = lambda spec, seconds: comp.compiled_kinds.append(spec.kind)
    yield comp
    comp.close()


def test_cached_per_spec(fresh):
    a = fresh.compile(Spec(regex="[a-z]+"))
    assert fresh.compile(Spec(regex="[a-z]+", field="elsewhere")) is a
    fresh.compile(Spec(json={"type": "object"}))
    fresh.compile(Spec(json='{"type":"object"}'))  # the same schema as text: one entry
    assert fresh.compiled_kinds == ["regex", "json"] and len(fresh) == 2
    assert fresh.compile(Spec(json={"type": "object"}, disable_any_whitespace=False)) is not None
    assert len(fresh) == 3


def test_cache_is_lru_bounded_in_bytes(fresh):
    specs = [Spec(regex=f"[a-z]{{1,{40 + i}}}") for i in range(3)]
    sizes = [fresh.compile(s).memory_size_bytes for s in specs]
    fresh.configure(cache_bytes=sizes[1] + sizes[2])  # evicts the oldest
    assert len(fresh) == 2 and fresh.cache_size_bytes == sizes[1] + sizes[2]
    fresh.compile(specs[2])  # a hit
    fresh.compile(specs[0])  # compiled again, evicting specs[1]
    assert fresh.compiled_kinds == ["regex"] * 4
    fresh.compile(specs[1])
    assert fresh.compiled_kinds == ["regex"] * 5


def test_failures_are_remembered_and_name_the_field(fresh):
    for field in ("structured_outputs.regex", "response_format"):
        with pytest.raises(ParamError) as e:
            fresh.compile(Spec(regex="(unclosed", field=field))
        assert e.value.field == field and e.value.message.startswith(field)
        assert "parenthesis" in e.value.message and "/project/cpp" not in e.value.message
    assert fresh.compiled_kinds == ["regex"]  # the second request did not compile again


async def test_compiles_off_the_loop_once_per_spec(fresh):
    spec = slow_spec(6)
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            ticks.append(time.perf_counter() - t)

    tick = asyncio.ensure_future(ticker())
    started = time.perf_counter()
    results = await asyncio.gather(*(fresh.compile_async(spec) for _ in range(4)))
    took = time.perf_counter() - started
    tick.cancel()
    assert fresh.compiled_kinds == ["json"]
    assert all(r.compiled is results[0].compiled for r in results)
    assert took > 0.2, "too fast to show that the loop kept running"
    assert max(ticks) < 0.2 and len(ticks) > took / 0.05


async def test_a_compile_over_the_time_bound_is_a_400_then_cached(fresh):
    fresh.configure(timeout_s=0.02)
    spec = slow_spec(4, salt=1)
    with pytest.raises(ParamError) as e:
        await fresh.compile_async(spec)
    assert "took longer than 0.02 s" in e.value.message
    deadline = time.monotonic() + 60
    while not len(fresh) and time.monotonic() < deadline:  # finishing in the background
        await asyncio.sleep(0.05)
    assert (await fresh.compile_async(spec)).compiled is not None  # now a cache hit


def test_special_tokens_are_never_text_and_eos_stops(compiler, smol_tokenizer):
    m = xgr.GrammarMatcher(compiler.compile(Spec(json={"type": "string"})))
    assert m.accept_token(smol_tokenizer.encode('"')[0])
    im_start = smol_tokenizer.encode("<|im_start|>")
    assert len(im_start) == 1 and not m.accept_token(im_start[0])
    assert compiler.info.stop_token_ids == list(smol_tokenizer.eos_token_ids)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"regex": "a", "grammar": 'root ::= "a"'},
        {"choice": []},
        {"choice": "yes"},
        {"choice": ["a", ""]},
        {"regex": ""},
        {"json": [1, 2]},
        {"grammar": "x" * (MAX_SPEC_CHARS + 1)},
    ],
)
def test_specs_are_checked_at_the_door(kw):
    with pytest.raises(ParamError):
        Spec(**kw)


def test_sampling_params_take_a_spec_but_not_with_ignore_eos():
    spec = Spec(json_object=True)
    assert SamplingParams(structured_outputs=spec).structured_outputs.kind == "json_object"
    with pytest.raises(ParamError) as e:
        SamplingParams(structured_outputs=spec, ignore_eos=True)
    assert e.value.field == "ignore_eos"
    with pytest.raises(ParamError):
        SamplingParams(structured_outputs={"json": {}})


@pytest.mark.parametrize(
    "kw",
    [dict(regex="[^\\x00-\\U0010FFFF]"), dict(grammar='root ::= root "a"'),
     dict(grammar='root ::= a\na ::= a "x"'), dict(regex="a^b")],
)  # fmt: skip
def test_a_spec_that_allows_nothing_is_refused(fresh, kw):
    """A grammar with nothing to start with left the sampler all -inf (NaN logprobs: a 500)."""
    with pytest.raises(ParamError) as e:
        fresh.compile(Spec(**kw, field="structured_outputs.x"))
    assert e.value.field == "structured_outputs.x"
    assert fresh.compile(Spec(regex="()")) is not None  # the empty text is an output


async def test_slow_specs_past_the_time_bound_hold_up_no_other_compile(fresh):
    """Two slow specs held both compile threads until they finished (seconds, or hours for a
    large schema), so any other spec timed out behind them; past the bound they give way."""
    fresh.configure(timeout_s=0.5)
    for salt in (2, 3):  # one after the other: both run past the bound
        with pytest.raises(ParamError):
            await fresh.compile_async(slow_spec(40, salt=salt))
    assert len(fresh) == 0, "the slow specs compiled too fast to show anything"
    started = time.perf_counter()
    assert (await fresh.compile_async(Spec(regex="[a-z]{3}x"))).compiled is not None
    assert time.perf_counter() - started < 0.5


def test_schemas_too_large_to_compile_in_time_are_refused():
    from pagoda.runtime.structured import schema as schemas

    optional = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}}
    with pytest.raises(schemas.SchemaError, match="optional properties"):
        schemas.check(optional)
    schemas.check({**optional, "required": [f"p{i}" for i in range(100)]})  # 200 optional
    many = {"type": "object", "properties": {f"o{k}": {"type": "object", "properties": {
        f"p{i}": {} for i in range(200)}, "required": [f"p{i}" for i in range(200)]}
        for k in range(25)}}  # fmt: skip
    with pytest.raises(schemas.SchemaError, match="5025 properties"):
        schemas.check(many)


ARGS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _accepts(compiled, text: str) -> bool:
    m = xgr.GrammarMatcher(compiled)
    return m.accept_string(text) and m.is_completed()


def test_vllm_s_older_structural_tag_form_is_read(compiler):
    """`structures` and `triggers`, as vLLM's docs write a structural tag (vLLM compiles it
    through xgrammar's deprecated API): was a 400 ("must have a format field")."""
    tag = {"type": "structural_tag", "triggers": ["<function="],
           "structures": [{"begin": "<function=get_weather>", "schema": ARGS,
                           "end": "</function>"}]}  # fmt: skip
    compiled = compiler.compile(Spec(structural_tag=tag))
    assert _accepts(compiled, 'Sure. <function=get_weather>{"city": "Oslo"}</function>')
    assert not _accepts(compiled, 'Sure. <function=get_weather>{"town": "Oslo"}</function>')


@pytest.mark.parametrize(
    ("schema", "loose"),
    [({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, None),
     ({"type": "object", "propertyNames": {"maxLength": 2},
       "additionalProperties": {"type": "integer"}}, "{1: 1}"),
     ({"type": "string", "pattern": "(?!a)."}, None)],
)  # fmt: skip
def test_schemas_inside_a_structural_tag_are_checked(compiler, schema, loose):
    """A tag's JSON Schema went to xgrammar unchecked: `uniqueItems` ignored ([1, 1] allowed),
    an untyped `propertyNames` writing a number as the key; now rewritten or a 400."""
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
           "content": {"type": "json_schema", "json_schema": schema}}}  # fmt: skip
    spec = Spec(structural_tag=tag, field="structured_outputs.structural_tag")
    if loose is None:
        with pytest.raises(ParamError) as e:
            compiler.compile(spec)
        assert e.value.field == "structured_outputs.structural_tag"
        assert "/format/content/json_schema" in e.value.message
    else:
        assert not _accepts(compiler.compile(spec), f"<f>{loose}</f>")
