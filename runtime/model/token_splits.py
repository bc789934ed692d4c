"""Every split of a vocabulary's tokens into two tokens, found with numpy (a tiktoken file's BPE
merges: `tiktoken_files.merges_from_ranks`).

Kimi K2's 163,584 tokens have about a million split points; looked up one at a time in Python
(two slices and two dict lookups each) they took most of the ~2 s its tokenizer took to build.
Here every token and every prefix and suffix of every token gets a 64-bit polynomial hash at
once (one cumulative sum over the vocabulary's bytes, arithmetic modulo 2^64), the prefix and
suffix hashes are looked up among the tokens' hashes with `searchsorted`, and each candidate a
match names is then checked byte for byte, so a hash collision can cost time but never add or
lose a merge (equal bytes always hash equal; every candidate is compared as bytes, and one whose
bytes differ is dropped; two tokens of one hash send the vocabulary to the exact
one-split-at-a-time search).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible modulo 2^64


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) modulo 2^64."""
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


def split_pairs(tokens: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(whole, left, right) int64 arrays: the indices into `tokens` of every token and a split
    of it into two tokens (`tokens[whole] == tokens[left] + tokens[right]`), in no set order.
    `tokens` must be distinct."""
    if not tokens:
        return _split_pairs_exactly(tokens)
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    data = np.frombuffer(b"".join(tokens), dtype=np.uint8).astype(np.uint64) + np.uint64(1)
    n = len(data)
    up = _powers(_BASE, n + 1)
    down = _powers(np.uint64(pow(int(_BASE), -1, 1 << 64)), n + 1)
    with np.errstate(over="ignore"):
        # prefix[j] = hash(data[:j]) = sum data[m] * B^(j-1-m) = B^(j-1) * sum data[m] * B^-m
        prefix = np.zeros(n + 1, dtype=np.uint64)
        prefix[1:] = np.cumsum(data * down[:n], dtype=np.uint64) * up[:n]

        def span(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # hash(data[a:b])
            return prefix[b] - prefix[a] * up[b - a]

        whole_hash = span(starts, ends)
        order = np.argsort(whole_hash, kind="stable")
        table = whole_hash[order]
        if len(table) > 1 and bool((table[1:] == table[:-1]).any()):  # two tokens, one hash
            return _split_pairs_exactly(tokens)
        owner = np.repeat(np.arange(len(tokens), dtype=np.int64), np.maximum(lengths - 1, 0))
        first = np.cumsum(np.maximum(lengths - 1, 0)) - np.maximum(lengths - 1, 0)
        cut = starts[owner] + 1 + np.arange(len(owner), dtype=np.int64) - first[owner]
        left = _find(table, order, span(starts[owner], cut))
        hit = left >= 0  # a suffix is looked up only where the prefix is a token
        owner, left, cut = owner[hit], left[hit], cut[hit]
        right = _find(table, order, span(cut, ends[owner]))
    hit = right >= 0
    owner, left, right = owner[hit], left[hit], right[hit]
    same = np.array([tokens[a] + tokens[b] == tokens[w] for w, a, b in
                     zip(owner.tolist(), left.tolist(), right.tolist())], dtype=bool)  # fmt: skip
    return owner[same], left[same], right[same]


def _split_pairs_exactly(tokens: Sequence[bytes]) -> tuple[np.ndarray, ...]:
    """`split_pairs` one split at a time (where two tokens' hashes collide)."""
    index = {token: i for i, token in enumerate(tokens)}
    found = [(w, index[t[:i]], index[t[i:]]) for w, t in enumerate(tokens)
             for i in range(1, len(t)) if t[:i] in index and t[i:] in index]  # fmt: skip
    arrays = np.array(found, dtype=np.int64).reshape(-1, 3)
    return arrays[:, 0], arrays[:, 1], arrays[:, 2]


def _find(table: np.ndarray, order: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """The index of the token whose hash each of `hashes` is (-1: none); the hashes searched
    in sorted order (numpy's binary search then starts where the last one ended: ~5x faster)."""
    by_hash = np.argsort(hashes)
    at = np.empty(len(hashes), dtype=np.int64)
    at[by_hash] = np.searchsorted(table, hashes[by_hash])
    at = np.minimum(at, len(table) - 1)
    return np.where(table[at] == hashes, order[at], -1)
