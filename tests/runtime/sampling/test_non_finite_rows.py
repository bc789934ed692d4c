"""A row whose logits have no finite maximum (all NaN, all -inf, a +inf from an overflow) gets
no token (-1) on every sampling path: the native C kernels, the PyTorch code (CUDA's), CUDA's
whole-row draw run on the CPU, and the LM head's own sampler (`QGemm.sample_logits`); the
finite rows of the same batch draw what they draw without the poisoned rows."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.cpu import build, qgemm
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


NAN_AT = (0, 517, V - 1)  # the first entry, inside the vector loops, in the scalar tail


def _one_nan_rows(v: int, dtype=torch.float32) -> tuple[torch.Tensor, list[int]]:
    """Rows of finite logits, some holding one NaN each (either sign: x86's default NaN, from
    inf - inf or 0 * inf, is negative); also a NaN beside a -inf (a banned token)."""
    torch.manual_seed(1)
    logits = torch.randn(9, v) * 2
    logits[1, NAN_AT[0]] = float("nan")
    logits[3, NAN_AT[1] % v] = float("nan")
    logits[5, v - 1] = float("nan")
    logits[6, v // 3] = -float("nan")
    logits[7, :50] = float("-inf")
    logits[7, 60] = -float("nan")
    logits[8, v // 2] = logits[8].max() + 30  # a peak: the NaN is not among the likely tokens
    logits[8, 2] = float("nan")
    return logits.to(dtype), [1, 3, 5, 6, 7, 8]


@pytest.mark.parametrize("kind", list(PARAMS))
def test_one_nan_among_finite_logits_gets_no_token(kind, whole):
    """PyTorch's maxima propagate NaN, so its paths (CUDA's) end a row holding one NaN; the C
    kernels and the LM head's sampler count a NaN as +inf in their maxima and agree."""
    logits, bad = _one_nan_rows(V)
    tokens = _draw(logits.clone(), PARAMS[kind], whole)
    assert [tokens[i] for i in bad] == [-1] * len(bad)
    finite = [i for i in range(len(tokens)) if i not in bad]
    alone = [_draw(logits[i : i + 1].clone(), PARAMS[kind], whole, [i])[0] for i in finite]
    assert [tokens[i] for i in finite] == alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["greedy", "random", "top_p", "min_p"])
def test_one_nan_in_a_large_vocabulary_gets_no_token(kind, dtype, whole):
    """A vocabulary above 4096: top-p by logit codes (a bfloat16 row's only passes), top-k
    above the block bounds, and the AVX-512 argmax's 2048-entry spans."""
    if whole is not None and dtype == torch.bfloat16:
        pytest.skip("the LM head's sampler reads float32 logits")
    logits, bad = _one_nan_rows(5000, dtype)
    for kw in (PARAMS[kind], {"temperature": 0.8, "top_k": 700}):
        reqs = [Request(f"r{i}", [1], SamplingParams(seed=i, **kw)) for i in range(9)]
        for r in reqs:
            r.generator = torch.Generator().manual_seed(r.params.seed)
        tokens = sample(logits, SamplingBatch.build(reqs, 5000, CPU), whole).token_ids.tolist()
        assert [tokens[i] for i in bad] == [-1] * len(bad), kw
        assert all(0 <= tokens[i] < 5000 for i in (0, 2, 4)), kw


BUILDS = {  # the sampler's builds: this CPU's (AVX-512 here), AVX2 only, no -march (plain C)
    "native": ["-march=native", *native.FLAGS],
    "avx2": ["-march=haswell", *native.FLAGS],
    "portable": native.FLAGS,
}


@pytest.mark.parametrize("flags", list(BUILDS))
def test_every_build_of_the_kernels_ends_a_row_with_one_nan(flags, tmp_path, monkeypatch):
    """Each variant `native._build` may compile (its vector maxima, scalar tails and the
    bfloat16 codes differ): a row with one NaN gets -1 from the argmax, whole-row draws (with
    and without min-p), top-k and top-p (block maxima for float32, codes for bfloat16)."""
    cc = build.find_compiler("CC", ["cc", "gcc"])
    if cc is None or not native.available():
        pytest.skip("no C compiler for the native sampler kernels")
    path = build.build(
        native.SOURCE, name=f"sampler_{flags}", compiler=cc, flags=BUILDS[flags], directory=tmp_path
    )
    monkeypatch.setattr(native, "_library", lambda lib=native.load(path): lib)
    for dtype in (torch.float32, torch.bfloat16):
        x, bad = _one_nan_rows(5000, dtype)
        n = x.shape[0]
        inv_t, u, k = torch.full((n,), 1.25), torch.rand(n), torch.full((n,), 700)
        p, mp = torch.full((n,), 0.9), torch.full((n,), 0.05)
        draws = {
            "argmax": native.argmax_rows(x),
            "whole": native.sample_rows(x, inv_t, None, u),
            "min_p": native.sample_rows(x, inv_t, mp, u),
            "top_k": native.sample_filtered_rows(x, inv_t, k, None, None, u),
            "top_p": native.sample_filtered_rows(x, inv_t, None, p, None, u),
            "all": native.sample_filtered_rows(x, inv_t, k, p, mp, u),
        }
        for name, tokens in draws.items():
            assert tokens[bad].tolist() == [-1] * len(bad), (dtype, name)
            assert ((tokens[[0, 2, 4]] >= 0) & (tokens[[0, 2, 4]] < 5000)).all(), (dtype, name)
