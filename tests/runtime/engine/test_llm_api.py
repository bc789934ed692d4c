"""The offline API called the way a vLLM user calls it: `generate(prompts, sampling_params=...)`
with dict prompts and a progress-bar factory, `chat` with its rendering options, lifecycle."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from pagoda.runtime import LLM, SamplingParams, TextPrompt, TokensPrompt

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(smol):
    return LLM(loaded=smol, max_model_len=256, kv_cache_memory=24 << 20)


class Bar:
    """A tqdm stand-in (vLLM's `use_tqdm` may be a callable that makes the bar)."""

    def __init__(self, *, total: int, fail_at: int | None = None, **_: object) -> None:
        self.total, self.done, self.closed, self.fail_at = total, 0, False, fail_at

    def update(self, k: int) -> None:
        self.done += k
        if self.done == self.fail_at:
            raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True


def test_vllm_call_shapes(llm):
    text = llm.generate("Hello", GREEDY)[0]
    ids = text.prompt_token_ids
    bars = []
    outs = llm.generate(
        [{"prompt": "Hello"}, {"prompt_token_ids": ids}, "Hello"],
        sampling_params=[GREEDY, GREEDY, GREEDY.clone(max_tokens=2)],
        use_tqdm=lambda **kw: bars.append(Bar(**kw)) or bars[-1],
    )
    assert [o.prompt for o in outs] == ["Hello", None, "Hello"]
    typed = llm.generate([TextPrompt(prompt="Hello"), TokensPrompt(prompt_token_ids=ids)], GREEDY)
    assert [o.outputs[0].token_ids for o in typed] == [text.outputs[0].token_ids] * 2
    (arr,) = llm.generate({"prompt_token_ids": np.array(ids)}, GREEDY)  # numpy ids, as Python's
    assert arr.prompt_token_ids == ids and type(arr.prompt_token_ids[0]) is int
    assert arr.outputs[0].token_ids == text.outputs[0].token_ids
    with pytest.raises(ValueError, match="prompt_token_ids must be a list of integers"):
        llm.generate({"prompt_token_ids": [1.5, 2]}, GREEDY)
    assert [o.outputs[0].token_ids for o in outs[:2]] == [text.outputs[0].token_ids] * 2
    assert outs[2].outputs[0].token_ids == text.outputs[0].token_ids[:2]
    assert bars[0].total == bars[0].done == 3 and bars[0].closed
    with pytest.raises(ValueError, match="1 for 2 prompts"):
        llm.generate(["a", "b"], [GREEDY])
    with pytest.raises(ValueError, match="multi_modal_data"):  # refused, not ignored
        llm.generate({"prompt": "Hi", "multi_modal_data": {"image": None}}, GREEDY)
    with pytest.raises(ValueError, match="mm_processor_kwargs: this model reads no images"):
        llm.generate({"prompt": "Hi", "mm_processor_kwargs": {"max_pixels": 4096}}, GREEDY)
    with pytest.raises(ValueError, match="needs 'prompt'"):
        llm.generate({}, GREEDY)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_interrupted_generate_leaves_no_request_behind(smol, async_scheduling):
    """Ctrl-C (here raised by the progress bar after the first finished request) must not leave
    requests in the engine: the next call used to fail with KeyError on their outputs. With
    async scheduling (CUDA's default) a step is still in flight when the call is interrupted."""
    llm = LLM(loaded=smol, max_model_len=128, kv_cache_memory=8 << 20,
              async_scheduling=async_scheduling)  # fmt: skip
    prompts = ["One", "Two two two"]
    params = [GREEDY.clone(max_tokens=1), GREEDY.clone(max_tokens=8)]
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, params, use_tqdm=lambda **kw: Bar(fail_at=1, **kw))
    assert not llm.engine.scheduler.has_unfinished()  # (a step may still be in flight)
    again = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in again] == [1, 8]
    assert (
        again[1].outputs[0].token_ids == llm.generate(prompts[1], params[1])[0].outputs[0].token_ids
    )
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_integrity()


def test_cumulative_logprob(llm):
    (out,) = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=3, logprobs=0))
    o = out.outputs[0]
    assert o.cumulative_logprob == pytest.approx(
        sum(d[t].logprob for t, d in zip(o.token_ids, o.logprobs))
    )
    assert o.cumulative_logprob < 0 and out.finished and o.finished()
    assert llm.generate("Hi", GREEDY)[0].outputs[0].cumulative_logprob is None


