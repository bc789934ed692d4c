"""AllowedTokens: vLLM's `allowed_token_ids`, a mask that leaves a row only the listed tokens.

A step's batch holds one [R, V] bool mask for the R rows that ask (True: not allowed), built on
the host when the batch is and moved with it; rows that do not ask cost nothing. It is applied
first, before the logit bias and the penalties (vLLM's order), in place on the rows' logits,
and like theirs its originals are put back after the token is chosen: logprobs report the
model's own distribution, as vLLM's default `raw_logprobs` does.

With structured outputs the grammar's mask is already in the logits. Where a step's grammar
allows none of a row's tokens, that row keeps the grammar's choice for the step (the output
must still follow the grammar, and a row with no token left could not be sampled at all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class AllowedTokens:
    rows: torch.Tensor  # [R] int64: the batch rows that restrict their tokens
    mask: torch.Tensor  # [R, V] bool: True where the row's token is not allowed

    @classmethod
    def build(cls, reqs: Sequence, vocab_size: int) -> AllowedTokens | None:
        """The masks of the rows whose request lists `allowed_token_ids`; None when none does."""
        rows = [i for i, r in enumerate(reqs) if r.params.allowed_token_ids is not None]
        if not rows:
            return None
        mask = torch.ones(len(rows), vocab_size, dtype=torch.bool)
        for j, i in enumerate(rows):
            mask[j, torch.tensor(reqs[i].params.allowed_token_ids, dtype=torch.long)] = False
        return cls(torch.tensor(rows, dtype=torch.long), mask)

    def to(self, move: Callable[[torch.Tensor], torch.Tensor]) -> AllowedTokens:
        return AllowedTokens(move(self.rows), move(self.mask))

    @torch.inference_mode()  # the model's logits are inference tensors: written in place here
    def apply(self, logits: torch.Tensor) -> Callable[[], None]:
        """Sets the rows' other tokens to -inf in `logits` [N, V] (float32) in place; returns
        what puts the originals back."""
        if logits.dtype != torch.float32:
            raise TypeError(f"allowed_token_ids needs float32 logits, got {logits.dtype}")
        was = logits.index_select(0, self.rows)
        masked = was.masked_fill(self.mask, float("-inf"))
        # a row left with no finite logit (a grammar that allows none of its tokens) keeps `was`
        some = (masked > float("-inf")).any(-1, keepdim=True)
        logits.index_copy_(0, self.rows, torch.where(some, masked, was))

        @torch.inference_mode()
        def restore() -> None:
            logits.index_copy_(0, self.rows, was)

        return restore
