"""AllowedTokens: vLLM's `allowed_token_ids`, a mask that leaves a row only the listed tokens.

A step's batch holds one [R, V] bool mask for the R rows that ask (True: not allowed), built on
the host when the batch is and moved with it; rows that do not ask cost nothing. It is applied
first, before the logit bias and the penalties (vLLM's order), in place on the rows' logits,
and like theirs its originals are put back after the token is chosen: logprobs report the
model's own distribution, as vLLM's default `raw_logprobs` does.

With structured outputs the grammar's mask is already in the logits. Where a step's grammar
allows none of a row's tokens, that row keeps the grammar's choice for the step (the output
must still follow the grammar, and a row with no token left could not be sampled at all).

A row without a grammar whose allowed tokens all have -inf logits from the model itself (ids a
pruned LM head never scores: Apertus 1.5's) while others are finite still draws one of them
(`keep_allowed`: they all get logit 0, so a greedy row takes the first allowed id and a sampled
row a uniform one; vLLM's plain mask would leave the row all -inf: argmax's token 0, or a
softmax of NaN). A row with no finite logit at all (NaN, all -inf) is left to `NO_TOKEN`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class AllowedTokens:
    rows: torch.Tensor  # [R] int64: the batch rows that restrict their tokens
    mask: torch.Tensor  # [R, V] bool: True where the row's token is not allowed
    grammar: torch.Tensor  # [R, 1] bool: the row's output also follows a grammar

    @classmethod
    def build(cls, reqs: Sequence, vocab_size: int) -> AllowedTokens | None:
        """The masks of the rows whose request lists `allowed_token_ids`; None when none does."""
        rows = [i for i, r in enumerate(reqs) if r.params.allowed_token_ids is not None]
        if not rows:
            return None
        mask = torch.ones(len(rows), vocab_size, dtype=torch.bool)
        for j, i in enumerate(rows):
            mask[j, torch.tensor(reqs[i].params.allowed_token_ids, dtype=torch.long)] = False
        grammar = [[reqs[i].params.structured_outputs is not None] for i in rows]
        return cls(torch.tensor(rows, dtype=torch.long), mask, torch.tensor(grammar))

    def to(self, move: Callable[[torch.Tensor], torch.Tensor]) -> AllowedTokens:
        return AllowedTokens(move(self.rows), move(self.mask), move(self.grammar))

    @torch.inference_mode()  # the model's logits are inference tensors: written in place here
    def apply(self, logits: torch.Tensor) -> Callable[[], None]:
        """Sets the rows' other tokens to -inf in `logits` [N, V] (float32) in place; returns
        what puts the originals back."""
        if logits.dtype != torch.float32:
            raise TypeError(f"allowed_token_ids needs float32 logits, got {logits.dtype}")
        was = logits.index_select(0, self.rows)
        masked = was.masked_fill(self.mask, float("-inf"))
        top = masked.amax(-1, keepdim=True)
        # no finite allowed logit where the model's row has one, without a grammar: all alike
        lost = lost_rows(was, top) & ~self.grammar
        masked = keep_allowed(masked, ~self.mask, lost)
        # a row left with no finite logit (a grammar that allows none of its tokens) keeps
        # `was`; a NaN row keeps `masked` (NaN either way: NO_TOKEN)
        some = (top != float("-inf")) | lost
        logits.index_copy_(0, self.rows, torch.where(some, masked, was))

        @torch.inference_mode()
        def restore() -> None:
            logits.index_copy_(0, self.rows, was)

        return restore


def lost_rows(was: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """[R, 1] bool: rows of the model's logits `was` [R, V] with a finite maximum whose masked
    maximum `top` [R, 1] is -inf: every allowed token has a -inf logit from the model itself.
    A row of NaN, +inf or only -inf is not one (it is left for `NO_TOKEN`)."""
    return torch.isfinite(was.amax(-1, keepdim=True)) & (top == float("-inf"))


def keep_allowed(masked: torch.Tensor, allowed: torch.Tensor, lost: torch.Tensor) -> torch.Tensor:
    """`masked` [R, V] (-inf where not `allowed` [R, V] bool) with the `lost` rows ([R, 1]
    bool, `lost_rows`) given logit 0 on their allowed tokens: as likely as each other, so
    greedy takes the first allowed id (the first maximum) and sampling draws one uniformly
    (temperature leaves equal logits equal). In place, on the device, no sync; other rows
    unchanged."""
    return masked.masked_fill_(lost & allowed, 0.0)
