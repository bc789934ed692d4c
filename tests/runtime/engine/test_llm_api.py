"""The offline API called the way a vLLM user calls it: `generate(prompts, sampling_params=...)`
with dict prompts and a progress-bar factory, `chat` with its rendering options, lifecycle."""

from __future__ import annotations

import numpy as np
import pytest
from pagoda.runtime import LLM, SamplingParams

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
    assert o.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in o.logprobs))
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
