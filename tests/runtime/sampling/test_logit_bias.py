"""logit_bias in the batched sampler: OpenAI's sparse add, per row, with every sampling path
(greedy, whole-vocabulary draws, top-k/top-p, penalties, bfloat16 logits), and logprobs of the
model's own distribution (the bias is put back)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample

V = 64


def batch(*params: SamplingParams) -> tuple[list[Request], SamplingBatch]:
    rs = []
    for i, p in enumerate(params):
        r = Request(f"r{i}", [1, 2, 3], p)
        if p.seed is not None:
            r.generator = torch.Generator().manual_seed(p.seed)
        rs.append(r)
    return rs, SamplingBatch.build(rs, V, torch.device("cpu"))


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