def test_chat_options(llm):
    user = [{"role": "user", "content": "Hi"}]
    tok = llm.tokenizer
    (out,) = llm.chat(user, GREEDY)
    text = tok.apply_chat_template(user)
    assert out.prompt == text
    assert out.prompt_token_ids == tok.encode(text, add_special_tokens=False)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert llm.chat(parts, GREEDY)[0].prompt == text  # text parts, as the server joins them
    (no_gen,) = llm.chat(user, GREEDY, add_generation_prompt=False)
    assert no_gen.prompt == tok.apply_chat_template(user, add_generation_prompt=False)
    assert no_gen.prompt != text
    convo = [*user, {"role": "assistant", "content": "Hello, I am"}]
    (cont,) = llm.chat(convo, GREEDY, continue_final_message=True)
    assert cont.prompt.endswith("Hello, I am")
    both = llm.chat([user, convo], GREEDY)  # a list of conversations, in order
    assert [o.prompt for o in both] == [text, tok.apply_chat_template(convo)]
    with pytest.raises(ValueError, match="cannot both be true"):
        llm.chat(convo, GREEDY, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(ValueError, match="does not read 'enable_thinking'"):
        llm.chat(user, GREEDY, chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(ValueError, match="only text parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], GREEDY)


def test_vllm_engine_argument_spellings(smol):
    """`enforce_eager=True` (vLLM's "no CUDA graphs") and `trust_remote_code` build an LLM."""
    with LLM(loaded=smol, max_model_len=128, kv_cache_memory=8 << 20, enforce_eager=True,
             trust_remote_code=True) as eager:  # fmt: skip
        assert eager.config.enable_cuda_graphs is False
    with pytest.raises(ValueError, match="not both"):
        LLM(loaded=smol, enforce_eager=True, enable_cuda_graphs=True)


def test_close_and_context_manager(smol):
    with LLM(loaded=smol, max_model_len=128, kv_cache_memory=8 << 20) as a:
        b = LLM(loaded=smol, max_model_len=128, kv_cache_memory=8 << 20)  # two in one process
        assert a.generate("Hi", GREEDY)[0].outputs[0].token_ids == (
            b.generate("Hi", GREEDY)[0].outputs[0].token_ids
        )
    a.close()  # twice: no error
    with pytest.raises(RuntimeError, match="closed"):
        a.generate("Hi", GREEDY)
    with pytest.raises(RuntimeError, match="closed"):
        a.chat([{"role": "user", "content": "Hi"}], GREEDY)
    b.close()


TOOLS_TEMPLATE = (
    "{% if tools %}[{% for t in tools %}{{ t['function']['name'] }};{% endfor %}]{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{{ c['function']['arguments'] | tojson }}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_tools(tmp_path, llm):
    """Tools reach a template that renders them, call arguments as objects (as vLLM and the
    server hand them over); a template that ignores tools gets a ValueError, not silence."""
    import json

    from hf_oracle import make_tiny_model
    from pagoda.runtime.model.loader import load_model

    make_tiny_model(tmp_path, "Qwen3", head_dim=64)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TOOLS_TEMPLATE}))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    with LLM(loaded=load_model(str(tmp_path)), dtype="float32", kv_cache_memory=4 << 20) as tiny:
        (out,) = tiny.chat(messages, SamplingParams(temperature=0, max_tokens=2), tools=tools)
    assert out.prompt == (
        '[get_weather;]<user>Weather?<assistant>{"city": "Paris"}<tool>sunny<assistant>'
    )
    with pytest.raises(ValueError, match="does not render tools"):
        llm.chat(messages[:1], GREEDY, tools=tools)


def test_params_mutated_as_vllm_users_do(llm):
    """vLLM's SamplingParams are mutable; changes are validated when generate receives them."""
    sp = SamplingParams()
    sp.max_tokens, sp.temperature, sp.ignore_eos = 3, 0, True
    (out,) = llm.generate("Hello", sp)
    assert (
        out.outputs[0].token_ids
        == llm.generate("Hello", GREEDY.clone(max_tokens=3))[0].outputs[0].token_ids
    )
    sp.top_p = 0  # invalid: refused when received, before anything runs
    with pytest.raises(ValueError, match="top_p"):
        llm.generate(["Hello", "Hi"], [GREEDY, sp])
    assert not llm.engine.has_unfinished_requests()


def test_generate_copies_and_validates_each_params_once(llm, monkeypatch):
    """The copy `generate` validates when it receives the params is the one that runs: the
    core's add_request neither copies nor checks it again (issue 40: ~15-25 us a request)."""
    sp = GREEDY.clone(max_tokens=2)
    made = []
    post_init = SamplingParams.__post_init__
    monkeypatch.setattr(
        SamplingParams, "__post_init__", lambda self: (made.append(self), post_init(self))[1]
    )
    (out,) = llm.generate("Hello", sp)
    assert len(made) == 1 and made[0] is not sp and len(out.outputs[0].token_ids) == 2


def test_logprobs_in_vllms_shape(llm):
    """Per generated token {token id: Logprob(logprob, rank, decoded_token)}: the sampled token
    first, with its rank in the vocabulary (above k when not among the top k), then the top k
    ranked 1..k. The oracle for the ranks is a run with the same seed and 20 alternatives."""
    params = SamplingParams(temperature=1.5, seed=7, max_tokens=12, ignore_eos=True, logprobs=2)
    (few,) = llm.generate("The weather today", params)
    (many,) = llm.generate("The weather today", params.clone(logprobs=20))
    o, wide = few.outputs[0], many.outputs[0]
    assert o.token_ids == wide.token_ids  # logprobs do not change the draw
    outside = 0
    for tok, pos, pos20 in zip(o.token_ids, o.logprobs, wide.logprobs):
        assert next(iter(pos)) == tok and next(iter(pos20)) == tok  # the sampled token first
        r = pos[tok].rank
        assert r == pos20[tok].rank
        assert sorted(p.rank for p in pos.values()) == ([1, 2] if r <= 2 else [1, 2, r])
        assert sorted(p.rank for p in pos20.values()) == [*range(1, 21), *([r] if r > 20 else [])]
        best = {t for t, p in pos20.items() if p.rank <= 2}
        assert {t for t, p in pos.items() if p.rank <= 2} == best
        worst = min(p.logprob for p in pos20.values() if p.rank <= 20)
        assert r <= 20 or pos[tok].logprob <= worst
        outside += r > 2
        for t, lp in pos.items():
            assert lp.decoded_token == llm.tokenizer.decode([t], skip_special_tokens=False)
            assert lp.logprob == pytest.approx(pos20[t].logprob, abs=1e-5)
    assert outside > 0  # at temperature 1.5 some draws fall outside the best two
    assert o.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(o.token_ids, o.logprobs))
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_by_default_on_a_terminal_only(llm, monkeypatch):
    """vLLM's generate shows a bar unless use_tqdm=False: on stderr, and only where stderr is a
    terminal, so that logs get no carriage-return lines."""
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        llm.generate(["Hi", "Yo"], GREEDY)
        assert ("Processed prompts" in stream.getvalue()) is shown
        assert "2/2" in stream.getvalue() if shown else stream.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", stream := Terminal())
    llm.generate("Hi", GREEDY, use_tqdm=False)
    assert stream.getvalue() == ""


