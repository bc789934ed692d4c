"""LogitBias: OpenAI's `logit_bias`, a sparse add to the rows' logits before sampling.

A request's bias is a few (token id, value) pairs (`SamplingParams.logit_bias`, values clipped
to [-100, 100], at most `MAX_LOGIT_BIAS` of them). A step's batch holds them flat, all rows
together: one `index_add`-style gather, add and write on the [N, V] logits, no per-row work.
It is applied with the penalties, to the logits the token is drawn from; like the penalties'
its originals are put back afterwards, so logprobs report the model's own distribution.

vLLM's `min_tokens` rides on it: while a row's next token is one of its first `min_tokens`,
its stop tokens (EOS unless `ignore_eos`, `stop_token_ids`) get -inf. That changes as the
output grows, so a batch holding such rows rebuilds its bias every step (`live` says so).
So do vLLM's `bad_words` (`bad_words.py`): -inf on the tokens that would complete a word.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from pagoda.runtime.sampling.bad_words import banned_now, needs_history


@dataclass
class LogitBias:
    rows: torch.Tensor  # [M] int64: the batch row of each entry
    tokens: torch.Tensor  # [M] int64: its token id (unique within a row)
    values: torch.Tensor  # [M] float32: what is added
    live: bool = False  # some row's stop tokens are masked for min_tokens (changes next step)
    # rows with -inf entries (bad words, min_tokens) and a grammar or allowed_token_ids: where
    # the bans leave nothing those allow, the row's entries are not applied (the grammar's or
    # the allowed tokens win; a row with no finite logit would draw token 0)
    guard: torch.Tensor | None = None

    @classmethod
    def build(cls, reqs: Sequence, vocab_size: int) -> LogitBias | None:
        """The entries of every row whose request asks for a bias, or whose next token is
        one of its first `min_tokens` (its stop tokens in the vocabulary: -inf), or that would
        complete one of its bad words (-inf); None when no row has any."""
        rows, tokens, values, live, guard = [], [], [], False, []
        stop_rows: list[tuple[int, torch.Tensor]] = []  # (row, its stop ids): -inf each
        for i, r in enumerate(reqs):
            p = r.params
            entries, stops, banned = p.logit_bias, frozenset(), set()
            if p.min_tokens and r.num_output_tokens + r.num_pending < p.min_tokens:
                live = True  # the token sampled now is output token num_output + num_pending
                stops = r.stop_ids
                stop_rows.append((i, _stop_ids_in_vocab(r, vocab_size)))
            if r.bad_words:  # the output is all on the host (such steps run synchronously)
                live = live or needs_history(r.bad_words)
                banned = banned_now(r.bad_words, r.token_ids[r.num_prompt_tokens :]) - stops
            if (stops or r.bad_words) and (
                p.structured_outputs is not None or p.allowed_token_ids is not None
            ):  # where the bans leave none of what those allow, those win (no token-0 draw)
                guard.append(i)
            if entries and (stops or banned):  # a masked token's bias gives way to its -inf
                entries = tuple((t, v) for t, v in entries if t not in stops and t not in banned)
            rows += [i] * (len(entries) + len(banned))
            tokens += [t for t, _ in entries]
            tokens += banned
            values += [v for _, v in entries]
            values += [float("-inf")] * len(banned)
        if not rows and not stop_rows and not live:  # live: a bad word may need some next step
            return None
        long = torch.int64
        rows_t, tokens_t = torch.tensor(rows, dtype=long), torch.tensor(tokens, dtype=long)
        values_t = torch.tensor(values, dtype=torch.float32)
        if stop_rows:  # thousands of stop ids cost no per-token Python (cached tensors)
            rows_t = torch.cat([rows_t, *(torch.full((len(s),), i, dtype=long)
                                          for i, s in stop_rows)])  # fmt: skip
            tokens_t = torch.cat([tokens_t, *(s for _, s in stop_rows)])
            total = sum(len(s) for _, s in stop_rows)
            values_t = torch.cat([values_t, torch.full((total,), float("-inf"))])
        return cls(rows_t, tokens_t, values_t, live,
                   torch.tensor(guard, dtype=long) if guard else None)  # fmt: skip

    def to(self, move: Callable[[torch.Tensor], torch.Tensor]) -> LogitBias:
        guard = move(self.guard) if self.guard is not None else None
        return LogitBias(move(self.rows), move(self.tokens), move(self.values), self.live, guard)

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
        if self.guard is not None:  # a guarded row left with no finite logit: entries undone
            dead = ~(logits.index_select(0, self.guard) > float("-inf")).any(-1)
            dead_rows = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
            dead_rows.index_copy_(0, self.guard, dead)
            undo = dead_rows.index_select(0, self.rows)
            flat.index_copy_(0, at, torch.where(undo, was, was + self.values))

        @torch.inference_mode()
        def restore() -> None:
            flat.index_copy_(0, at, was)

        return restore


def _stop_ids_in_vocab(r, vocab_size: int) -> torch.Tensor:
    """A request's stop ids below `vocab_size` as a tensor, made once (min_tokens masks them
    at each of its first steps)."""
    if r.stop_ids_in_vocab is None:
        ids = sorted(t for t in r.stop_ids if t < vocab_size)
        r.stop_ids_in_vocab = torch.tensor(ids, dtype=torch.int64)
    return r.stop_ids_in_vocab
