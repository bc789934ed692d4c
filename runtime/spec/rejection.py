"""Rejection sampling of a draft model's sampled drafts (Leviathan et al., "Fast Inference from
Transformers via Speculative Decoding"; vLLM's rejection sampler).

A request that samples (temperature > 0) drafts from the draft model's own distribution q,
processed as its target rows are (temperature, top-k, top-p, min-p: `processed_probs`), and the
draft keeps q of each position (`DraftProbs`, on the device until the next step verifies them).
The target's processed distribution p of a drafted row then decides: draft x is accepted with
probability min(1, p(x) / q(x)); the first one rejected is replaced by a draw from
normalize(max(0, p - q)), and when all are accepted the bonus token is the target's own draw
of the row after them. Every emitted token is then distributed as p exactly, while a draft is
kept with probability sum_x min(p(x), q(x)) (more than the sum_x p(x) q(x) of keeping a
sampled draft iff the target draws it too, `spec/verify.py`'s rule for one-hot drafts).

All of it is tensor work over the step's drafted rows (`resample`): the target's sampled token
of each such row is replaced on the device by the draft when accepted, else by the residual's
draw, so that `verify.accept` (the longest prefix of drafts equal to the row tokens, plus one)
keeps exactly the tokens this rule emits: a residual draw is never the rejected draft (its
residual weight is 0 there). A seeded request's uniforms for its drafts, their acceptance and
the residual draws are a hash of its seed and the token index (`keyed_uniforms`), and its own
generator is rewound to one draw per token kept (`verify.rewind`), so each draw depends on its
seed and the token's number only: its output is the same run after run for the same schedule
(preemption, which moves the steps' boundaries, changes which tokens are drafts and so the
draws they come from; it is not the output without speculation, whose law it has).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from pagoda.runtime.sampling.ops import sample_weights
from pagoda.runtime.sampling.sampler import SamplingBatch, apply_top_k_top_p_min_p

if TYPE_CHECKING:
    from pagoda.runtime.request import Request


@dataclass
class Filters:
    """Per-row processing of a distribution: temperature [N] (1.0 on greedy rows), greedy [N]
    bool, optional top-k [N] int64, top-p [N] / min-p [N] float32 (`apply_top_k_top_p_min_p`)."""

    temperature: torch.Tensor
    greedy: torch.Tensor
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None

    @classmethod
    def rows_of(cls, batch: SamplingBatch, idx: torch.Tensor) -> Filters:
        """The filters of a sampling batch's rows `idx`."""

        def sel(t):
            return None if t is None else t.index_select(0, idx)

        return cls(sel(batch.temperature), sel(batch.greedy), sel(batch.top_k),
                   sel(batch.top_p), sel(batch.min_p))  # fmt: skip


def processed_probs(logits: torch.Tensor, f: Filters | SamplingBatch) -> torch.Tensor:
    """float32 [N, V] softmax(filters(logits / T)): the distribution a sampled row draws from
    (`sampling.sampler.sample`; greedy rows' entries are unused)."""
    scaled = logits.float() / f.temperature.unsqueeze(1)
    return apply_top_k_top_p_min_p(scaled, f).softmax(-1)


DRAFT, ACCEPT, RESIDUAL = 0, 1, 2  # the uniforms' streams of a seeded request
_MASK = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash ("lowbias32") of int64 entries holding 32-bit values (a product's
    low 32 bits are right even where the int64 product wraps)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK
    return x ^ (x >> 16)


def keyed_uniforms(seeds: torch.Tensor, index: torch.Tensor, stream: int) -> torch.Tensor:
    """float32 uniforms in [0, 1), a hash of (seed, token index, stream) each: a seeded
    request's draws depend on its seed and the position drawn for only, not on the schedule
    (how many drafts a step carried, which of them were verified)."""
    x = _mix((seeds & _MASK) ^ ((stream * 0x9E3779B9) & _MASK))
    x = _mix(x ^ ((seeds >> 32) & _MASK))
    x = _mix(x ^ (index & _MASK))
    return (x >> 8).to(torch.float32) * 2.0**-24


def uniforms(reqs: list[Request], index: np.ndarray, stream: int, device, to_device):
    """One float32 uniform per entry of `index` [n] (token indices, of `reqs` [n], one entry
    each) on `device`: `keyed_uniforms` for a seeded request, else the default generator's."""
    seeds = np.fromiter((-1 if r.params.seed is None else r.params.seed % 2**63 for r in reqs),
                        np.int64, len(reqs))  # fmt: skip
    u = torch.rand(len(reqs), device=device)
    if (seeds >= 0).any():
        keyed = keyed_uniforms(to_device(seeds), to_device(index.astype(np.int64)), stream)
        u = torch.where(to_device(seeds >= 0), keyed, u)
    return u


