"""LogitBias: OpenAI's `logit_bias`, a sparse add to the rows' logits before sampling.

A request's bias is a few (token id, value) pairs (`SamplingParams.logit_bias`, values clipped
to [-100, 100], at most `MAX_LOGIT_BIAS` of them). A step's batch holds them flat, all rows
together: one `index_add`-style gather, add and write on the [N, V] logits, no per-row work.
It is applied with the penalties, to the logits the token is drawn from; like the penalties'
its originals are put back afterwards, so logprobs report the model's own distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class LogitBias:
    rows: torch.Tensor  # [M] int64: the batch row of each entry
    tokens: torch.Tensor  # [M] int64: its token id (unique within a row)
    values: torch.Tensor  # [M] float32: what is added

    @classmethod
    def build(cls, reqs: Sequence) -> LogitBias | None:
        """The entries of every row whose request asks for a bias; None when none does."""
        rows, tokens, values = [], [], []
        for i, r in enumerate(reqs):
            for token, value in r.params.logit_bias:
                rows.append(i)
                tokens.append(token)
                values.append(value)
        if not rows:
            return None
        return cls(torch.tensor(rows), torch.tensor(tokens), torch.tensor(values))

    def to(self, move: Callable[[torch.Tensor], torch.Tensor]) -> LogitBias:
        return LogitBias(move(self.rows), move(self.tokens), move(self.values))

    @torch.inference_mode()  # the model's logits are inference tensors: written in place here
    def apply(self, logits: torch.Tensor) -> Callable[[], None]:
        """Adds the bias to `logits` [N, V] (float32, contiguous) in place; returns what puts
        the originals back."""
        if logits.dtype != torch.float32 or not logits.is_contiguous():
            raise TypeError(f"logit_bias needs contiguous float32 logits, got {logits.dtype}")
        flat = logits.view(-1)
        at = self.rows * logits.shape[1] + self.tokens
        was = flat.index_select(0, at)
        flat.index_copy_(0, at, was + self.values)

        @torch.inference_mode()
        def restore() -> None:
            flat.index_copy_(0, at, was)

        return restore
