"""GrammarState and the way out: the state follows the tokens (rebuilt when they are not what it
saw), the way out completes the grammar, and a budget is met: forced to its end, then EOS."""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.structured.bitmask import GrammarBitmask
from pagoda.runtime.structured.matcher import GrammarState
from pagoda.runtime.structured.params import StructuredOutputsParams as Spec

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"},
                                                  "minItems": 2}},
    "required": ["a", "b"],
}  # fmt: skip


def test_the_state_is_rebuilt_from_the_tokens(compiler, smol_tokenizer):
    """What a preempted request's matcher would need if its tokens ever changed: the state is
    rebuilt from the output, and then allows what a fresh matcher fed those tokens allows."""
    compiled = compiler.compile(Spec(json=SCHEMA))
    ids = smol_tokenizer.encode('{"a": "xy", "b": [1', add_special_tokens=False)
    state = GrammarState(compiled)
    state.accept(ids)
    other = smol_tokenizer.encode('{"a": "', add_special_tokens=False)
    assert state.pending(other) == -1
    state.rebuild(other)
    fresh = xgr.GrammarMatcher(compiled)
    assert all(fresh.accept_token(t) for t in other)
    a, b = (xgr.allocate_token_bitmask(1, compiler.vocab_size) for _ in range(2))
    state.matcher.fill_next_token_bitmask(a)
    fresh.fill_next_token_bitmask(b)
    assert torch.equal(a, b) and state.accepted == len(other)


@pytest.mark.parametrize(
    "spec",
    [Spec(json=SCHEMA), Spec(regex=r"(\w+ )+\w+\."), Spec(grammar='root ::= "(" [0-9]+ ("," [0-9]+)* ")"'),
     Spec(json_object=True)],
)  # fmt: skip
def test_the_way_out_completes(compiler, smol_tokenizer, spec):
    m = xgr.GrammarMatcher(compiler.compile(spec))
    prefix = {
        "json": '{"a": "a long',
        "regex": "one two",
        "grammar": "(12,3",
        "json_object": '{"k": [1, {',
    }
    assert m.accept_string(prefix[spec.kind])
    plan = compiler.closer.plan(m, 64)
    assert plan is not None and all(m.accept_token(t) for t in plan) and m.is_completed()


@pytest.mark.parametrize("prefix", ['"', '"ab.c', '"x@y'])
def test_the_way_out_does_not_walk_in_circles(compiler, prefix):
    """An e-mail's name part: the greedy way out (`}.}.}.` ...) never reached its `@`."""
    m = xgr.GrammarMatcher(compiler.compile(Spec(json={"type": "string", "format": "email"})))
    assert m.accept_string(prefix)
    plan = compiler.closer.plan(m, 64)
    assert plan is not None and all(m.accept_token(t) for t in plan) and m.is_completed()


def test_a_tight_budget_is_met(compiler, smol_tokenizer):
    """40 tokens, logits that favour anything but closing: the answer still ends with EOS
    inside the budget (forced at the end), as valid JSON."""
    spec = Spec(json=SCHEMA).with_compiled(compiler.compile(Spec(json=SCHEMA)))
    vocab = smol_tokenizer.model_vocab_size
    req = Request("t", [1], SamplingParams(max_tokens=40, structured_outputs=spec),
                  eos_token_ids=smol_tokenizer.eos_token_ids)  # fmt: skip
    gb = GrammarBitmask(smol_tokenizer, vocab, torch.device("cpu"))
    letter = smol_tokenizer.encode("a", add_special_tokens=False)[0]
    while not req.is_finished:
        logits = torch.zeros(1, vocab)
        logits[0, letter] = 10.0  # the model would write "aaaa..." forever
        gb.apply(logits, [req], [0])
        req.append_token(int(logits.argmax()))
        req.check_stop_token()
    assert req.status.finish_reason == "stop" and req.num_output_tokens <= 40
    text = smol_tokenizer.decode(req.output_token_ids[:-1])
    assert set(json.loads(text)) == {"a", "b"}


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip


def test_a_budget_that_fits_the_shortest_output_is_met(compiler, smol_tokenizer):
    """The shortest output (`{"name": "", "age": 0, "tags": []}`) is 15 tokens; a budget of 20
    ended by length with the JSON cut: the way out was counted in single characters (21
    tokens: it did not fit, so nothing was steered)."""
    shortest = smol_tokenizer.encode('{"name": "", "age": 0, "tags": []}', add_special_tokens=False)
    budget = len(shortest) + 5
    spec = Spec(json=PERSON).with_compiled(compiler.compile(Spec(json=PERSON)))
    vocab = smol_tokenizer.model_vocab_size
    req = Request("t", [1], SamplingParams(max_tokens=budget, structured_outputs=spec),
                  eos_token_ids=smol_tokenizer.eos_token_ids)  # fmt: skip
    gb = GrammarBitmask(smol_tokenizer, vocab, torch.device("cpu"))
    letter = smol_tokenizer.encode("a", add_special_tokens=False)[0]
    while not req.is_finished:
        logits = torch.zeros(1, vocab)
        logits[0, letter] = 10.0
        gb.apply(logits, [req], [0])
        req.append_token(int(logits.argmax()))
        req.check_stop_token()
    assert req.status.finish_reason == "stop", smol_tokenizer.decode(req.output_token_ids)
    assert set(json.loads(smol_tokenizer.decode(req.output_token_ids[:-1]))) == set(
        PERSON["required"]
    )


def test_no_steering_when_nothing_fits(compiler):
    state = GrammarState(compiler.compile(Spec(json=SCHEMA)))
    assert state.steer(compiler.closer, 3) == (None, False)  # the shortest answer needs more
    assert state.check_at == -1  # and it is not searched for again


