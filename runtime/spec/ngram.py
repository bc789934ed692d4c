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

Adaptive drafting (`SpeculativeConfig.adaptive`, on by default): each sequence keeps an
exponential average of its drafts' acceptance (accepted / drafted, weight `EMA_WEIGHT` per
verified step, starting at 1), updated from the verifier's counts (`observe`). At or above
`FULL_AT` it drafts up to k tokens; below, k scaled by the average over `FULL_AT` (at least 1);
below the step's floor it drafts nothing for `BACKOFF_STEPS` of its decode steps, then probes
again with one draft (an accepted probe lifts the average, a rejected one backs off again). So a
sequence whose drafts keep being rejected stops paying for their rows; a copying one keeps full
length. The floor rises with the step's decodes (`floor`: `FLOOR` beside one other decode,
`BATCH_FLOOR` from ~7), since a draft row costs more of a larger step; above `FLOOR`, a sequence
backs off only when its whole record (accepted / drafted so far) is below the floor too, so a
copying sequence's few rejected steps do not stop it.
Greedy and seeded outputs do not depend on the draft lengths (`spec/verify.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAD = -1
EMA_WEIGHT = 0.5  # of the latest verified step in the acceptance average
FULL_AT = 0.5  # acceptance average from which a sequence drafts k tokens
FLOOR = 0.15  # below it, no drafts for BACKOFF_STEPS decode steps (a step of 1-2 decodes)
BATCH_FLOOR = 0.5  # the floor in a step of 2 * BATCH_FLOOR / FLOOR (~7) decodes or more
BACKOFF_STEPS = 16


class NgramProposer:
    def __init__(self, k: int, lookup_min: int, lookup_max: int, adaptive: bool = False) -> None:
        self.k, self.lookup_min, self.lookup_max = k, lookup_min, lookup_max
        self.adaptive = adaptive
        # per sequence (keyed by its `Request`: an id may come back for a new request): its
        # tokens and their count
        self._bufs: dict[object, tuple[np.ndarray, int]] = {}
        # per sequence, adaptive: [acceptance average, decode steps left without drafts, draft
        # tokens and accepted ones so far]
        self._accept: dict[object, list] = {}
        self._floor = FLOOR  # the last step's (`floor`)

    def retain(self, keys) -> None:
        """Drop the buffers of sequences not in `keys` (finished, aborted)."""
        live = set(keys)
        for rid in [r for r in self._bufs if r not in live]:
            del self._bufs[rid]
        for rid in [r for r in self._accept if r not in live]:
            del self._accept[rid]

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
        self,
        keys: Sequence[object],
        token_lists: Sequence[Sequence[int]],
        limits: np.ndarray,
        batch: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Drafts of each sequence (`keys`: what names its buffer, e.g. its `Request`): ([B, k]
        int64 tokens, [B] counts), a count at most its `limits` entry (0: no draft). `batch`:
        the step's decodes, drafting or not (default B; adaptive: it sets `floor`)."""
        b, k = len(keys), self.k
        if self.adaptive and b:
            self._floor = floor(b if batch is None else batch)
            limits = np.minimum(limits, self._lengths(keys))
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

    def _lengths(self, keys: Sequence[object]) -> np.ndarray:
        """Adaptive: each sequence's draft length this step (0 while it backs off; a backing-off
        sequence's count of steps left goes down by one)."""
        states = [self._accept.setdefault(key, [1.0, 0, 0, 0]) for key in keys]
        ema = np.fromiter((s[0] for s in states), np.float64, len(states))
        skip = np.fromiter((s[1] for s in states), np.int64, len(states))
        scaled = np.clip(np.floor(self.k * ema / FULL_AT), 1, self.k).astype(np.int64)
        lengths = np.where(skip > 0, 0, scaled)
        if skip.any():
            for s, left in zip(states, np.maximum(skip - 1, 0).tolist()):
                s[1] = left
        return lengths

    def observe(
        self, keys: Sequence[object], drafted: Sequence[int], accepted: Sequence[int]
    ) -> None:
        """The verifier's counts of a step's drafted sequences, folded into their acceptance
        averages; one that falls below the step's `floor` backs off for `BACKOFF_STEPS` steps."""
        if not self.adaptive or not keys:
            return
        d = np.asarray(drafted, dtype=np.float64)
        rate = np.asarray(accepted, dtype=np.float64) / np.maximum(d, 1)
        states = [self._accept.setdefault(key, [1.0, 0, 0, 0]) for key in keys]
        ema = np.fromiter((s[0] for s in states), np.float64, len(states))
        ema = np.where(d > 0, (1 - EMA_WEIGHT) * ema + EMA_WEIGHT * rate, ema)
        for s, n, a in zip(states, drafted, accepted):
            s[2] += n
            s[3] += a
        # the sequence's whole record, as if it began with 2 of 2 accepted
        overall = np.fromiter(((s[3] + 2) / (s[2] + 2) for s in states), np.float64, len(states))
        floor = self._floor  # in a larger batch: the recent average and the record both below it
        back = (d > 0) & ((ema < FLOOR) | ((ema < floor) & (overall < floor)))
        for s, e, off in zip(states, ema.tolist(), back.tolist()):
            s[0] = e
            if off:
                s[1] = BACKOFF_STEPS


def floor(batch: int) -> float:
    """The acceptance average below which a sequence stops drafting for a while, in a step of
    `batch` decodes. A draft token pays when accepted with a probability above the ratio of what
    one more row costs the step to what a row costs on average: on a CPU forward bound by
    streaming the weights, rows past the first few cost ~0.6 of the average at 8 decodes
    (docs/benchmarks.md) and little at 1-2. So the floor rises with the batch, from `FLOOR` at
    1-2 decodes to `BATCH_FLOOR` at ~7 and more."""
    return min(max(FLOOR * batch / 2, FLOOR), BATCH_FLOOR)


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
