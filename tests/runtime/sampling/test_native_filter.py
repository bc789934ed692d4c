"""The native top-k / top-p / min-p kernel (`native.sample_filtered_rows`): chi-square
against an exact float64 reference (ties ordered by index) through each of its paths (top-k by
chunk or block maxima or a count histogram; top-p by the best 64, all entries, or the mass
histogram of flat rows on a large vocabulary); the same picks as the PyTorch `topk` path for the
same uniforms; 32k rows with top_p near 1 (where 1024 `topk` candidates fall short); bf16 as its
float32 widening; edge rows; threads and seeds."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling import native, ops
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, apply_top_k_top_p_min_p, sample
from test_sampler_distribution import chi_square_p

pytestmark = pytest.mark.skipif(not native.available(), reason="no native kernels")
DRAWS = 20000


def reference(x: torch.Tensor, t: float, k: int = 0, p: float = 1.0, mp: float = 0.0):
    """Exact probabilities of the filtered row in float64, ties ranked by index."""
    s = x.double() / t
    w = (s - s.max()).exp()
    w = torch.where(w >= mp, w, 0.0)
    order = s.sort(descending=True, stable=True).indices
    ws = w[order]
    if k:
        ws[k:] = 0.0
    if p < 1.0:
        before = ws.cumsum(0) - ws
        drop = before > p * ws.sum()
        drop[0] = False
        ws[drop] = 0.0
    out = torch.zeros_like(w)
    out[order] = ws
    return out / out.sum()


def native_draws(x, t, k=0, p=1.0, mp=0.0, n=DRAWS, dtype=torch.float32) -> torch.Tensor:
    """Token counts of n draws from the row x, one uniform each (in batches of <= 2048 rows)."""
    counts = torch.zeros(x.numel())
    for size in [2048] * (n // 2048) + [n % 2048]:
        tokens = native.sample_filtered_rows(
            x.to(dtype).expand(size, -1).contiguous(),
            torch.full((size,), 1.0 / t),
            torch.full((size,), k if k else x.numel()),
            torch.full((size,), p),
            torch.full((size,), mp) if mp else None,
            torch.rand(size),
        )
        counts += torch.bincount(tokens, minlength=x.numel()).float()
    return counts


def _row(seed: int, vocab: int, scale: float) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale


CASES = [  # (vocab, scale, T, top_k, top_p, min_p)
    (300, 2.0, 1.0, 7, 1.0, 0.0),  # top-k below the block count (10): block-maximum bound
    (300, 2.0, 0.8, 40, 1.0, 0.0),  # top-k above it: count histogram
    (2000, 1.5, 1.0, 50, 1.0, 0.0),
    (300, 3.0, 0.8, 0, 0.8, 0.0),  # peaked top-p: within the best 64
    (300, 0.3, 1.0, 0, 0.9, 0.0),  # flat top-p, small vocabulary: every entry a candidate
    (2000, 0.5, 1.0, 0, 0.95, 0.0),
    (300, 2.0, 1.2, 40, 0.9, 0.0),
    (2000, 2.0, 0.7, 5, 0.6, 0.0),  # top-k below the chunk count (8): chunk-maximum bound
    (300, 2.0, 2.0, 0, 0.5, 0.1),  # min-p + top-p
    (300, 1.0, 1.0, 0, 0.9, 0.05),
    (300, 2.0, 0.7, 150, 0.95, 0.02),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "V{}-s{}-T{}-k{}-p{}-m{}".format(*c))
def test_distribution_matches_exact(case, dtype):
    vocab, scale, t, k, p, mp = case
    torch.manual_seed(0)
    x = _row(vocab + int(10 * scale), vocab, scale).to(dtype).float()  # bf16-exact logits
    probs = reference(x, t, k, p, mp)
    assert chi_square_p(native_draws(x, t, k, p, mp, dtype=dtype), probs) > 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("p, mp", [(0.9, 0.0), (0.6, 0.0), (0.95, 0.3)])
def test_flat_rows_of_a_large_vocabulary(p, mp, dtype):
    """Above 4096 entries a flat top-p row takes the histogram path (cut and draw inside mass
    bins): 300 live tokens of similar weight, the rest far below but not zero."""
    torch.manual_seed(7)
    x = torch.full((8192,), -30.0)
    live = torch.randperm(8192, generator=torch.Generator().manual_seed(1))[:300]
    x[live] = _row(2, 300, 0.7)
    x = x.to(dtype).float()
    counts = native_draws(x, 1.0, p=p, mp=mp, n=10000, dtype=dtype)
    assert chi_square_p(counts, reference(x, 1.0, p=p, mp=mp)) > 1e-4


def test_reference_matches_the_samplers_filters():
    """The test's reference is `apply_top_k_top_p_min_p` on rows without ties."""
    x = _row(1, 300, 2.0)
    for _, _, t, k, p, mp in CASES:
        params = SamplingParams(temperature=t, top_k=k or -1, top_p=p, min_p=mp)
        b = SamplingBatch.build([Request("x", [1], params)], 300, torch.device("cpu"))
        expected = apply_top_k_top_p_min_p(x[None] / t, b).softmax(-1)[0].double()
        assert torch.allclose(reference(x, t, k, p, mp), expected, atol=1e-6)


