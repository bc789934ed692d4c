"""The native logprobs kernel (`native.logprob_rows`): PyTorch's log_softmax at the
chosen tokens and its top-k, for float32 and bfloat16 rows (read as they are), k from 0 to the
whole vocabulary, ties by index, -inf entries; and `sample` returning them for bf16 logits."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling import native
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample

pytestmark = pytest.mark.skipif(not native.available(), reason="no native kernels")


def place_by_index(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each row's token's place in the row by value, ties by index (stable sort; 1 = the best)."""
    order = x.float().sort(dim=-1, descending=True, stable=True).indices
    return (order == tokens[:, None]).int().argmax(-1) + 1


def torch_reference(x: torch.Tensor, tokens: torch.Tensor, k: int):
    """log_softmax in float64; top-k ordered by value, then index (stable sort)."""
    lp = x.double().log_softmax(-1)
    order = lp.sort(dim=-1, descending=True, stable=True).indices[:, :k]
    return lp.gather(1, tokens[:, None])[:, 0], order, lp.gather(1, order)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("v, k", [(32000, 5), (32000, 20), (300, 20), (50, 50), (8192, 0)])
def test_matches_log_softmax_and_its_top_k(v, k, dtype):
    torch.manual_seed(v + k)
    x = (torch.randn(40, v) * torch.linspace(0.1, 8, 40)[:, None]).to(dtype)
    tokens = torch.randint(0, v, (40,))
    chosen, ids, lps = native.logprob_rows(x, tokens, k)
    want_c, want_ids, want_lps = torch_reference(x.float(), tokens, k)
    torch.testing.assert_close(chosen.double(), want_c, rtol=1e-6, atol=1e-5)
    if k == 0:
        assert ids is None and lps is None
        return
    assert torch.equal(ids, want_ids)  # bf16 rows tie often: ranked by index
    torch.testing.assert_close(lps.double(), want_lps, rtol=1e-6, atol=1e-5)


def test_infinite_and_missing_entries():
    x = torch.randn(3, 100)
    x[0, 10:] = float("-inf")  # fewer finite entries than k
    x[1, 4] = float("nan")  # a NaN is never among the best
    chosen, ids, lps = native.logprob_rows(x, torch.tensor([50, 4, 0]), 12)
    assert chosen[0] == float("-inf") and set(ids[0, :10].tolist()) == set(range(10))
    assert lps[0, 10:].eq(float("-inf")).all()
    assert 4 not in ids[1].tolist()
    with pytest.raises(IndexError):
        native.logprob_rows(x, torch.tensor([0, 1, 100]), 2)


def test_sample_returns_them_for_bfloat16_logits_as_for_their_float32_copy():
    torch.manual_seed(3)
    x = (torch.randn(6, 2000) * 3).bfloat16()
    ps = [SamplingParams(temperature=0.8, seed=i, logprobs=3) for i in range(6)]
    reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(ps)]

    def run(logits):
        for r in reqs:
            r.generator = torch.Generator().manual_seed(r.params.seed)
        return sample(logits, SamplingBatch.build(reqs, 2000, torch.device("cpu")))

    a, b = run(x), run(x.float())
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.top_ids, b.top_ids)
    assert torch.equal(a.ranks, b.ranks)  # the sampled tokens' ranks (vLLM's Logprob.rank)
    torch.testing.assert_close(a.logprobs, b.logprobs)
    torch.testing.assert_close(a.top_logprobs, b.top_logprobs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("v", [300, 32001])
def test_rank_rows_places_the_tokens_ties_by_index(v, dtype):
    """Prompt logprobs' rank (`native.rank_rows`): the token's place by value, ties by index as
    in the top-k lists (a row of equal logits ranks token i at i + 1; vLLM's >= count ranked
    them all last), -inf rows and the best token (rank 1)."""
    torch.manual_seed(v)
    x = (torch.randn(37, v) * 4).to(dtype)
    x[1] = 0.0
    x[2, : v // 2] = float("-inf")
    tokens = torch.randint(0, v, (37,))
    tokens[3] = int(x[3].float().argmax())
    rank = native.rank_rows(x, tokens)
    assert rank.dtype == torch.int64
    assert torch.equal(rank, place_by_index(x, tokens))
    assert rank[1] == tokens[1] + 1 and rank[3] == 1


def test_the_sampled_tokens_rank_as_vllm_counts_it_on_both_paths(monkeypatch):
    """`SamplerOutput.ranks`: the sampled token's place by value, ties by index, from the native
    kernels and from the PyTorch path alike."""
    torch.manual_seed(4)
    x = torch.randn(5, 3000) * 4
    x[0, :7] = x[0, 7]
    ps = [SamplingParams(temperature=1.5, seed=i, logprobs=2) for i in range(5)]
    reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(ps)]

    def run():
        for r in reqs:
            r.generator = torch.Generator().manual_seed(r.params.seed)
        return sample(x.clone(), SamplingBatch.build(reqs, 3000, torch.device("cpu")))

    a = run()
    monkeypatch.setattr(native, "usable", lambda *_: False)
    b = run()
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.ranks, b.ranks)
    assert torch.equal(a.ranks, place_by_index(x, a.token_ids))


