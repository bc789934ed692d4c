"""The sampler draws from exactly the filtered distribution: chi-square goodness of fit against
softmax(apply_top_k_top_p_min_p(logits / T)) for temperature / top-k / top-p / min-p combinations,
on a vocabulary small enough to count and large enough for the chunked paths (with a tail).
Every test runs four times: with the native C kernels, with the PyTorch fallback (chunked, and
as CUDA runs it: over whole rows), and with the
unfiltered and greedy rows drawn by the LM head's own sampler (`QGemm.sample_logits`, where the
quantized GEMM builds), as on CPUs whose LM head samples from its outputs."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.request import Request
from pagoda.runtime.sampling import native, ops, sampler
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, apply_top_k_top_p_min_p, sample

V = 300  # PyTorch path: 2 chunks of 128 plus a tail of 44; native: a chunk of 256 and a tail
DRAWS = 20000
CPU = torch.device("cpu")
WHOLE: dict[str, sampler.WholeSampler] = {}  # "head": the LM head's sampler, in its run


@pytest.fixture(params=["native", "torch", "flat", "head"], autouse=True)
def kernels(request, monkeypatch):
    if request.param in ("torch", "flat"):
        monkeypatch.setattr(native, "usable", lambda x: False)
    if request.param == "flat":  # CUDA's draw over whole rows (`pick_flat`), run on the CPU
        monkeypatch.setattr(ops, "flat_draws", lambda w: True)
    elif not native.available():
        pytest.skip("no C compiler for the native sampler kernels")
    if request.param == "head":
        if qgemm.load() is None:
            pytest.skip("no quantized GEMM here (AVX2 + FMA and a C++ compiler)")
        monkeypatch.setitem(WHOLE, "head", qgemm.load().sample_logits)
    return request.param


def _logits(seed: int, vocab: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * 2.0


def exact(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The target distribution, from the reference filters (full sort, no shortcuts)."""
    b = SamplingBatch.build([Request("x", [1], p)], logits.shape[-1], CPU)
    return apply_top_k_top_p_min_p(logits[None] / p.temperature, b).softmax(-1)[0]


def draw(rows: list[tuple[torch.Tensor, SamplingParams]], repeats: int) -> torch.Tensor:
    """Counts [len(rows), V] from `repeats` copies of the batch `rows`, sampled in one call."""
    reqs = [Request(f"r{i}", [1], p) for i in range(repeats) for _, p in rows]
    logits = torch.stack([lg for _ in range(repeats) for lg, _ in rows])
    batch = SamplingBatch.build(reqs, logits.shape[1], CPU)
    tokens = sample(logits, batch, WHOLE.get("head")).token_ids
    counts = torch.zeros(len(rows), logits.shape[1])
    idx = torch.arange(len(tokens)) % len(rows)
    counts.index_put_((idx, tokens), torch.ones(len(tokens)), accumulate=True)
    return counts


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's test; cells expecting < 5 draws are pooled into one."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "drew a token of probability zero"
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].sum().double().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(len(exp) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.5, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=7),
    SamplingParams(temperature=0.8, top_p=0.8),
    SamplingParams(temperature=1.2, top_k=40, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=150, top_p=0.95, min_p=0.02),
    SamplingParams(temperature=2.0, top_p=0.5, min_p=0.1),
]


@pytest.mark.parametrize(
    "params", CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"
)
def test_distribution_matches_exact(params):
    torch.manual_seed(0)
    lg = _logits(1)
    counts = draw([(lg, params)], DRAWS)[0]
    assert chi_square_p(counts, exact(lg, params)) > 1e-4


