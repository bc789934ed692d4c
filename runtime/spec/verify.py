"""Verifying a step's drafts against the target model (docs/runtime.md, "Speculative decoding").

A sequence with d drafts runs 1 + d rows in one forward: its last known token, then the drafts.
The logits of every row are sampled exactly as a plain decode step samples them (the same
sampler, temperature, top-k/top-p/min-p, one uniform per row from the request's own generator
when seeded, in row order), giving the target's tokens t_0 .. t_d. Draft j is accepted while
every draft before it was and it equals t_(j-1); the sequence then gains t_0 .. t_a, the a
accepted drafts and the target's own token after them (the correction, or the bonus token when
all d were accepted).

Greedy rows: t_j is the argmax, so this is "accept the longest prefix of drafts equal to the
target argmax, plus the correction/bonus token", and with batch-invariant kernels the output is
token for token the engine's without speculation.

Sampled rows: this is rejection sampling with a one-hot draft distribution, written as a
coupling. Standard speculative sampling accepts draft x with probability min(1, p(x)/q(x)) =
p(x) and, on rejection, samples from the residual max(0, p - q), normalised: p with x removed and
renormalised. Drawing t ~ p and accepting x iff t == x accepts with probability p(x), and given
a rejection t is distributed as p(. | t != x): the same joint law of (accepted, token), so every
emitted token is distributed as the processed target distribution p. A seeded request's
generator is moved back to the draws of the tokens it kept (`rewind`), so its stream, and its
output, is the one it gives without speculation. This is the rule for drafts that are not draws
(n-gram drafts, a draft model's greedy ones); a draft model's sampled drafts, whose law q it
keeps, are verified by min(1, p / q) with the residual max(0, p - q) instead, which keeps more
of them: `spec/rejection.py` rewrites their rows' tokens before this module reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # (the runner's output type: `worker/outputs.py` names `SpecResult` below)
    from pagoda.runtime.request import Request
    from pagoda.runtime.worker.outputs import ModelRunnerOutput


@dataclass
class SpecResult:
    """A step's drafts and how many of each were accepted, per drafted request."""

    requests: list[Request]
    drafted: list[int]
    accepted: list[int]


@dataclass
class SpecRows:
    """A step's speculative layout, per sampling request (row of the step's sampling order)."""

    counts: np.ndarray  # [S] int64 drafts scheduled (0: a plain row)
    drafts: np.ndarray  # [S, k] int64 draft tokens (left-aligned; beyond counts: unused)
    # seeded sampled requests with drafts: (their generator, its state before the step's draws)
    generators: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return int(self.counts.sum()) + len(self.counts)


def spec_rows(
    ids: np.ndarray, cu: np.ndarray, extra: np.ndarray, sampling: list[int]
) -> tuple[np.ndarray, SpecRows]:
    """A step with drafts (`extra`: tokens scheduled past each request's known ones): the
    token-batch rows to sample (every position of a drafted request) and the drafts, read back
    from the ids (a drafted row's tokens after its first)."""
    counts = extra[sampling]
    ends = cu[1:][sampling] - 1
    k = max(int(counts.max()), 1)
    cols = np.arange(k)
    idx = np.minimum((ends - counts + 1)[:, None] + cols, len(ids) - 1)
    drafts = np.where(cols[None, :] < counts[:, None], ids[idx], -1)
    return logit_rows(ends, counts), SpecRows(counts, drafts)


def logit_rows(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The token-batch rows whose logits are sampled: for each sampling request whose row ends
    at `ends[i]`, its last 1 + counts[i] positions, in order."""
    reps = counts + 1
    first = np.repeat(ends - counts, reps)
    group_start = np.repeat(np.cumsum(reps) - reps, reps)
    return first + np.arange(int(reps.sum())) - group_start


def accept(tokens: np.ndarray, spec: SpecRows) -> tuple[np.ndarray, np.ndarray]:
    """The target tokens of the step's sample rows (`tokens`, [sum(1 + counts)]) → (accepted
    drafts per request [S], the sample rows kept: each request's first 1 + accepted, whose
    tokens it gains, in order)."""
    counts, drafts = spec.counts, spec.drafts
    s, k = drafts.shape
    reps = counts + 1
    cols = np.arange(k + 1)
    live = cols[None, :] < reps[:, None]  # [S, k + 1]
    target = np.full((s, k + 1), -1, dtype=np.int64)
    target[live] = tokens  # row-major: each request's rows in order
    match = (drafts == target[:, :k]) & (cols[None, :k] < counts[:, None])
    accepted = np.cumprod(match, axis=1).sum(axis=1) if k else np.zeros(s, dtype=np.int64)
    keep = cols[None, :] <= accepted[:, None]
    return accepted, np.flatnonzero(keep[live])


def save_generators(reqs, counts: np.ndarray) -> list[tuple[torch.Generator, torch.Tensor]]:
    """The generators of seeded sampled requests with drafts, with their states now (before the
    step draws its uniforms: one per row, in row order)."""
    out = []
    for req, n in zip(reqs, counts.tolist()):
        gen = req.generator
        if n and gen is not None and not req.params.greedy:
            out.append((gen, gen.get_state()))
    return out


def rewind(spec: SpecRows, reqs, accepted: np.ndarray) -> None:
    """Move each seeded request's generator back to after the draws of the tokens it keeps
    (1 + accepted of its 1 + counts rows), as that many plain decode steps would leave it."""
    if not spec.generators:
        return
    kept = {}
    for req, n, a in zip(reqs, spec.counts.tolist(), accepted.tolist()):
        if n and req.generator is not None:
            kept[id(req.generator)] = (a, n)
    for gen, state in spec.generators:
        a, n = kept[id(gen)]
        if a == n:
            continue  # every row's draw was used
        gen.set_state(state)
        device = gen.device
        for _ in range(a + 1):  # as `sampler._uniforms` draws them: one call per row
            torch.rand(1, generator=gen, device=device)


def verified(result: ModelRunnerOutput, drafted: list, spec: SpecRows) -> ModelRunnerOutput:
    """A drafted step's sampled tokens (one entry per sample row) verified: each request's
    entries cut to the tokens it keeps, with their sequence lengths (`positions`), its seeded
    generator rewound to their draws, the counts of its drafts (`SpecResult`)."""
    tokens = np.asarray(result.token_ids, dtype=np.int64)
    accepted, kept = accept(tokens, spec)
    rewind(spec, drafted, accepted)
    reqs, lps = result.requests, result.logprobs
    kept_list = kept.tolist()
    lengths = np.fromiter((len(r.token_ids) for r in drafted), np.int64, len(drafted))
    # each kept entry's sequence length once appended: its request's, plus its place
    reps = accepted + 1
    place = np.arange(len(kept)) - np.repeat(np.cumsum(reps) - reps, reps) + 1
    mask = spec.counts > 0
    return replace(
        result,
        requests=[reqs[i] for i in kept_list],
        token_ids=tokens[kept].tolist(),
        logprobs=[lps[i] for i in kept_list],
        positions=(np.repeat(lengths, reps) + place).tolist(),
        spec=SpecResult(
            [r for r, m in zip(drafted, mask.tolist()) if m],
            spec.counts[mask].tolist(),
            accepted[mask].tolist(),
        ),
    )
