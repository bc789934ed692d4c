"""allowed_token_ids in the batched sampler: only the listed tokens are sampled, on every
sampling path; rows that do not ask are untouched; logprobs are the model's own (vLLM's raw
logprobs); a row whose grammar allows none of its tokens keeps the grammar's choice; a row
whose allowed tokens all have -inf logits (a pruned LM head's ids) still draws one of them."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample
from sampling_testlib import V, batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "extra",
    [{"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "top_k": 5, "seed": 1},
     {"temperature": 1.0, "top_p": 0.9, "seed": 2}, {"temperature": 1.0, "min_p": 0.1, "seed": 4},
     {"temperature": 0, "presence_penalty": 1.0, "logit_bias": {9: 100}}],
)  # fmt: skip
def test_only_allowed_tokens_are_sampled(dtype, extra):
    torch.manual_seed(0)
    logits = torch.randn(3, V).to(dtype)
    given = logits.clone()
    best = logits.float().argmax(-1)
    allowed = [3, 40, 41, 50]
    _, b = batch(
        SamplingParams(**extra, allowed_token_ids=allowed),
        SamplingParams(temperature=0),  # untouched
        SamplingParams(**extra, allowed_token_ids=[int(best[2])]),  # its own best: kept
    )
    seen = set()
    for _ in range(20):
        out = sample(logits, b)
        seen.add(int(out.token_ids[0]))
        assert int(out.token_ids[1]) == int(best[1])
        assert int(out.token_ids[2]) == int(best[2])
    assert seen <= set(allowed)
    assert torch.equal(logits, given)  # the caller's logits are put back


def test_greedy_takes_the_best_allowed_token():
    torch.manual_seed(2)
    logits = torch.randn(2, V)
    allowed = [5, 6, 30, 31]
    _, b = batch(SamplingParams(temperature=0, allowed_token_ids=allowed),
                 SamplingParams(temperature=0))  # fmt: skip
    out = sample(logits.clone(), b)
    assert int(out.token_ids[0]) == allowed[int(logits[0, allowed].argmax())]
    assert int(out.token_ids[1]) == int(logits[1].argmax())


def test_logprobs_are_the_models():
    """vLLM's default logprobs are raw (before allowed_token_ids and the other processors)."""
    torch.manual_seed(1)
    logits = torch.randn(2, V)
    want = logits.log_softmax(-1)
    _, b = batch(SamplingParams(temperature=0, logprobs=3, allowed_token_ids=[7]),
                 SamplingParams(temperature=0, logprobs=3))  # fmt: skip
    out = sample(logits.clone(), b)
    assert int(out.token_ids[0]) == 7
    assert torch.allclose(out.logprobs[0], want[0, 7])
    assert torch.allclose(out.top_logprobs, want.topk(3, -1).values)


def test_a_grammar_that_allows_none_of_them_wins():
    """The grammar's mask is already in the logits: an empty intersection keeps the grammar's
    tokens (no crash, no token outside the grammar)."""
    torch.manual_seed(3)
    logits = torch.randn(2, V)
    logits[0, :] = float("-inf")
    logits[0, [10, 11]] = torch.tensor([0.5, 1.5])  # the grammar allows 10 and 11 only
    from pagoda.runtime.structured.params import StructuredOutputsParams

    so = StructuredOutputsParams(choice=["x"])
    for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 1}):
        _, b = batch(SamplingParams(**extra, allowed_token_ids=[1, 2], structured_outputs=so),
                     SamplingParams(**extra, allowed_token_ids=[1, 2]))  # fmt: skip
        out = sample(logits.clone(), b)
        assert int(out.token_ids[0]) in (10, 11)
        assert int(out.token_ids[1]) in (1, 2)


def test_allowed_is_plain_no_more():
    assert not batch(SamplingParams(temperature=0, allowed_token_ids=[1]))[1].plain


def test_params_check():
    p = SamplingParams(allowed_token_ids=(3, 1))
    assert p.allowed_token_ids == [3, 1]
    for bad in ([], [-1], [1.0], [True], "1", 5, [2**63]):
        with pytest.raises(ParamError) as e:
            SamplingParams(allowed_token_ids=bad)
        assert e.value.field == "allowed_token_ids"
    p.allowed_token_ids = []  # mutable: checked again on receipt
    with pytest.raises(ParamError):
        p.validated()


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_bans_that_leave_none_of_them_give_way(temperature):
    """bad_words or min_tokens banning every allowed token (`allowed_token_ids: [eos],
    min_tokens: 2`): the allowed tokens win for that step (the row had no finite logit and drew
    token 0, outside the list); a ban that leaves some allowed token still holds."""
    torch.manual_seed(0)
    logits = torch.randn(3, V)
    p = SamplingParams(temperature=temperature, seed=5, allowed_token_ids=[7, 9])
    reqs = [Request("a", [1, 2, 3], p, bad_words=((7,), (9,))),
            Request("b", [1, 2, 3], p.clone(min_tokens=2), eos_token_ids=(7, 9)),
            Request("c", [1, 2, 3], p, bad_words=((7,),))]  # fmt: skip
    for r in reqs:
        r.generator = torch.Generator().manual_seed(5)
    out = sample(logits.clone(), SamplingBatch.build(reqs, V, torch.device("cpu")))
    got = out.token_ids.tolist()
    assert got[0] in (7, 9) and got[1] in (7, 9) and got[2] == 9, got


def test_allowed_tokens_the_model_never_scores_are_still_drawn():
    """Allowed ids whose logits are all -inf (Apertus 1.5's pruned LM-head ids, here 40..63):
    the row draws one of them, all alike (greedy: the first allowed id; sampled: uniform),
    batched with other rows; without the fix such a row took a token outside its list. A row
    without a finite logit at all (NaN, all -inf) still gets NO_TOKEN."""
    torch.manual_seed(4)
    logits = torch.randn(8, V)
    logits[:, 40:] = float("-inf")
    logits[6] = float("-inf")
    logits[7, 50] = float("nan")
    pruned = [60, 45, 52]
    sampled = {"temperature": 0.8, "seed": 3}
    reqs, b = batch(
        SamplingParams(temperature=0, allowed_token_ids=pruned),
        SamplingParams(**sampled, allowed_token_ids=pruned),
        SamplingParams(**sampled, top_k=2, allowed_token_ids=pruned),
        SamplingParams(temperature=0, allowed_token_ids=[3, 50]),  # 3 is finite: 3
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, logprobs=1, allowed_token_ids=pruned),
        SamplingParams(temperature=0, allowed_token_ids=pruned),  # all -inf: NO_TOKEN
        SamplingParams(temperature=0, allowed_token_ids=[50, 51]),  # NaN: NO_TOKEN
    )
    drawn: dict[int, set[int]] = {1: set(), 2: set()}
    for seed in range(12):
        for r in reqs:
            if r.generator is not None:
                r.generator.manual_seed(seed)
        out = sample(logits.clone(), b)
        got = out.token_ids.tolist()
        assert got[0] == 45 and got[5] == 45, got  # the first allowed id
        assert got[3] == 3 and got[4] == int(logits[4].argmax()), got
        assert got[6] == -1 and got[7] == -1, got
        drawn[1].add(got[1])
        drawn[2].add(got[2])
    assert drawn[1] <= set(pruned) and len(drawn[1]) > 1, drawn  # uniform: more than one
    assert drawn[2] <= set(pruned), drawn
