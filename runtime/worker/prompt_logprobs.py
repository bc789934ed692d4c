"""Prompt logprobs (vLLM's `prompt_logprobs`): each prompt token's log-probability given the
tokens before it, its rank, and the top-k alternatives, for the requests that ask.

The runner asks the LM head for the logits of those requests' prompt positions beside the
sampling rows (`StepInputs.extra_rows`, `prompt_rows`): position p scores prompt token p + 1,
so a prompt of P tokens has P - 1 entries (its first token has none), spread over the chunks of
a chunked prefill. The rows of every such request in the step are scored together here, on the
device, without a host sync: the results are read back with the step's sampled tokens. A step
without such a request does none of this (one truth test of an empty dict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.request import Request, TokenLogprob
from pagoda.runtime.sampling.ops import score_rows


@dataclass
class PromptRows:
    """What one step scores, on the host: whose rows, in row order, and their targets."""

    owners: list[tuple[Request, int]]  # (request, number of its rows)
    flat: np.ndarray  # int64 [M] rows of the step's token batch whose logits are scored
    targets: np.ndarray  # int64 [M] the prompt token each row scores
    k: int  # alternatives per row: the most any owner asks
    ranks: bool = True  # an owner wants the tokens' ranks (`SamplingParams.logprob_ranks`)


@dataclass
class PromptScores:
    """The scores of a step's `PromptRows` (device tensors until read back)."""

    chosen: torch.Tensor  # [M] float32 the prompt token's logprob
    rank: torch.Tensor | None  # [M] int64 place by value, ties by index (1 = best), if asked
    top_ids: torch.Tensor | None  # [M, k]
    top_logprobs: torch.Tensor | None  # [M, k]

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.chosen, self.rank, self.top_ids, self.top_logprobs


def prompt_rows(
    reqs: dict[str, Request],
    row_of: dict[str, int],
    starts: np.ndarray,
    qlens: np.ndarray,
    cu: np.ndarray,
) -> PromptRows | None:
    """The rows this step scores for the requests in `reqs` (those that asked, by id; the ones
    done or finished are dropped from it): for a request in row i of the step computing
    positions [s, s + qlen), its positions from `prompt_logprobs_next` up to the prompt's last
    but one. Advances each request's `prompt_logprobs_next` past them."""
    owners: list[tuple[Request, int]] = []
    flat: list[np.ndarray] = []
    targets: list[int] = []
    k, ranks = 0, False
    for rid, req in list(reqs.items()):
        if req.is_finished or not req.wants_prompt_logprobs:
            del reqs[rid]
            continue
        i = row_of.get(rid)
        if i is None:
            continue
        s = int(starts[i])
        a, b = max(s, req.prompt_logprobs_next), min(s + int(qlens[i]), req.num_prompt_tokens - 1)
        if a >= b:
            continue
        owners.append((req, b - a))
        flat.append(np.arange(cu[i] + a - s, cu[i] + b - s, dtype=np.int64))
        targets.extend(req.prompt_token_ids[a + 1 : b + 1])
        k = max(k, req.params.prompt_logprobs)
        ranks = ranks or req.params.logprob_ranks
        req.prompt_logprobs_next = b
    if not owners:
        return None
    targets_arr = np.asarray(targets, dtype=np.int64)
    return PromptRows(owners, np.concatenate(flat), targets_arr, k, ranks)


def score(logits: torch.Tensor, targets: torch.Tensor, k: int, ranks: bool = True) -> PromptScores:
    """Each row of `logits` [M, V] scored against its prompt token (`ops.score_rows`)."""
    return PromptScores(*score_rows(logits, targets, k, ranks))


def entries(
    rows: PromptRows, host: Sequence[torch.Tensor | None]
) -> list[tuple[Request, list[TokenLogprob]]]:
    """Read-back scores (`PromptScores.tensors()` on the host) → each owner's new entries, its
    top alternatives cut to what it asked."""
    chosen = host[0].tolist()
    m = len(chosen)
    rank = host[1].tolist() if host[1] is not None else [None] * m
    top_ids = host[2].tolist() if host[2] is not None else [[]] * m
    top_lps = host[3].tolist() if host[3] is not None else [[]] * m
    targets = rows.targets.tolist()
    out, at = [], 0
    for req, count in rows.owners:
        k = req.params.prompt_logprobs
        out.append((req, [
            TokenLogprob(targets[j], chosen[j], list(zip(top_ids[j][:k], top_lps[j][:k])), rank[j])
            for j in range(at, at + count)
        ]))  # fmt: skip
        at += count
    return out
