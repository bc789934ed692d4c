"""A row whose logits have no finite maximum (all NaN, all -inf, a +inf from an overflow) gets
no token (-1) on every sampling path: the native C kernels, the PyTorch code (CUDA's), CUDA's
whole-row draw run on the CPU, and the LM head's own sampler (`QGemm.sample_logits`); the
finite rows of the same batch draw what they draw without the poisoned rows."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.request import Request
from pagoda.runtime.sampling import native, ops
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample

V = 1000
CPU = torch.device("cpu")
PARAMS = {
    "greedy": {"temperature": 0.0},
    "random": {"temperature": 0.8},
    "top_k": {"temperature": 0.8, "top_k": 20},
    "top_p": {"temperature": 0.8, "top_p": 0.9},
    "min_p": {"temperature": 0.8, "min_p": 0.05},
    "logprobs": {"temperature": 0.8, "logprobs": 3},
}


@pytest.fixture(params=["native", "torch", "flat", "head"])
def whole(request, monkeypatch):
    """The LM head's sampler for "head", else None; the others pick the kernels."""
    if request.param in ("torch", "flat"):
        monkeypatch.setattr(native, "usable", lambda x: False)
    if request.param == "flat":
        monkeypatch.setattr(ops, "flat_draws", lambda w: True)
    elif not native.available():
        pytest.skip("no C compiler for the native sampler kernels")
    if request.param == "head":
        if qgemm.load() is None:
            pytest.skip("no quantized GEMM here (AVX2 + FMA and a C++ compiler)")
        return qgemm.load().sample_logits
    return None


def _draw(logits: torch.Tensor, kw: dict, whole, seeds=None) -> list[int]:
    seeds = range(logits.shape[0]) if seeds is None else seeds
    reqs = [Request(f"r{i}", [1], SamplingParams(seed=i, **kw)) for i in seeds]
    for r in reqs:
        r.generator = torch.Generator().manual_seed(r.params.seed)
    batch = SamplingBatch.build(reqs, V, CPU)
    return sample(logits, batch, whole).token_ids.tolist()


@pytest.mark.parametrize("kind", list(PARAMS))
def test_rows_without_a_finite_maximum_get_no_token(kind, whole):
    torch.manual_seed(0)
    logits = torch.randn(6, V) * 2
    logits[1] = float("nan")  # a bad checkpoint's row
    logits[3] = float("-inf")
    logits[4, 17] = float("inf")  # an overflow
    tokens = _draw(logits.clone(), PARAMS[kind], whole)
    assert [tokens[i] for i in (1, 3, 4)] == [-1, -1, -1]
    finite = [0, 2, 5]
    alone = [_draw(logits[i : i + 1].clone(), PARAMS[kind], whole, [i])[0] for i in finite]
    assert [tokens[i] for i in finite] == alone
    assert all(0 <= tokens[i] < V for i in finite)


def test_bfloat16_rows_without_a_finite_maximum_get_no_token(whole):
    if whole is not None:
        pytest.skip("the LM head's sampler reads float32 logits")
    logits = (torch.randn(3, V) * 2).bfloat16()
    logits[0] = float("nan")
    logits[2, 5] = float("inf")
    for kind in ("greedy", "random", "top_p"):
        tokens = _draw(logits.clone(), PARAMS[kind], None)
        assert tokens[0] == tokens[2] == -1 and 0 <= tokens[1] < V, kind
