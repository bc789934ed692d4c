"""N-gram drafts: the longest n-gram of the tail found earlier wins, its latest occurrence,
the tokens after it (fewer where the sequence ends, at most the request's limit); batched over
sequences of unequal lengths; buffers topped up as sequences grow."""

from __future__ import annotations

import numpy as np
from pagoda.runtime.spec.ngram import NgramProposer


def _propose(p, seqs, limits=None):
    ids = [str(i) for i in range(len(seqs))]
    limits = np.full(len(seqs), 99) if limits is None else np.asarray(limits)
    drafts, counts = p.propose(ids, seqs, limits)
    return [d[:c].tolist() for d, c in zip(drafts, counts)]


def _reference(seq, k, lo, hi):
    """The rule written plainly: the longest n with an earlier match, its latest one."""
    for n in range(hi, lo - 1, -1):
        if len(seq) <= n:
            continue
        tail = seq[-n:]
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i : i + n] == tail:
                return seq[i + n : i + n + k]
    return []


def test_longest_latest_match_and_its_continuation():
    p = NgramProposer(k=3, lookup_min=2, lookup_max=4)
    seqs = [
        [1, 2, 3, 4, 5, 6, 1, 2, 3],  # 3-gram [1 2 3] at 0: 4 5 6
        [7, 8, 9, 7, 8, 1, 7, 8],  # 2-gram [7 8]: the latest earlier one (at 3) -> 1 7 8
        [5, 6, 7],  # no repeat
        [4, 4, 4, 4],  # [4 4 4] at 0 -> one token left after it
    ]
    assert _propose(p, seqs) == [[4, 5, 6], [1, 7, 8], [], [4]]
    assert _propose(p, seqs, limits=[1, 0, 3, 3]) == [[4], [], [], [4]]


def test_matches_the_plain_rule_on_random_batches():
    rng = np.random.default_rng(0)
    p = NgramProposer(k=4, lookup_min=1, lookup_max=3)
    for step in range(20):
        seqs = [rng.integers(0, 4, rng.integers(1, 40)).tolist() for _ in range(7)]
        p.retain([])  # new sequences under the same ids
        want = [_reference(s, 4, 1, 3) for s in seqs]
        assert _propose(p, seqs) == want, step


def test_buffers_grow_with_their_sequences():
    p = NgramProposer(k=2, lookup_min=2, lookup_max=2)
    seq = [1, 2, 3]
    for t in [1, 2, 9] * 30:
        seq.append(t)
        assert _propose(p, [seq]) == [_reference(seq, 2, 2, 2)]
    assert p.num_buffers == 1
    p.retain([])
    assert p.num_buffers == 0


def test_adaptive_backs_off_rejected_drafts_and_keeps_accepted_ones():
    """A sequence whose drafts are all rejected drafts fewer, then none for BACKOFF_STEPS steps,
    then probes again with one; one whose drafts are all accepted keeps full length; off, both
    keep full length."""
    from pagoda.runtime.spec import ngram

    seq = [1, 2, 3, 4, 5, 6, 7, 8] * 4  # always matches: the proposer drafts k = 4 tokens
    keys = ["bad", "good"]
    limits = np.full(2, 99)
    for adaptive in (True, False):
        p = NgramProposer(4, 2, 3, adaptive=adaptive)
        bad = []
        for _ in range(40):
            _, counts = p.propose(keys, [seq, seq], limits)
            assert counts[1] == 4  # the accepted one
            bad.append(int(counts[0]))
            p.observe(keys, counts.tolist(), [0, int(counts[1])])
        if not adaptive:
            assert bad == [4] * 40
            continue
        off = bad.index(0)
        assert 2 <= off <= 5 and bad[:off] == sorted(bad[:off], reverse=True)
        assert bad[off : off + ngram.BACKOFF_STEPS] == [0] * ngram.BACKOFF_STEPS
        assert bad[off + ngram.BACKOFF_STEPS] == 1  # the probe, rejected: off again
        assert bad[off + ngram.BACKOFF_STEPS + 1] == 0
    # an accepted probe brings the drafts back
    p = NgramProposer(4, 2, 3, adaptive=True)
    for _ in range(6):
        _, c = p.propose(["r"], [seq], limits[:1])
        p.observe(["r"], c.tolist(), [0])
    while (c := p.propose(["r"], [seq], limits[:1])[1])[0] == 0:
        pass
    p.observe(["r"], c.tolist(), c.tolist())
    assert p.propose(["r"], [seq], limits[:1])[1][0] == 4


def test_floor_rises_with_the_batch():
    """A sequence accepting about a quarter of its drafts keeps drafting beside one other
    decode, where its rows cost little, and backs off beside seven (`ngram.floor`); a copying
    sequence's two rejected steps in a row do not stop it there: its record is good."""
    from pagoda.runtime.spec import ngram

    assert ngram.floor(1) == ngram.floor(2) == ngram.FLOOR
    assert ngram.floor(8) == ngram.BATCH_FLOOR
    seq = [1, 2, 3, 4, 5, 6, 7, 8] * 4  # always matches
    limits = np.full(1, 99)

    def counts(batch, accepted_of):
        p, out = NgramProposer(4, 2, 3, adaptive=True), []
        for step in range(12):
            _, c = p.propose(["r"], [seq], limits, batch)
            out.append(int(c[0]))
            p.observe(["r"], c.tolist(), [accepted_of(step, int(c[0]))])
        return out

    def quarter(step, c):
        return max(c // 4, 1) if c else 0

    assert 0 not in counts(2, quarter)
    assert 0 in counts(8, quarter)

    def copying(step, c):
        return 0 if step in (6, 7) else c

    assert 0 not in counts(8, copying)
