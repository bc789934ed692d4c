"""logit_bias in the batched sampler: OpenAI's sparse add, per row, with every sampling path
(greedy, whole-vocabulary draws, top-k/top-p, penalties, bfloat16 logits), and logprobs of the
model's own distribution (the bias is put back)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.logit_bias import LogitBias
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample
from sampling_testlib import V, batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "extra",
    [{"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 5, "seed": 1},
     {"temperature": 1.0, "top_p": 0.9, "seed": 2}, {"temperature": 0, "presence_penalty": 1.0}],
)  # fmt: skip
def test_a_bias_steers_its_row_only(dtype, extra):
    torch.manual_seed(0)
    logits = torch.randn(3, V).to(dtype)
    given = logits.clone()
    best = logits.float().argmax(-1)
    up, down = 17, int(best[1])
    _, b = batch(
        SamplingParams(**extra, logit_bias={str(up): 100}),  # always `up`
        SamplingParams(**extra, logit_bias={down: -100.0}),  # never its best token
        SamplingParams(temperature=0),  # untouched
    )  # fmt: skip
    for _ in range(5):
        out = sample(logits, b)
        assert int(out.token_ids[0]) == up
        assert int(out.token_ids[1]) != down
        assert int(out.token_ids[2]) == int(best[2])
    assert torch.equal(logits, given)  # the caller's logits are put back


def test_logprobs_are_the_models():
    torch.manual_seed(1)
    logits = torch.randn(2, V)
    want = logits.log_softmax(-1)
    _, b = batch(SamplingParams(temperature=0, logprobs=3, logit_bias={5: 100}),
                 SamplingParams(temperature=0, logprobs=3))  # fmt: skip
    out = sample(logits.clone(), b)
    assert int(out.token_ids[0]) == 5
    assert torch.allclose(out.logprobs[0], want[0, 5])
    assert torch.allclose(out.top_logprobs, want.topk(3, -1).values)


def test_bias_is_plain_no_more():
    """A batch with a bias is not `plain`: the LM head may not sample it without logits."""
    assert batch(SamplingParams(temperature=0))[1].plain
    assert not batch(SamplingParams(temperature=0, logit_bias={1: 2}))[1].plain


def test_params_check_and_clip():
    p = SamplingParams(logit_bias={"7": 250, 3: -1e6, "0": 0.5})
    assert p.logit_bias == ((0, 0.5), (3, -100.0), (7, 100.0))
    for bad in ({"x": 1}, {"-1": 1}, {1: float("nan")}, {1: "2"}, {True: 1},
                {str(i): 1 for i in range(301)}, [(1, 2, 3)]):  # fmt: skip
        with pytest.raises(ParamError) as e:
            SamplingParams(logit_bias=bad)
        assert e.value.field == "logit_bias"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "extra",
    [{"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 5, "seed": 1},
     {"temperature": 1.0, "top_p": 0.9, "seed": 2}, {"temperature": 1.0, "min_p": 0.1, "seed": 4},
     {"temperature": 0, "repetition_penalty": 1.2, "logprobs": 2, "logit_bias": {7: 5}}],
)  # fmt: skip
def test_min_tokens_masks_the_stop_tokens_until_met(dtype, extra):
    """vLLM's min_tokens: EOS and stop_token_ids cannot be drawn while the next token is one of
    the first min_tokens (however the row samples), then can; ids past the vocabulary are
    skipped; the batch says it must be refreshed until every row has met its minimum."""
    logits = torch.full((2, V), -3.0)
    logits[:, 7] = logits[:, 9] = 20.0  # EOS and a stop token: by far the likeliest
    logits[:, 11] = 5.0
    rs, b = batch(SamplingParams(**extra, min_tokens=2, stop_token_ids=[9, V + 5]),
                  SamplingParams(temperature=0))  # fmt: skip
    rs[0] = Request("m", [1, 2, 3], rs[0].params, eos_token_ids=(7,))
    rs[0].generator = rs[1].generator = torch.Generator().manual_seed(5)
    b = SamplingBatch.build(rs, V, torch.device("cpu"))
    for _ in range(2):  # output tokens 0 and 1
        assert b.changes
        out = sample(logits.to(dtype), b)
        assert int(out.token_ids[0]) not in (7, 9) and int(out.token_ids[1]) in (7, 9)
        if out.logprobs is not None:  # the model's own distribution
            assert float(out.top_logprobs[0, 0]) == pytest.approx(
                float(logits[0].log_softmax(-1)[7]), abs=0.02
            )
        rs[0].append_token(int(out.token_ids[0]))
        b = b.refreshed(rs, V, torch.device("cpu"))
    assert int(sample(logits.to(dtype), b).token_ids[0]) in (7, 9)
    assert b.logit_bias is None or not b.logit_bias.live


def test_min_tokens_is_checked():
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4
    for bad in (-1, 5, 1.5, True):
        with pytest.raises(ParamError) as e:
            SamplingParams(max_tokens=4, min_tokens=bad)
        assert e.value.field == "min_tokens"


def test_min_tokens_masks_a_large_stop_list_from_one_cached_tensor():
    """Every stop id of the vocabulary gets one -inf entry (a bias on one gives way to it),
    taken from a tensor made once per request: the list was rebuilt token by token in Python
    at each step (49k stop ids: 50 ms a step, on the engine's loop, for every stream)."""
    vocab = 4096
    p = SamplingParams(min_tokens=3, stop_token_ids=list(range(1, vocab + 10)),
                       logit_bias={5: 3.0, 0: 2.0})  # fmt: skip
    r = Request("r", [1, 2, 3], p, eos_token_ids=(2,))
    first = LogitBias.build([r], vocab)
    cached = r.stop_ids_in_vocab
    again = LogitBias.build([r], vocab)
    assert r.stop_ids_in_vocab is cached and cached.tolist() == list(range(1, vocab))
    for b in (first, again):
        entries = dict(zip(b.tokens.tolist(), b.values.tolist(), strict=True))
        assert len(entries) == len(b.tokens) == vocab and entries[0] == 2.0
        assert all(entries[t] == float("-inf") for t in range(1, vocab))
