"""N-gram (prompt-lookup) drafts: each sequence's last n tokens searched for earlier in the
sequence (prompt and output), the tokens that followed there proposed as its next ones.

vLLM's `NgramProposer` semantics: the longest n in [prompt_lookup_min, prompt_lookup_max] with a
match wins; of its matches, this takes the most recent (in copy and edit workloads the text being
reproduced is usually the latest place the tail occurred). Up to `k` tokens follow it (fewer
where the sequence ends first).

Batched: the sequences' tokens sit left-aligned in one [B, L] int32 matrix (padding -1 never
matches a token), and each n compares n shifted views of it with the tails at once, so a step
costs a few vector passes over B x L entries whatever the batch (`benchmarks/spec_decode.py`
prints its time per step). Each sequence's tokens are kept as a growing NumPy buffer, so a step
copies only the tokens appended since the last one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAD = -1


class NgramProposer:
    def __init__(self, k: int, lookup_min: int, lookup_max: int) -> None:
        self.k, self.lookup_min, self.lookup_max = k, lookup_min, lookup_max
        # per sequence (keyed by its `Request`: an id may come back for a new request): its
        # tokens and their count
        self._bufs: dict[object, tuple[np.ndarray, int]] = {}

    def retain(self, keys) -> None:
        """Drop the buffers of sequences not in `keys` (finished, aborted)."""
        live = set(keys)
        for rid in [r for r in self._bufs if r not in live]:
            del self._bufs[rid]

    @property
    def num_buffers(self) -> int:
        return len(self._bufs)

    def _tokens(self, key: object, token_ids: Sequence[int]) -> np.ndarray:
        """The sequence's tokens as an int32 array (its buffer topped up with the new ones)."""
        buf, n = self._bufs.get(key, (None, 0))
        total = len(token_ids)
        if buf is None or total > len(buf):
            grown = np.empty(max(2 * total, 64), dtype=np.int32)
            if n:
                grown[:n] = buf[:n]
            buf = grown
        if total > n:
            buf[n:total] = token_ids[n:total]
        self._bufs[key] = (buf, total)
        return buf[:total]

    def propose(
        self, keys: Sequence[object], token_lists: Sequence[Sequence[int]], limits: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Drafts of each sequence (`keys`: what names its buffer, e.g. its `Request`): ([B, k]
        int64 tokens, [B] counts), a count at most its `limits` entry (0: no draft)."""
        b, k = len(keys), self.k
        arrays = [self._tokens(key, t) for key, t in zip(keys, token_lists)]
        lens = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=b)
        drafts = np.zeros((b, k), dtype=np.int64)
        counts = np.zeros(b, dtype=np.int64)
        if b == 0 or lens.max() <= self.lookup_min:
            return drafts, counts
        width = int(lens.max())
        mat = np.full((b, width + k), PAD, dtype=np.int32)  # k spare columns: drafts past the end
        for i, a in enumerate(arrays):
            mat[i, : len(a)] = a
        rows = np.arange(b)
        start = np.full(b, -1, dtype=np.int64)  # where each sequence's draft begins; -1: none
        for n in range(self.lookup_max, self.lookup_min - 1, -1):
            todo = (start < 0) & (lens > n)
            if not todo.any():
                continue
            w = width - n  # candidate match starts 0 .. w-1 (a token must follow the match)
            tails = mat[rows[:, None], np.maximum(lens[:, None] - n, 0) + np.arange(n)]
            hit = mat[:, 0:w] == tails[:, 0:1]
            for j in range(1, n):
                hit &= mat[:, j : j + w] == tails[:, j : j + 1]
            hit &= np.arange(w)[None, :] < (lens - n)[:, None]  # not the tail itself
            hit &= todo[:, None]
            found = hit.any(axis=1)
            last = w - 1 - hit[:, ::-1].argmax(axis=1)
            start = np.where(found, last + n, start)
        found = start >= 0
        if not found.any():
            return drafts, counts
        counts = np.where(found, np.minimum(np.minimum(lens - start, k), limits), 0)
        cols = np.where(found, start, 0)[:, None] + np.arange(k)
        drafts[:] = mat[rows[:, None], cols]
        drafts[np.arange(k)[None, :] >= counts[:, None]] = 0
        return drafts, counts


def takes_drafts(req) -> bool:
    """Whether a request's decode steps may carry drafts: only the token choice reads its logits
    (any temperature, top-k/top-p/min-p, seeds, stop tokens and strings, n > 1). Logprobs, prompt
    logprobs, penalties, logit_bias, allowed tokens, min_tokens, bad words and structured
    outputs read or change the logits by position or history: such a request decodes one token a
    step, as without speculation (docs/runtime.md)."""
    p = req.params
    return not (
        p.logprobs is not None
        or p.prompt_logprobs is not None
        or p.needs_penalties
        or p.logit_bias
        or p.allowed_token_ids is not None
        or p.min_tokens
        or req.bad_words
        or p.structured_outputs is not None
    )
