"""qgemm's sampling mode: an LM head that hands back tokens without writing its logits picks
exactly the tokens `QGemm.sample_logits` picks from the written logits (greedy rows: the first
maximum, as `argmax_rows`), whatever the kind, rows, bias or threads; and those draws follow
softmax(logits / T) (chi-square, in tests/runtime/sampling/test_sampler_distribution.py too)."""

from __future__ import annotations

import math

import pytest
import torch
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.cpu.quantized import BLOCKS
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.sampling.ops import argmax_rows

LOG2E = math.log2(math.e)


def _rows(m: int, seed: int, greedy_every: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales log2(e) / T for temperatures in [0.3, 1.5] (every `greedy_every`-th row greedy)
    and uniforms."""
    g = torch.Generator().manual_seed(seed)
    scale = LOG2E / (0.3 + 1.2 * torch.rand(m, generator=g))
    scale[::greedy_every] = 0.0
    return scale, torch.rand(m, generator=g)


def _with_threads(n: int, fn):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 97, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_tokens_are_those_drawn_from_the_written_logits(kernel, kind, rows, bias):
    n, k = 1000, 512  # 63 output blocks (4 groups, the last one partial)
    g = torch.Generator().manual_seed(rows)
    w = qgemm.probe_weight(kind, n, k, seed=rows)
    bound = kernel.bind(w, torch.randn(n, generator=g) if bias else None)
    x = torch.randn(rows, k, generator=g)
    x *= 2 / bound(x).std()  # logits of standard deviation ~2, whatever the kind's scale
    scale, u = _rows(rows, rows)
    y = bound(x)
    want = kernel.sample_logits(y, scale, u)
    assert torch.equal(bound.sample(x, scale, u), want)
    assert torch.equal(_with_threads(1, lambda: bound.sample(x, scale, u)), want)
    greedy = scale == 0
    assert torch.equal(want[greedy], argmax_rows(y[greedy]))
    # the sampled rows are draws, not argmaxes: as many off the argmax as softmax expects
    probs = torch.softmax(y[~greedy].double() * (scale[~greedy, None].double() / LOG2E), -1)
    expected = float((1 - probs.max(-1).values).sum())
    off = int((want[~greedy] != argmax_rows(y[~greedy])).sum())
    assert abs(off - expected) <= 4 * expected**0.5 + 2, (off, expected)


def test_a_rows_token_depends_on_its_own_logits_and_uniform_only(kernel):
    w = qgemm.probe_weight("Q8_0", 700, 64, seed=3)
    bound = kernel.bind(w, None)
    x = torch.randn(40, 64) * 5
    scale, u = _rows(40, 4, greedy_every=7)
    alone = torch.cat(
        [bound.sample(x[i : i + 1], scale[i : i + 1], u[i : i + 1]) for i in range(40)]
    )
    assert torch.equal(bound.sample(x, scale, u), alone)
    assert torch.equal(kernel.sample_logits(bound(x)[7:], scale[7:], u[7:]), alone[7:])


def test_chosen_rows_of_stored_logits_are_read_in_place(kernel):
    """`rows`: the tokens of a copy of those rows, without the copy."""
    y = torch.randn(30, 700) * 3
    rows = torch.tensor([1, 2, 9, 29])
    scale, u = _rows(4, 5)
    want = kernel.sample_logits(y[rows], scale, u)
    assert torch.equal(kernel.sample_logits(y, scale, u, rows), want)
    with pytest.raises(IndexError, match="out of range"):
        kernel.sample_logits(y, scale, u, torch.tensor([0, 1, 2, 30]))


def test_uniforms_walk_the_cdf_in_order(kernel):
    """u near 0 gives the first token of positive mass, u near 1 the last; the token index
    never decreases as u grows."""
    logits = torch.randn(1, 300).repeat(64, 1)
    u = torch.linspace(0, 1 - 1e-7, 64)
    t = kernel.sample_logits(logits, torch.full((64,), LOG2E), u)
    assert t[0] == 0 and t[-1] == 299
    assert (t[1:] >= t[:-1]).all()


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's p-value over the cells expecting >= 5 draws (the rest pooled)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(len(exp) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def test_chi_square_against_softmax(kernel):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, generator=g) * 2.0  # 19 blocks, two groups, a partial block
    draws, temp = 30000, 0.7
    u = torch.rand(draws, generator=g)
    t = kernel.sample_logits(logits.repeat(draws, 1), torch.full((draws,), LOG2E / temp), u)
    counts = torch.bincount(t, minlength=300).double()
    assert _chi_square_p(counts, torch.softmax(logits.double() / temp, 0)) > 1e-4
    wrong = torch.softmax(logits.double() / 0.6, 0)  # the test can fail
    assert _chi_square_p(counts, wrong) < 1e-6


def test_degenerate_rows_take_the_first_maximum(kernel):
    y = torch.randn(6, 100)
    y[0] = float("-inf")  # no finite maximum: no token (-1)
    y[1, 50] = float("inf")  # an overflow: no token either
    y[2, :] = float("nan")  # nothing finite: no token
    y[3, 40] = float("nan")  # one NaN among finite outputs: no token either (as PyTorch's max)
    y[4, 10] = y[4].max() + 200  # the rest underflows: the peak
    y[5, :] = -3.0  # flat: every token as likely (u = 0.5: the middle one)
    scale, u = torch.full((6,), LOG2E), torch.full((6,), 0.5)
    t = kernel.sample_logits(y, scale, u).tolist()
    assert t[:4] == [-1, -1, -1, -1] and t[4] == 10 and t[5] == 50


def test_a_row_of_nan_outputs_gets_no_token_from_the_fused_head(kernel):
    """The LM head that samples without writing logits: a hidden state of NaN (a broken
    checkpoint's) gives its row -1, greedy or sampled; the other rows their usual tokens."""
    w = qgemm.probe_weight("Q8_0", 300, 64)
    bound = kernel.bind(w, None)
    x = torch.randn(4, 64)
    x[1] = float("nan")
    for scale in (None, torch.full((4,), LOG2E)):
        u = None if scale is None else torch.full((4,), 0.5)
        got = bound.sample(x, scale, u)
        assert got[1] == -1
        clean = x[[0, 2, 3]]
        want = bound.sample(
            clean, None if scale is None else scale[:3], None if u is None else u[:3]
        )
        assert got[[0, 2, 3]].tolist() == want.tolist()


@pytest.mark.parametrize("at", [0, 17, 299])
def test_one_nan_output_among_finite_ones_gets_no_token_from_the_fused_head(kernel, at):
    """One NaN output (a bias of NaN: a broken checkpoint's) among finite ones ends every row,
    greedy or sampled, as PyTorch's max (which propagates NaN) ends it on the other paths: the
    GEMM's block maxima count it as +inf instead of dropping it."""
    w = qgemm.probe_weight("Q8_0", 300, 64)
    bias = torch.randn(300)
    x = torch.randn(37, 64)
    scale, u = _rows(37, 5)
    assert (kernel.bind(w, bias).sample(x, scale, u) >= 0).all()
    bias[at] = float("nan")
    bound = kernel.bind(w, bias)
    assert bound.sample(x, scale, u).tolist() == [-1] * 37
    assert bound.argmax(x).tolist() == [-1] * 37
    assert kernel.sample_logits(bound(x), scale, u).tolist() == [-1] * 37


def test_bad_rows_are_refused(kernel):
    w = qgemm.probe_weight("Q4_0", 48, 64)
    bound = kernel.bind(w, None)
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match="contiguous float32"):
        bound.sample(x, torch.ones(2), torch.rand(3))
    with pytest.raises(ValueError, match="contiguous float32"):
        bound.sample(x, torch.ones(3), None)
    with pytest.raises(ValueError, match="one part"):
        kernel.bind([w, w], None).sample(x, None, None)
    with pytest.raises(ValueError, match="float32"):
        kernel.sample_logits(torch.randn(3, 48, dtype=torch.bfloat16), None, None)
    assert bound.sample(torch.empty(0, 64), None, None).shape == (0,)
    lin = Linear(w.dequantize(), quantized=w)
    scale, u = _rows(3, 1)
    assert lin.fuses_sampling and torch.equal(lin.sample(x, scale, u), bound.sample(x, scale, u))
    with pytest.raises(ValueError, match="does not sample"):
        Linear(w.dequantize()).sample(x, scale, u)