@pytest.fixture
def memory_guard():
    """At most 2 GiB more address space while the test runs: without the fix below, xgrammar
    allocates until the OOM killer ends the process (here: a MemoryError-like RuntimeError)."""
    import re
    import resource

    with open("/proc/self/status") as f:
        size_kb = int(re.search(r"VmSize:\s+(\d+)", f.read()).group(1))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size_kb * 1024 + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else
                                            min(limit, hard), hard))  # fmt: skip
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize(
    ("kw", "prefix"),
    [(dict(grammar='root ::= "a" root'), "aaa"),
     (dict(grammar='root ::= "{\\"a\\": " root "}"'), '{"a": {"a": '),
     (dict(regex="hello(ab)*[^\\x00-\\U0010FFFF]"), "helloab")],
)  # fmt: skip
def test_text_forced_forever_ends_no_process(compiler, memory_guard, kw, prefix):
    """Grammars whose forced text never ends: xgrammar's `find_jump_forward_tokens` (the way
    out's shortcut) built that text until the engine died; now there is no way out, and the
    request runs to its budget."""
    m = xgr.GrammarMatcher(compiler.compile(Spec(**kw)))
    assert m.accept_string(prefix)
    assert compiler.closer.plan(m, 64) is None


def test_the_shortest_of_the_ways_a_grammar_can_go(compiler):
    """A tool call or an answer (tool_choice auto with a response format): from the start, the
    way out is the short answer, not the whole call greedy order met first (`<` before `{`):
    a budget that fits the answer is steered into it."""
    from xgrammar import structural_tag as st

    call = st.TagFormat(begin='<tool_call>\n{"name": "get_weather", "arguments": ',
                        content=st.JSONSchemaFormat(json_schema={"type": "object", "properties": {
                            "city": {"type": "string"}}, "required": ["city"]}),
                        end="}\n</tool_call>")  # fmt: skip
    answer = st.JSONSchemaFormat(json_schema={"type": "object", "properties": {
        "c": {"type": "integer"}}, "required": ["c"]})  # fmt: skip
    tag = st.StructuralTag(format=st.OrFormat(elements=[call, answer])).model_dump_json()
    compiled = compiler.compile(Spec(structural_tag=tag))
    m = xgr.GrammarMatcher(compiled)
    plan = compiler.closer.plan(m, 64)
    assert compiler.closer.vocab[plan[0]].startswith(b"{"), plan
    assert all(m.accept_token(t) for t in plan) and m.is_completed()


# what `client.chat.completions.parse` sends for a pydantic model of a Decimal, a timedelta, an
# IPv4Address, a UUID, a datetime, a time, a date and an Any
FORM = {"type": "object", "additionalProperties": False, "properties": {
    "price": {"anyOf": [{"type": "number"}, {"type": "string"}]},
    "d": {"format": "duration", "type": "string"}, "ip": {"format": "ipv4", "type": "string"},
    "u": {"format": "uuid", "type": "string"}, "when": {"format": "date-time", "type": "string"},
    "t": {"format": "time", "type": "string"}, "day": {"format": "date", "type": "string"},
    "anyv": {}}, "required": ["price", "d", "ip", "u", "when", "t", "day", "anyv"]}  # fmt: skip


def test_places_visited_again_across_fields_are_no_circle(compiler):
    """Digits of an IP address, a uuid, dates (the same few places, by bitmask) added up past
    the circle bound across fields: no way out was found from the start, so none was ever
    looked for, and a model looping in the duration ran to its budget (`parse()` failed with
    a length error at any max_tokens). Visits now count from the walk's last new place."""
    m = xgr.GrammarMatcher(compiler.compile(Spec(json=FORM)))
    plan = compiler.closer.plan(m, 400)  # from the start: what sizes the steering
    assert plan is not None and all(m.accept_token(t) for t in plan) and m.is_completed()


@pytest.mark.parametrize("ends", [True, False])
def test_a_reasoning_models_thinking_is_never_cut_but_its_answer_ends_in_the_budget(
    compiler, smol_tokenizer, ends
):
    """The grammar after `</think>` (`--reasoning-parser`): no way out is looked for through
    the free thinking, so it is never steered, however long; an answer begun more than
    `LATE_LOOK` tokens before the end is steered to close (the model writing "aaaa..." in a
    string), as without thinking."""
    from pagoda.runtime.server.reasoning import after_reasoning

    spec = after_reasoning(Spec(json=SCHEMA, field="response_format"))
    spec = spec.with_compiled(compiler.compile(spec))
    vocab = smol_tokenizer.model_vocab_size
    req = Request("t", [1], SamplingParams(max_tokens=120, structured_outputs=spec),
                  eos_token_ids=smol_tokenizer.eos_token_ids)  # fmt: skip
    gb = GrammarBitmask(smol_tokenizer, vocab, torch.device("cpu"))
    thought = "<think>" + " a plan" * (10 if ends else 200)
    script = smol_tokenizer.encode(thought + ("</think>" if ends else ""), add_special_tokens=False)
    letter = smol_tokenizer.encode("a", add_special_tokens=False)[0]
    while not req.is_finished:
        n = req.num_output_tokens
        logits = torch.zeros(1, vocab)
        logits[0, script[n] if n < len(script) else letter] = 10.0
        gb.apply(logits, [req], [0])
        req.append_token(int(logits.argmax()))
        req.check_stop_token()
    out = req.output_token_ids
    assert out[: min(len(out), len(script))] == script[: len(out)]  # the thinking as written
    if not ends:
        assert req.status.finish_reason == "length" and len(out) == 120
        return
    assert req.status.finish_reason == "stop" and len(out) <= 120
    answer = smol_tokenizer.decode(out[len(script) : -1])
    assert set(json.loads(answer)) == {"a", "b"}
