"""Prompt logprobs (`SamplingParams.prompt_logprobs`, vLLM's): every prompt token after the
first scored by the engine as transformers scores it (log_softmax of the full sequence's
logits, float32 on CPU), over chunked prefills, beside the prefix cache, and in vLLM's shape."""

from __future__ import annotations

import pytest
import torch
from hf_oracle import check_prompt_logprobs, make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine.outputs import Logprob
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.sampling.params import ParamError

pytest.importorskip("transformers")
K = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_llama(path)
    return model, load_model(str(path))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_logprobs_match_transformers_over_chunks_and_a_shared_prefix(tiny, async_scheduling):
    """Chunks of 16 tokens (a 150-token prompt is scored over ten steps, beside other
    requests' decodes); the second batch shares a 96-token prefix with the first, which the
    prefix cache holds: the requests that ask compute it again, the one that does not reuses it."""
    model, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=16, max_num_seqs=8,
              enable_prefix_caching=True, async_scheduling=async_scheduling)  # fmt: skip
    prompts = [[(7 * i + 3) % 300 for i in range(n)] for n in (1, 2, 5, 40, 150)]
    asking = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=K)
    plain = SamplingParams(temperature=0, max_tokens=3)
    outs = llm.generate(prompts, [asking, plain, asking, asking, asking])
    assert outs[1].prompt_logprobs is None
    assert outs[0].prompt_logprobs == [None]
    for p, o in zip(prompts, outs):
        if o.prompt_logprobs is not None:
            check_prompt_logprobs(model, p, o.prompt_logprobs)
    shared = prompts[4][:96]
    second = [[*shared, 11, 12, 13], [*shared, 21, 22]]
    outs = llm.generate(second, [asking, plain])
    check_prompt_logprobs(model, second[0], outs[0].prompt_logprobs)
    assert outs[0].num_cached_tokens == 0, "a request scoring its prompt reads no cache"
    assert outs[1].num_cached_tokens == 96 and outs[1].prompt_logprobs is None
    # the completions are those of a request that did not ask
    again = llm.generate(prompts[3:], plain)
    assert (
        again[0].outputs[0].token_ids == llm.generate(prompts[3:], asking)[0].outputs[0].token_ids
    )
    assert llm.engine.runner.prompt_logprob_requests == {}, "scored requests are let go"


def test_steps_without_an_asking_request_score_nothing(tiny, monkeypatch):
    """Plain requests never reach the scoring code; an aborted asking request is let go."""
    from pagoda.runtime.worker import prompt_logprobs

    _, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    calls = []
    monkeypatch.setattr(prompt_logprobs, "prompt_rows", lambda *a: calls.append(a))
    llm.generate([[5, 6, 7, 8]] * 3, SamplingParams(max_tokens=4))
    assert calls == []
    llm.engine.add_request("x", [5, 6, 7], SamplingParams(prompt_logprobs=1))
    llm.engine.abort_request("x")
    assert llm.engine.runner.prompt_logprob_requests == {}


def test_k_zero_n_two_and_vllm_shape(tiny):
    model, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    prompt = [5, 17, 42, 9, 100, 3]
    (out,) = llm.generate([prompt], SamplingParams(n=2, max_tokens=2, prompt_logprobs=0, seed=1))
    check_prompt_logprobs(model, prompt, out.prompt_logprobs, k=0)
    assert all(len(d) == 1 for d in out.prompt_logprobs[1:]), "k = 0: the token alone"
    assert isinstance(out.prompt_logprobs[1][17], Logprob)
    assert len(out.outputs) == 2 and all(len(c.token_ids) == 2 for c in out.outputs)


def test_preempted_requests_score_each_position_once(tiny):
    """A pool of 7 blocks of 16 for three 53-, 23- and 48-token prompts in 16-token chunks:
    requests are preempted mid-prompt and recomputed; each prompt token is scored once."""
    model, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", num_blocks_override=7, block_size=16,
              max_model_len=96, max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    shared = [(7 * i + 3) % 290 + 5 for i in range(48)]
    prompts = [[*shared, 11, 12, 13, 14, 15], [(5 * i + 1) % 290 + 5 for i in range(23)], shared]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                prompt_logprobs=2))  # fmt: skip
    assert llm.engine.scheduler.num_preemptions > 0
    for p, o in zip(prompts, outs):
        check_prompt_logprobs(model, p, o.prompt_logprobs, k=2)


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True])
def test_bad_prompt_logprobs_are_refused(bad):
    with pytest.raises(ParamError) as err:
        SamplingParams(prompt_logprobs=bad)
    assert err.value.field == "prompt_logprobs"


def test_the_torch_path_scores_as_the_native_kernels(monkeypatch):
    """Off the CPU (or without a C compiler) rows are scored by a float32 log-softmax in slices
    of ROWS_AT_ONCE rows: the same values, ranks and top k."""
    from pagoda.runtime.sampling import native as kernels
    from pagoda.runtime.sampling import ops
    from pagoda.runtime.worker import prompt_logprobs

    torch.manual_seed(0)
    logits, targets = torch.randn(70, 300) * 3, torch.randint(0, 300, (70,))
    native = prompt_logprobs.score(logits, targets, 4)
    monkeypatch.setattr(kernels, "usable", lambda x: False)
    monkeypatch.setattr(ops, "ROWS_AT_ONCE", 32)
    plain = prompt_logprobs.score(logits, targets, 4)
    assert torch.equal(native.rank, plain.rank) and torch.equal(native.top_ids, plain.top_ids)
    assert torch.allclose(native.chosen, plain.chosen, atol=1e-5)
    assert torch.allclose(native.top_logprobs, plain.top_logprobs, atol=1e-5)
    ref = logits.log_softmax(-1)
    assert torch.allclose(plain.chosen, ref.gather(1, targets[:, None])[:, 0], atol=1e-6)
    assert prompt_logprobs.score(logits, targets, 0).top_ids is None
