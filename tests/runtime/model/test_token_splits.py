"""`token_splits.split_pairs` (a tiktoken vocabulary's merges, found with hashes) finds exactly
the splits a one-at-a-time search finds: on a trained BPE vocabulary and on random tokens, and
where two tokens' 64-bit hashes collide (Thue-Morse strings: equal polynomial hashes modulo
2^64 for every odd base), which sends it to the exact search."""

from __future__ import annotations

import random

from pagoda.runtime.model import token_splits
from tiktoken_testlib import train_ranks


def _found(tokens) -> set[tuple[int, int, int]]:
    return set(zip(*(a.tolist() for a in token_splits.split_pairs(tokens)), strict=True))


def _exact(tokens) -> set[tuple[int, int, int]]:
    index = {t: i for i, t in enumerate(tokens)}
    return {(w, index[t[:i]], index[t[i:]]) for w, t in enumerate(tokens)
            for i in range(1, len(t)) if t[:i] in index and t[i:] in index}  # fmt: skip


def test_the_splits_of_a_trained_vocabulary_and_of_random_tokens():
    trained = list(train_ranks())
    assert _found(trained) == _exact(trained) and len(_exact(trained)) > len(trained) // 2
    rng = random.Random(0)
    tokens = [bytes([b]) for b in range(256)]
    while len(tokens) < 3000:  # short random byte strings: many splits, some parts missing
        t = bytes(rng.choice(b"ab\x00\xff") for _ in range(rng.randint(2, 9)))
        tokens += [] if t in tokens else [t]
    assert _found(tokens) == _exact(tokens)
    assert _found([]) == set() and _found([b"x"]) == set()


def _thue_morse(n: int) -> bytes:
    return bytes(b"ab"[bin(i).count("1") % 2] for i in range(1 << n))


def test_two_tokens_of_one_hash_take_the_exact_search():
    a = _thue_morse(11)  # = t + u, where t = _thue_morse(10) and u its complement
    b = a.translate(bytes.maketrans(b"ab", b"ba"))  # = u + t
    t, u = a[: len(a) // 2], b[: len(b) // 2]
    tokens = [b"a", b"b", a, b, t, u, a + b"a", b + b"a"]  # a and b are parts too
    found = _found(tokens)
    assert found == _exact(tokens) and {(2, 4, 5), (3, 5, 4), (6, 2, 0), (7, 3, 0)} <= found
