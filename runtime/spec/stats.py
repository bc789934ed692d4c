"""Speculative decoding's counters (vLLM's ``spec_decode`` metrics): drafts proposed, draft
tokens, accepted tokens and accepted tokens by position in the draft, cumulative."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecDecodeStats:
    num_drafts: int  # steps of a request that carried drafts
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]  # [k]: drafts accepted at position 0, 1, ... of their step

    @classmethod
    def empty(cls, k: int) -> SpecDecodeStats:
        return cls(0, 0, 0, [0] * k)

    def add(self, drafted: list[int], accepted: list[int]) -> None:
        """One step's drafted requests: their draft counts and accepted counts."""
        self.num_drafts += len(drafted)
        self.num_draft_tokens += sum(drafted)
        self.num_accepted_tokens += sum(accepted)
        per_pos = self.accepted_per_pos
        for a in accepted:  # a request's first a positions were accepted
            if a:
                per_pos[:a] = [c + 1 for c in per_pos[:a]]

    def reset(self) -> None:
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * len(self.accepted_per_pos)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over proposed draft tokens; None before any."""
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a drafted step gains on average (1 + accepted), vLLM's figure; None before."""
        if not self.num_drafts:
            return None
        return 1 + self.num_accepted_tokens / self.num_drafts