def test_mixed_batch_rows_each_match_their_distribution():
    """Full-vocabulary rows, candidate rows and greedy rows side by side in one batch."""
    torch.manual_seed(1)
    rows = [(_logits(10 + i), p) for i, p in enumerate(CASES[1:6])]
    rows.append((_logits(99), SamplingParams(temperature=0)))
    counts = draw(rows, DRAWS // 2)
    for c, (lg, p) in zip(counts[:-1], rows[:-1]):
        assert chi_square_p(c, exact(lg, p)) > 1e-4, p
    assert counts[-1, int(rows[-1][0].argmax())] == DRAWS // 2  # greedy


def test_top_p_falls_back_when_candidates_hold_too_little_mass(monkeypatch):
    """A flat distribution under top-p needs more than TOP_P_CANDIDATES tokens."""
    monkeypatch.setattr(sampler, "TOP_P_CANDIDATES", 8)
    torch.manual_seed(2)
    lg = _logits(3) * 0.1  # nearly flat: top_p=0.9 keeps ~270 tokens
    p = SamplingParams(temperature=1.0, top_p=0.9)
    probs = exact(lg, p)
    assert (probs > 0).sum() > 8
    assert chi_square_p(draw([(lg, p)], DRAWS)[0], probs) > 1e-4


@pytest.mark.parametrize("peak", [130, 260], ids=["first-chunk", "tail-chunk"])
def test_peaked_row_where_the_other_chunks_underflow(peak):
    """Chunks whose weights all underflow are skipped (peak first: the later chunks) or rescaled
    to zero (peak last: the earlier ones, summed before the maximum was known): still exact."""
    torch.manual_seed(5)
    lg = _logits(7)
    lg[peak : peak + 10] += 150.0
    p = SamplingParams(temperature=1.0)
    counts = draw([(lg, p)], DRAWS)[0]
    assert counts[peak : peak + 10].sum() == DRAWS
    assert chi_square_p(counts, exact(lg, p)) > 1e-4


def test_small_vocabulary_path():
    torch.manual_seed(3)
    lg = _logits(4, vocab=50)
    p = SamplingParams(temperature=0.9, top_k=20, min_p=0.01)
    assert chi_square_p(draw([(lg, p)], DRAWS)[0], exact(lg, p)) > 1e-4


def test_the_test_rejects_a_wrong_distribution():
    """Power check: samples at temperature 1.0 fail against the temperature-0.8 target."""
    torch.manual_seed(4)
    lg = _logits(5)
    counts = draw([(lg, SamplingParams(temperature=1.0))], DRAWS)[0]
    assert chi_square_p(counts, exact(lg, SamplingParams(temperature=0.8))) < 1e-6


def test_argmax_rows_matches_torch_including_ties():
    from pagoda.runtime.sampling.ops import argmax_rows

    x = torch.randn(64, 1000)
    x[0] = 0.0  # all tied: the first index wins
    x[1, 5] = x[1, 700] = 100.0  # tie across chunks
    x[2, -1] = 100.0  # maximum in the tail
    x[3] = float("-inf")
    want = x.argmax(-1)
    want[3] = -1  # no finite maximum: no token
    assert argmax_rows(x).tolist() == want.tolist()


def test_flat_draw_keeps_small_weights_deep_in_a_row():
    """CUDA's whole-row draw sums in float64: a weight of 1e-6 after 30,000 weights of 1 keeps
    its interval (float32 sums would have absorbed it), zero weights are never drawn, and even
    u = 1 (which `rand` never gives) lands on the last positive weight, not the zero tail."""
    w = torch.ones(2, 50_003)
    w[:, 50_000] = 1e-6
    w[:, 50_001:] = 0.0
    w[:, 1:40_000:2] = 0.0
    got = ops.pick_flat(w, torch.tensor([0.0, 1.0]))
    assert got.tolist() == [0, 50_000]
    cum = torch.cumsum(w[:1], -1, dtype=torch.float64)
    target = (cum[0, 49_999] + 5e-7) / cum[0, -1]  # inside the 1e-6 interval
    assert ops.pick_flat(w[:1], target.reshape(1)).item() == 50_000
    draws = ops.pick_flat(w[:1].expand(500, -1), torch.rand(500))
    assert bool((w[0, draws] > 0).all())