def test_the_test_rejects_a_wrong_distribution():
    """Power check: a cut that keeps too much draws tokens the reference excludes, and the same
    top-k set at temperature 1.0 fails against temperature 0.85."""
    torch.manual_seed(1)
    x = _row(3, 300, 1.0)
    with pytest.raises(AssertionError, match="probability zero"):
        chi_square_p(native_draws(x, 1.0, p=0.8), reference(x, 1.0, p=0.7))
    assert chi_square_p(native_draws(x, 1.0, k=40), reference(x, 0.85, k=40)) < 1e-6


@pytest.mark.parametrize("k, p", [(3, 1.0), (0, 0.5), (4, 0.9)])
def test_ties_rank_by_index(k, p):
    """Tied logits at the cut: the lower indices are kept (torch.sort leaves the order open; any
    choice has the same distribution over logit values)."""
    torch.manual_seed(2)
    x = torch.zeros(300)
    x[[10, 50, 120, 290]] = 3.0  # a tie group straddling top-k = 3
    x[200] = 4.0
    counts = native_draws(x, 1.0, k, p)
    assert chi_square_p(counts, reference(x, 1.0, k, p)) > 1e-4


@pytest.mark.parametrize("vocab", [1000, 8192], ids=["all-candidates", "histogram"])
def test_flat_row_keeps_exactly_the_first_tokens(vocab):
    """All logits equal, top_p = 0.5: tokens 0..vocab/2 are kept (mass above <= 0.5), and the
    draw walks them in order as u grows."""
    u = torch.linspace(0, 1 - 1e-6, 3000)
    x = torch.zeros(3000, vocab)
    tokens = native.sample_filtered_rows(
        x, torch.ones(3000), None, torch.full((3000,), 0.5), None, u
    )
    assert tokens[0] == 0 and tokens[-1] == vocab // 2
    assert bool((tokens.diff() >= 0).all())  # in order
    expected = (u.double() * (vocab // 2 + 1)).floor().long()
    assert (tokens == expected).float().mean() > 0.99


@pytest.mark.parametrize("scale", [1.0, 3.0, 6.0])
@pytest.mark.parametrize("k, p, mp", [(50, 1.0, 0.0), (0, 0.9, 0.0), (50, 0.9, 0.0),
                                      (0, 0.9, 0.05), (1000, 0.99, 0.01), (0, 0.5, 0.0)])  # fmt: skip
def test_same_picks_as_the_torch_path(monkeypatch, scale, k, p, mp):
    """Same uniforms, same tokens as `topk` + cumsum (up to float rounding at boundaries)."""
    torch.manual_seed(3)
    n, v = 256, 32000
    x, u, inv_t = torch.randn(n, v) * scale, torch.rand(n), torch.full((n,), 1 / 0.8)
    args = (
        x, inv_t, torch.full((n,), k) if k else None, torch.full((n,), p) if p < 1 else None,
        torch.full((n,), mp) if mp else None, u, k if k else 1024,
    )  # fmt: skip
    kernel = ops.sample_candidates(*args)
    monkeypatch.setattr(native, "usable", lambda x: False)
    assert (kernel == ops.sample_candidates(*args)).float().mean() >= 0.99


def _sorted_pick(row: torch.Tensor, t: float, p: float, u: float) -> int:
    """The token float64 top-p picks for uniform u: logit descending, then index ascending."""
    probs = reference(row, t, p=p)
    order = row.double().sort(descending=True, stable=True).indices
    at = torch.searchsorted(
        probs[order].cumsum(0), torch.tensor(u, dtype=torch.float64), right=True
    )
    return int(order[at.clamp(max=row.numel() - 1)])


@pytest.mark.parametrize("p", [0.99, 0.999])
def test_large_vocabulary_top_p_near_one_is_exact(p):
    """32k rows whose kept set is far beyond 1024 tokens: the picks match the float64 sorted
    reference for the same uniforms, deep into the tail."""
    torch.manual_seed(4)
    n, v = 64, 32000
    x, u = torch.randn(n, v), torch.rand(n)
    u[0], u[1] = 0.0, 1.0 - 1e-7  # the best token; the last kept one
    tokens = native.sample_filtered_rows(x, torch.ones(n), None, torch.full((n,), p), None, u)
    expected = [_sorted_pick(row, 1.0, p, float(ui)) for row, ui in zip(x, u)]
    kept = [int((reference(row, 1.0, p=p) > 0).sum()) for row in x]
    assert min(kept) > 10000
    assert (torch.tensor(expected) == tokens).float().mean() >= 0.95
    assert tokens[0] == x[0].argmax()


@pytest.mark.parametrize("p", [0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_very_flat_rows_pick_the_sorted_token(p, dtype):
    """Logits within ~0.1 of each other: the cut's mass bin holds thousands of entries (in bf16
    mostly tied), which are selected from by ranges of logits rather than one quickselect; the
    picks are those of the float64 sorted reference for the same uniforms."""
    torch.manual_seed(6)
    n, v = 48, 32000
    x, u = (torch.randn(n, v) * 0.02).to(dtype), torch.rand(n)
    u[0], u[1] = 0.0, 1.0 - 1e-7
    tokens = native.sample_filtered_rows(
        x, torch.full((n,), 1 / 0.7), None, torch.full((n,), p), None, u
    )
    expected = [_sorted_pick(row.float(), 0.7, p, float(ui)) for row, ui in zip(x, u)]
    assert (torch.tensor(expected) == tokens).float().mean() >= 0.95
    assert tokens[0] == x[0].float().argmax()


def test_bfloat16_rows_draw_the_tokens_of_their_widening():
    torch.manual_seed(5)
    x, u = (torch.randn(64, 3000) * 3).bfloat16(), torch.rand(64)
    args = (torch.ones(64), torch.full((64,), 40), torch.full((64,), 0.9), None, u)
    a = native.sample_filtered_rows(x, *args)
    assert torch.equal(a, native.sample_filtered_rows(x.float(), *args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("v", [300, 8192])
def test_edge_rows_yield_valid_tokens(v, dtype):
    x = torch.randn(6, v)
    x[0] = float("-inf")  # nothing finite: no token (-1)
    x[1, 7] = float("inf")  # an infinite logit (an overflow): no token either
    x[2, :] = float("-inf")
    x[2, v - 1] = 0.0  # a single finite token, in the tail
    x[4, 123] = 50.0  # T = 0.01: every other weight underflows
    inv_t = torch.tensor([1.0, 1.0, 1.0, 1.0, 100.0, 1.0])
    top_k = torch.tensor([5, 5, 5, 1, v, v])
    top_p = torch.tensor([1.0, 0.9, 0.9, 1.0, 0.5, 0.0])
    u = torch.full((6,), 0.9999999)
    x = x.to(dtype)
    tokens = native.sample_filtered_rows(x, inv_t, top_k, top_p, None, u).tolist()
    assert tokens[:3] == [-1, -1, v - 1]
    assert tokens[3] == int(x[3].argmax())  # top_k = 1
    assert tokens[4] == 123
    assert tokens[5] == int(x[5].argmax())  # top_p = 0 keeps the best token


@pytest.mark.parametrize("p, mp", [(0.9, 0.0), (0.5, 0.0), (0.99, 0.02)])
def test_bfloat16_flat_rows_draw_the_tokens_of_their_widening(p, mp):
    """A bfloat16 row's codes are counted and its place in a code is arithmetic; its float32
    widening sums weights per code and quickselects inside one: the same tokens, exactly."""
    torch.manual_seed(8)
    n, v = 64, 32000
    x = torch.randn(n, v) * torch.tensor([0.02, 0.3, 1.0, 3.0]).repeat(n // 4)[:, None]
    x, u = x.bfloat16(), torch.rand(n)
    u[0], u[1] = 0.0, 1.0 - 1e-7
    args = (torch.full((n,), 1 / 0.7), None, torch.full((n,), p), torch.full((n,), mp), u)
    a = native.sample_filtered_rows(x, *args)
    assert torch.equal(a, native.sample_filtered_rows(x.float(), *args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_non_finite_rows_leave_the_next_rows_alone(dtype):
    """Rows with NaN, +-inf and -0.0 between ordinary ones (one thread, so they share the
    per-code histograms, which each row clears): the ordinary rows draw what they draw alone,
    and top-k above the block bounds (by codes) shares the same histograms."""
    torch.manual_seed(9)
    n, v = 8, 8192
    x = torch.randn(n, v) * 0.5
    x[1, ::7] = float("nan")
    x[3, ::5] = float("-inf")
    x[3, 11] = float("inf")
    x[5, :100] = -0.0
    x[5, 100:] = float("nan")
    x = x.to(dtype)
    u, inv_t = torch.rand(n), torch.full((n,), 1.3)
    top_k = torch.tensor([v, 700, v, 700, v, v, 700, v])
    top_p = torch.full((n,), 0.9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        mixed = native.sample_filtered_rows(x, inv_t, top_k, top_p, None, u)
    finally:
        torch.set_num_threads(threads)
    clean = [0, 2, 4, 6, 7]
    alone = [
        int(native.sample_filtered_rows(x[i : i + 1], inv_t[:1], top_k[i : i + 1],
                                                top_p[:1], None, u[i : i + 1])[0])
        for i in clean
    ]  # fmt: skip
    assert mixed[clean].tolist() == alone
    assert mixed[3] == -1  # an infinite logit: no finite maximum, no token
    assert mixed[1] == mixed[5] == -1  # a NaN: no finite maximum (as PyTorch's), no token


def test_rows_split_over_threads_and_seeded_requests_reproduce():
    torch.manual_seed(6)
    x = torch.randn(64, 2000) * 3
    args = (torch.full((64,), 1.5), torch.full((64,), 30), torch.full((64,), 0.9), None)
    u = torch.rand(64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.sample_filtered_rows(x, *args, u)
        torch.set_num_threads(4)
        four = native.sample_filtered_rows(x, *args, u)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, four)

    def run(rows: torch.Tensor, seeds: list[int | None]) -> list[int]:
        ps = [SamplingParams(temperature=0.9, top_p=0.9, seed=s) for s in seeds]
        reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(ps)]
        for r in reqs:
            if r.params.seed is not None:
                r.generator = torch.Generator().manual_seed(r.params.seed)
        return sample(rows, SamplingBatch.build(reqs, 2000, torch.device("cpu"))).token_ids.tolist()

    alone = [run(x[:1], [42])[0] for _ in range(1)]
    batched = run(x[:3].flip(0), [None, None, 42])[2]  # x[0] last, seeded, among others
    assert alone[0] == batched