def draft_pick(
    logits: torch.Tensor, f: Filters | SamplingBatch, u: torch.Tensor, sampled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft position's tokens [B]: the argmax, except on the `sampled` rows [S] (whose
    filters are `f`), a draw from q with `u` [S]; and q [S, V] float32."""
    tokens = logits.argmax(dim=-1)
    q = processed_probs(logits.index_select(0, sampled), f)
    tokens.index_copy_(0, sampled, sample_weights(q, u))
    return tokens, q


@dataclass
class DraftProbs:
    """The last drafting run's q of its sampled requests: float32 [B, k, V] on the device, and
    per request (its token count when it drafted, its row)."""

    probs: torch.Tensor
    rows: dict[Request, tuple[int, int]]


@dataclass
class RatioRows:
    """A step's drafted rows verified by the ratio rule: their sample rows [D] (int64), the rows
    of `DraftProbs.probs` viewed [B * k, V] [D], the drafts [D], each row's request and token
    index (its uniforms' keys), and which of the step's drafted requests [S] are verified so."""

    rows: np.ndarray
    qrows: np.ndarray
    drafts: np.ndarray
    reqs: list[Request]
    index: np.ndarray
    mask: np.ndarray


def ratio_rows(
    drafted: list[Request], counts: np.ndarray, drafts: np.ndarray, held: DraftProbs | None
) -> RatioRows | None:
    """Which of a step's drafted requests (one each, `counts` [S] drafts, `drafts` [S, k]) the
    ratio rule verifies: those that sample and whose drafts the last run drew with the q it
    kept (the same token count; any other sampled draft is verified by the target's own draw,
    `spec/verify.py`, exact for any draft law). None when no request is."""
    if held is None:
        return None
    got = [held.rows.get(r) for r in drafted]
    mask = np.fromiter(
        (c > 0 and g is not None and g[0] == len(r.token_ids) and not r.params.greedy
         for r, c, g in zip(drafted, counts.tolist(), got)), bool, len(drafted),
    )  # fmt: skip
    if not mask.any():
        return None
    idx = np.flatnonzero(mask)
    c = counts[idx]
    starts = (np.cumsum(counts + 1) - (counts + 1))[idx]
    col = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
    k = held.probs.shape[1]
    lens = np.fromiter((got[i][0] for i in idx.tolist()), np.int64, len(idx))
    qbase = np.fromiter((got[i][1] for i in idx.tolist()), np.int64, len(idx)) * k
    per = np.repeat(idx, c)
    return RatioRows(np.repeat(starts, c) + col, np.repeat(qbase, c) + col, drafts[per, col],
                     [drafted[i] for i in per.tolist()], np.repeat(lens, c) + col, mask)  # fmt: skip


def resample(
    tokens: torch.Tensor,
    logits: torch.Tensor,
    batch: SamplingBatch,
    plan: RatioRows,
    held: DraftProbs,
    to_device,
) -> None:
    """The ratio rule on the step's drafted rows of `plan`, in place on the sampled `tokens`
    [N] (`logits` [N, V] the step's, `batch` its sampling parameters): each row's token becomes
    its draft when accepted, else a draw from the residual (module docstring). Queued on the
    device; a row without a token (non-finite logits) keeps none."""
    rows = to_device(plan.rows)
    x = to_device(plan.drafts)
    p = target_probs(logits, batch, rows)
    q = held.probs.flatten(0, 1).index_select(0, to_device(plan.qrows))
    keys = (plan.reqs, plan.index)
    u_accept = uniforms(*keys, ACCEPT, p.device, to_device)
    new = decide(p, q, x, u_accept, uniforms(*keys, RESIDUAL, p.device, to_device))
    old = tokens.index_select(0, rows)
    tokens.index_copy_(0, rows, torch.where(old >= 0, new, old))


def decide(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u_accept: torch.Tensor, u_resid: torch.Tensor
) -> torch.Tensor:
    """Each row's token [D]: draft `x` [D] (drawn from `q` [D, V]) kept when
    u_accept < p(x) / q(x), else a draw (with `u_resid`) from normalize(max(0, p - q))."""
    xs = x.unsqueeze(1)
    accepted = u_accept * q.gather(1, xs).squeeze(1) < p.gather(1, xs).squeeze(1)
    resid = (p - q).clamp_(min=0)
    some = resid.sum(-1, keepdim=True) > 0  # (none: p == q, where nothing is rejected)
    return torch.where(accepted, x, sample_weights(torch.where(some, resid, p), u_resid))


def target_probs(logits: torch.Tensor, batch: SamplingBatch, rows: torch.Tensor) -> torch.Tensor:
    """p of the step's `rows` [D]: the logits after the batch's allowed tokens, bias and
    penalties (as `sample` applies them, then restored), temperature and filters."""
    x = logits.float()
    order = (batch.allowed, batch.logit_bias, batch.penalties)
    restores = [proc.apply(x) for proc in order if proc is not None]
    try:
        sel = x.index_select(0, rows)
    finally:
        for restore in reversed(restores):
            restore()
    return processed_probs(sel, Filters.rows_of(batch, rows))