@pytest.mark.parametrize("k", [1, 5, 20])
def test_a_tied_sampled_tokens_rank_is_its_top_k_place(monkeypatch, k):
    """bfloat16 logits tie often: a sampled token among the top k has its rank at its place in
    the top-k list, and the same rank when it is not among them (`LLM.generate`'s logprobs
    would otherwise give it another rank for another k), on both paths."""
    torch.manual_seed(6)
    x = (torch.randn(64, 3000) * 2).round().bfloat16()  # a few values, many ties
    ps = [SamplingParams(temperature=1.0, seed=i, logprobs=k) for i in range(64)]
    reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(ps)]
    outs = []
    for _ in range(2):  # native kernels, then the PyTorch path
        for r in reqs:
            r.generator = torch.Generator().manual_seed(r.params.seed)
        outs.append(sample(x.clone(), SamplingBatch.build(reqs, 3000, torch.device("cpu"))))
        monkeypatch.setattr(native, "usable", lambda *_: False)
    a, b = outs
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.ranks, b.ranks)
    assert torch.equal(a.ranks, place_by_index(x, a.token_ids))
    inside = a.top_ids == a.token_ids[:, None]
    rows, places = inside.nonzero().unbind(1)
    assert rows.numel() > 0 and torch.equal(a.ranks[rows], places + 1)
    assert (a.ranks[~inside.any(1)] > k).all()


def test_ranks_only_for_a_row_that_wants_them(monkeypatch):
    """`logprob_ranks=False` (the OpenAI server's): no rank pass, logprobs and tokens as they
    were; one row that wants ranks gets them for the batch, on both paths."""
    torch.manual_seed(5)
    x = torch.randn(4, 3000) * 3
    off = SamplingParams(temperature=1.0, seed=3, logprobs=2, logprob_ranks=False)

    def run(*ps):
        reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(ps)]
        for r in reqs:
            r.generator = torch.Generator().manual_seed(3)
        return sample(x.clone(), SamplingBatch.build(reqs, 3000, torch.device("cpu")))

    for _ in range(2):  # native kernels, then the PyTorch path
        without, mixed = run(*[off] * 4), run(*[off] * 3, off.clone(logprob_ranks=True))
        assert without.ranks is None and mixed.ranks is not None
        assert torch.equal(without.token_ids, mixed.token_ids)
        assert torch.equal(without.logprobs, mixed.logprobs)
        assert torch.equal(mixed.ranks, place_by_index(x, mixed.token_ids))
        monkeypatch.setattr(native, "usable", lambda *_: False)
    with pytest.raises(ParamError):
        SamplingParams(logprob_ranks=1)
