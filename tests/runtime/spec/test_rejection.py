"""Rejection sampling of sampled drafts (`spec/rejection.py`): the emitted token's law is the
target's, chi-square tested on a tiny vocabulary with fixed seeds (so it cannot flake); a draft
is kept with probability sum min(p, q); the draft's own draws follow q; seeded uniforms are a
function of (seed, token index, stream)."""

from __future__ import annotations

import numpy as np
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.spec import rejection

N = 40_000  # draws per law
CHI2_DF5_P001 = 20.52  # chi-square, 5 degrees of freedom: exceeded with probability 0.001


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def laws():
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    q = torch.tensor([0.10, 0.15, 0.30, 0.05, 0.30, 0.10])  # far from p: many rejections
    return p, q


def test_the_emitted_token_is_distributed_as_the_target():
    gen = torch.Generator().manual_seed(0)
    p, q = laws()
    x = torch.multinomial(q, N, replacement=True, generator=gen)
    u = torch.rand(2, N, generator=gen)
    tokens = rejection.decide(p.expand(N, -1), q.expand(N, -1), x, u[0], u[1])
    counts = torch.bincount(tokens, minlength=6)
    assert chi2(counts, p) < CHI2_DF5_P001
    # a draft is kept with probability sum min(p, q) (0.6 here), more than a kept-iff-equal
    # rule's sum p q (0.17)
    kept = float((tokens == x).float().mean())
    assert abs(kept - float(torch.minimum(p, q).sum())) < 0.01
    # the emitted law is q's under no circumstances: the same draws against q itself fail
    assert chi2(torch.bincount(x, minlength=6), p) > 10 * CHI2_DF5_P001


def test_a_draft_equal_to_the_target_is_always_kept():
    gen = torch.Generator().manual_seed(1)
    p, _ = laws()
    x = torch.multinomial(p, 1000, replacement=True, generator=gen)
    u = torch.rand(2, 1000, generator=gen)
    assert torch.equal(rejection.decide(p.expand(1000, -1), p.expand(1000, -1), x, u[0], u[1]), x)


def test_the_draft_draws_from_its_processed_distribution():
    """`draft_pick`: greedy rows the argmax; sampled rows drawn from softmax(top-k(logits / T)),
    whose q it returns."""
    torch.manual_seed(2)
    logits = torch.randn(6)
    rows = torch.arange(1, N + 1)
    f = rejection.Filters(torch.full((N,), 0.7), torch.zeros(N, dtype=torch.bool),
                          top_k=torch.full((N,), 4))  # fmt: skip
    batch = logits.expand(N + 1, -1)
    tokens, q = rejection.draft_pick(batch, f, torch.rand(N), rows)
    assert int(tokens[0]) == int(logits.argmax())
    want = torch.full((6,), float("-inf"))
    top = (logits / 0.7).topk(4)
    want[top.indices] = top.values
    want = want.softmax(-1)
    assert torch.allclose(q[0], want, atol=1e-6)
    counts = torch.bincount(tokens[1:], minlength=6)
    assert int(counts[want == 0].sum()) == 0
    kept = want > 0
    stat = float(((counts[kept] - N * want[kept]) ** 2 / (N * want[kept])).sum())
    assert stat < 16.27  # chi-square, 3 degrees of freedom, p = 0.001


def test_seeded_uniforms_are_keyed_by_seed_and_index():
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=1.0, seed=s))
            for i, s in enumerate([7, 7, 8, 2**64 - 1])]  # fmt: skip
    index = np.array([10, 10, 10, 10])

    def draw(stream, idx=index, rs=reqs):
        return rejection.uniforms(rs, idx, stream, torch.device("cpu"), torch.from_numpy)

    u = draw(rejection.ACCEPT)
    assert u[0] == u[1] and u[0] != u[2] and float(u.min()) >= 0 and float(u.max()) < 1
    assert torch.equal(draw(rejection.ACCEPT), u)  # the same keys, the same draws
    assert u[0] != draw(rejection.RESIDUAL)[0] and u[0] != draw(rejection.ACCEPT, index + 1)[0]
    # uniform over many keys: ten equal bins, chi-square with 9 degrees of freedom
    seeds = torch.arange(N, dtype=torch.int64) * 7919
    keyed = rejection.keyed_uniforms(seeds, torch.arange(N) % 50, rejection.DRAFT)
    counts = torch.bincount((keyed * 10).long(), minlength=10)
    assert chi2(counts, torch.full((10,), 0.1)) < 27.88