def test_get_tokenizer_answers_hugging_face_calls(llm):
    """What vLLM scripts do with `llm.get_tokenizer()` (a transformers tokenizer there)."""
    tok = llm.get_tokenizer()
    user = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    (out,) = llm.chat(user, GREEDY)
    assert text == out.prompt
    assert tok.apply_chat_template(user, add_generation_prompt=True) == out.prompt_token_ids
    assert tok.apply_chat_template(user, tokenize=False) != text  # transformers' default: no prompt
    ids = tok.encode("Hello world")
    assert tok(["Hello world"])["input_ids"] == [ids] and tok.decode(ids) == "Hello world"
    assert tok("Hello world").input_ids == ids  # transformers' BatchEncoding reads both ways
    eos = tok.eos_token_id
    assert tok.decode([*ids, eos]).endswith(tok.eos_token)  # special tokens kept by default
    assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(ids)) == ids
    assert len(tok) == len(tok.get_vocab()) == llm.tokenizer.vocab_size
    with pytest.raises(ValueError, match="return_dict"):
        tok.apply_chat_template(user, return_dict=True)


def test_a_sample_seeded_minus_one_stays_seeded(llm):
    """Sample i of a seeded request is seeded seed + i: with seed -2 sample 1 gets -1, which must
    not read as vLLM's "no seed" (only a request's own seed -1 does)."""
    p = SamplingParams(temperature=2.0, seed=-2, n=2, max_tokens=8, ignore_eos=True)
    runs = [[o.token_ids for o in llm.generate("Once", p)[0].outputs] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
