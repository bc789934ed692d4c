"""Repetition, frequency and presence penalties, applied only where they act: at the tokens a
request has seen.

vLLM/OpenAI semantics: a repetition penalty r divides the positive logits (multiplies the
negative ones) of tokens in the prompt or the output so far; frequency f and presence p then
subtract f * count + p from each output token's logit. Dense [N, V] count and mask tensors
(what this replaced) cost, per step at 256 x 32k, a 40 MB zero-fill, a tensor per request from
its whole output, and six full passes over the logits. Here each request keeps its distinct
tokens and counts up to date from its new tokens only (`SeenTokens`, O(1) a step), and a step
gathers, changes and scatters back just those entries of the logits (`Penalties.apply`), then
puts the originals back (`restore`) so that logprobs still read the model's logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


class SeenTokens:
    """One request's distinct output tokens with their counts and, for a repetition penalty,
    its distinct prompt and output tokens; `update` reads only the tokens appended since."""

    def __init__(self, prompt: Sequence[int], repetition: bool) -> None:
        self.done = 0  # output tokens counted so far
        self.pos: dict[int, int] = {}  # token -> its place in tok / cnt
        self.tok, self.cnt, self.n = np.empty(16, np.int64), np.empty(16, np.float32), 0
        self.prompt = frozenset(prompt) if repetition else None
        self.rep = np.fromiter(self.prompt or (), np.int64)  # prompt's, then new output ones
        self.n_rep = len(self.rep)

    def update(self, token_ids: list[int], num_prompt: int) -> None:
        """Counts the output tokens (token_ids[num_prompt:]) not counted yet."""
        if len(token_ids) - num_prompt < self.done:  # the output got shorter: count afresh
            self.__init__(token_ids[:num_prompt], self.prompt is not None)
        for t in token_ids[num_prompt + self.done :]:
            i = self.pos.get(t)
            if i is not None:
                self.cnt[i] += 1
                continue
            self.pos[t] = self.n
            self.tok, self.cnt = _room(self.tok, self.n), _room(self.cnt, self.n)
            self.tok[self.n], self.cnt[self.n] = t, 1
            self.n += 1
            if self.prompt is not None and t not in self.prompt:
                self.rep = _room(self.rep, self.n_rep)
                self.rep[self.n_rep] = t
                self.n_rep += 1
        self.done = len(token_ids) - num_prompt


def _room(a: np.ndarray, n: int) -> np.ndarray:
    """`a`, or a copy twice as long, so that a[n] exists."""
    if n < len(a):
        return a
    grown = np.empty(max(16, 2 * len(a)), a.dtype)
    grown[: len(a)] = a
    return grown


@dataclass
class Penalties:
    """A batch's penalties as the entries they touch: (row, token) pairs of every output token
    with its count, and of every seen token of the rows with a repetition penalty."""

    presence: torch.Tensor  # [N] float32
    frequency: torch.Tensor
    repetition: torch.Tensor
    out_rows: torch.Tensor  # [M] int64 (rows with a frequency or presence penalty)
    out_tokens: torch.Tensor  # [M] int64, distinct within a row
    out_counts: torch.Tensor  # [M] float32, >= 1
    rep_rows: torch.Tensor  # [R] int64 (rows whose repetition penalty is not 1)
    rep_tokens: torch.Tensor  # [R] int64, distinct within a row

    @classmethod
    def build(cls, reqs: Sequence) -> Penalties:
        """From the requests (each updating its `SeenTokens`, made on first use)."""
        out, rep = [], []
        for r in reqs:
            p = r.params
            if not p.needs_penalties:
                out.append((np.empty(0, np.int64), np.empty(0, np.float32)))
                rep.append(np.empty(0, np.int64))
                continue
            if r.seen_tokens is None:
                r.seen_tokens = SeenTokens(r.prompt_token_ids, p.repetition_penalty != 1.0)
            s = r.seen_tokens
            s.update(r.token_ids, r.num_prompt_tokens)
            counted = int(bool(p.frequency_penalty or p.presence_penalty))  # else subtracts 0
            out.append((s.tok[: s.n * counted], s.cnt[: s.n * counted]))
            rep.append(s.rep[: s.n_rep])

        def rows_of(arrays: list[np.ndarray]) -> torch.Tensor:
            lengths = [len(a) for a in arrays]
            return torch.from_numpy(np.repeat(np.arange(len(arrays)), lengths))

        def f32(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32)

        ps = [r.params for r in reqs]
        return cls(
            presence=f32([p.presence_penalty for p in ps]),
            frequency=f32([p.frequency_penalty for p in ps]),
            repetition=f32([p.repetition_penalty for p in ps]),
            out_rows=rows_of([t for t, _ in out]),
            out_tokens=torch.from_numpy(np.concatenate([t for t, _ in out])),
            out_counts=torch.from_numpy(np.concatenate([c for _, c in out])),
            rep_rows=rows_of(rep),
            rep_tokens=torch.from_numpy(np.concatenate(rep)),
        )

    def to(self, move: Callable[[torch.Tensor], torch.Tensor]) -> Penalties:
        return Penalties(*(move(t) for t in vars(self).values()))

    @torch.inference_mode()  # the model's logits are inference tensors: written in place here
    def apply(self, logits: torch.Tensor) -> Callable[[], None]:
        """Penalises `logits` [N, V] (float32, contiguous) in place; returns what puts the
        originals back. Entries are addressed flat (row * V + token: one index, no repeats)."""
        if logits.dtype != torch.float32 or not logits.is_contiguous():
            raise TypeError(f"penalties need contiguous float32 logits, got {logits.dtype}")
        flat, v = logits.view(-1), logits.shape[1]
        rep_at, out_at = self.rep_rows * v + self.rep_tokens, self.out_rows * v + self.out_tokens
        rep_was, out_was = flat.index_select(0, rep_at), flat.index_select(0, out_at)
        if len(rep_was):
            r = self.repetition.index_select(0, self.rep_rows)
            flat.index_copy_(0, rep_at, torch.where(rep_was > 0, rep_was / r, rep_was * r))
        x = flat.index_select(0, out_at)
        rows = self.out_rows
        f, p = self.frequency.index_select(0, rows), self.presence.index_select(0, rows)
        flat.index_copy_(0, out_at, x - f * self.out_counts - p)

        @torch.inference_mode()
        def restore() -> None:
            flat.index_copy_(0, out_at, out_was)
            flat.index_copy_(0, rep_at, rep_was)

        return restore
