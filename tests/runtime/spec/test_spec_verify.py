"""Draft verification: the rows sampled, the longest prefix of drafts equal to the target's
tokens plus one, the law of a sampled step (rejection sampling with a one-hot draft: the draft
kept with probability p(x), the emitted token distributed as p), seeded generators rewound."""

from __future__ import annotations

import numpy as np
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample
from pagoda.runtime.spec import verify


def requests(*params: SamplingParams) -> list[Request]:
    """Requests as the runner has them (a seeded one with its generator)."""
    out = [Request(f"r{i}", [1, 2, 3], p) for i, p in enumerate(params)]
    for r in out:
        if r.params.seed is not None:
            r.generator = torch.Generator().manual_seed(r.params.seed)
    return out


def test_logit_rows_cover_each_drafted_request():
    ends = np.array([0, 5, 9])  # last token rows of three requests
    counts = np.array([0, 3, 1])
    assert verify.logit_rows(ends, counts).tolist() == [0, 2, 3, 4, 5, 8, 9]


def test_accept_keeps_the_matching_prefix_and_one_more():
    spec = verify.SpecRows(np.array([3, 0, 2, 3]), np.array([[5, 6, 7], [-1, -1, -1],
                                                            [1, 2, -1], [4, 4, 4]]))  # fmt: skip
    tokens = np.array(
        [
            5,
            6,
            9,
            0,  # drafts 5 6 accepted, 9 corrects 7 (row 3 unused)
            8,  # no drafts: its token
            3,
            2,
            2,  # the first draft rejected: 3
            4,
            4,
            4,
            7,
        ]
    )  # all accepted, 7 the bonus
    accepted, kept = verify.accept(tokens, spec)
    assert accepted.tolist() == [2, 0, 0, 3]
    assert tokens[kept].tolist() == [5, 6, 9, 8, 3, 4, 4, 4, 7]


def test_a_sampled_step_has_the_targets_law():
    """20,000 drafted steps of one row of logits over 6 tokens, draft x = token 2: P(accept)
    is p(2) and the first emitted token is distributed as p (top-p applied), within a
    total-variation bound far above the sampling noise (~0.006) and far below any bias."""
    torch.manual_seed(0)
    n, v, x = 20000, 6, 2
    logits = torch.tensor([1.0, 0.2, 0.7, -0.5, 0.0, -3.0]).repeat(2 * n, 1)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    p = torch.softmax(logits[0] / 0.9, -1)
    p[p.argsort()[:1]] = 0.0  # top-p 0.95 drops the least likely token (mass 0.017)
    p /= p.sum()
    reqs = requests(params) * (2 * n)  # one request, 2n rows (as a drafted one has)
    tokens = sample(logits, SamplingBatch.build(reqs, v, torch.device("cpu"))).token_ids
    spec = verify.SpecRows(np.ones(n, dtype=np.int64), np.full((n, 1), x))
    accepted, kept = verify.accept(tokens.numpy(), spec)
    first = tokens.numpy()[kept][np.cumsum(accepted + 1) - accepted - 1]
    assert abs(accepted.mean() - float(p[x])) < 0.02
    emitted = np.bincount(first, minlength=v) / n
    assert 0.5 * np.abs(emitted - p.numpy()).sum() < 0.02
    # given a rejection, the token is p without x, renormalised
    rejected = first[accepted == 0]
    residual = p.clone()
    residual[x] = 0
    residual /= residual.sum()
    tv = 0.5 * np.abs(np.bincount(rejected, minlength=v) / len(rejected) - residual.numpy()).sum()
    assert tv < 0.03 and x not in rejected


def test_rewind_leaves_a_seeded_generator_after_the_kept_draws():
    (req,) = requests(SamplingParams(temperature=1.0, seed=5))
    spec = verify.SpecRows(np.array([3]), np.array([[1, 2, 3]]))
    spec.generators = verify.save_generators([req], spec.counts)
    for _ in range(4):  # the step's four rows
        torch.rand(1, generator=req.generator)
    verify.rewind(spec, [req], np.array([1]))  # two tokens kept
    plain = torch.Generator().manual_seed(5)
    for _ in range(2):
        torch.rand(1, generator=plain)
    assert torch.rand(1, generator=req.generator) == torch.rand(1, generator=plain)
