"""The chunked SSD scan of a step's Mamba2 prefill chunks over a chunk-aligned PACKED layout
(vLLM's `mamba_chunk_scan_combined` with `seq_idx` / `cu_chunk_seqlens`, in torch).

Each sequence's tokens are laid out in whole SSD chunks of their own, padded only up to a
multiple of the chunk size (dt 0 on the padding, which then neither decays nor feeds a state):
sequences never share a chunk, and a step of one long prompt beside short ones costs the tokens
it has, not the long one's length per sequence. The chunks are ordered position-major: the
sequences sorted by their number of chunks (most first), chunk j of every sequence that has
one, then chunk j + 1, so the sequences still running at chunk position j are the first
``counts[j]`` and their chunks consecutive.

Padding each sequence to whole chunks can take more rows in all than the step's tokens as one
sequence (17 prompts of 4000 tokens: 17 x 4096 rows, above 68000's 68096): the sequences are
then scanned in groups of at most that many rows (`scan_rows`; one sequence always fits one),
so the scan's memory is bounded by the token budget alone (`ssd_scan_bytes`).

`pack` builds, on the host, where each token goes (in its group's packed rows and in the causal
conv's segments: each sequence's conv state, then its tokens); `scan_step` packs each group and
runs `ssd_scan` on it, which runs within chunks
the quadratic (attention-like) form for all chunks at once, then the recurrence on the
chunk-boundary states restarting at each sequence's first chunk from its own state (one pass
per chunk position, all sequences at once, as the state-passing kernel of vLLM walks chunks),
then reads each chunk's start state out. Its float32 temporaries are kept small: the decay
matrix is built, turned into the scores and consumed in one buffer, B and C are not repeated
per head (`ssd_scan_bytes` bounds them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ScanGroup:
    """Sequences scanned together (host arrays; `PackedHost.groups`)."""

    seqs: tuple[int, int]  # their range in the sorted order
    counts: list[int]  # sequences with a chunk at each chunk position (non-increasing)
    num_chunks: int
    tokens: np.ndarray  # int64 [Tg]: their tokens (indices into the step's prefill tokens)
    rows: np.ndarray  # int64 [Tg]: each token's row in the group's packed layout
    chunk_of: np.ndarray  # int64 [Tg]: its chunk (rows // chunk)
    in_chunk: np.ndarray  # int64 [Tg]: its place in the chunk (rows % chunk)


@dataclass(frozen=True)
class PackedHost:
    """A step's prefill chunks in the packed layout (host arrays, module docstring)."""

    order: np.ndarray  # int64 [S]: the sequences (step order) sorted by chunks, most first
    groups: list[ScanGroup]  # each at most `scan_rows` rows
    conv_rows: np.ndarray  # int64 [T]: each token's row in the conv segments
    conv_out: np.ndarray  # int64 [T]: its conv output's index (its window's first row)
    state_rows: np.ndarray  # int64 [S * (K - 1)]: where the conv states go (sorted order)
    end_rows: np.ndarray  # int64 [S * (K - 1)]: the new conv states' rows (sorted order)
    conv_len: int  # rows of the conv segments


def scan_rows(tokens: int, chunk: int) -> int:
    """The most packed rows one scan takes for a step of `tokens` prefill tokens: those of one
    sequence of them. Sequences padded to whole chunks can take more in all (17 of 4000 tokens
    take 17 x 4096, above 68000's 68096): they are then scanned in groups of at most this many
    rows (in chunks), one sequence always fitting one."""
    return -(-tokens // chunk) * chunk


def pack(lens: np.ndarray, chunk: int, d_conv: int) -> PackedHost:
    """The packed layout of prefill chunks of `lens` tokens (in step order)."""
    lens = np.asarray(lens, dtype=np.int64)
    k = d_conv - 1
    nchunks = -(-lens // chunk)
    order = np.argsort(-nchunks, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    seq = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    cap = scan_rows(int(lens.sum()), chunk) // chunk
    ends = np.cumsum(nchunks[order])
    groups, s0 = [], 0
    while s0 < len(lens):  # one pass per group (the sorted sequences cut at `cap` chunks)
        before = ends[s0 - 1] if s0 else 0
        s1 = max(int(np.searchsorted(ends, before + cap, side="right")), s0 + 1)
        n = nchunks[order[s0:s1]]
        counts = np.bincount(n - 1, minlength=int(n.max()))[::-1].cumsum()[::-1]
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tokens = np.flatnonzero((rank[seq] >= s0) & (rank[seq] < s1))
        tp = pos[tokens]
        chunk_of = offsets[tp // chunk] + rank[seq[tokens]] - s0
        rows = chunk_of * chunk + tp % chunk
        groups.append(ScanGroup((s0, s1), counts.tolist(), int(n.sum()), tokens, rows, chunk_of,
                                tp % chunk))  # fmt: skip
        s0 = s1
    seg = np.cumsum(lens + k) - (lens + k)  # each sequence's conv segment start (step order)
    conv_out = seg[seq] + pos
    states = (seg[order][:, None] + np.arange(k)).reshape(-1)
    new = ((seg + lens)[order][:, None] + np.arange(k)).reshape(-1)
    return PackedHost(order, groups, conv_out + k, conv_out, states, new,
                      int((lens + k).sum()))  # fmt: skip


def ssd_scan_bytes(
    tokens: int, seqs: int, heads: int, head_dim: int, d_state: int, groups: int, chunk: int
) -> int:
    """An upper bound on the scan's float32 bytes for a step of `tokens` prefill tokens in at
    most `seqs` sequences (`scan_rows` packed rows a scan; independent of the model's dtype, as
    the scan runs in float32), the packed inputs and the output included. Per head and packed
    row: one [chunk] row (the decay matrix turned into the scores in place) and per group one
    more (C B^T), B and C per group (with their matmul copies), six [head_dim] (x, x scaled by
    dt and its matmul copy, y, the read-out and its product) and the per-chunk states
    ([head_dim, d_state] per chunk); per head and token two [head_dim] (the output, a group's
    tokens gathered); per sequence of a scan three states (its start, and the recurrence's).
    Measured (`tests/runtime/model/test_hybrid_ssm.py`) at 0.7-0.96 of this."""
    rows = scan_rows(tokens, chunk)
    per = chunk * (1 + groups / heads) + 4 * d_state * groups / heads + 6 * head_dim + 4
    per += head_dim * d_state / chunk
    states = 3 * min(seqs, rows // chunk) * head_dim * d_state
    return int((rows * per + tokens * 2 * head_dim + states) * heads * 4)


def scan_step(
    x: torch.Tensor,  # [T, H, P] the step's prefill tokens
    dt: torch.Tensor,  # [T, H] float32
    A: torch.Tensor,
    B: torch.Tensor,  # [T, G, N]
    C: torch.Tensor,  # [T, G, N]
    ssm: torch.Tensor,  # [slots, H, P, N] the SSM state slots: read, and written back
    groups: list,  # (`ScanGroup`'s fields on the device: slots, tokens, rows, chunk_of, in_chunk)
    chunk: int,
    snaps: torch.Tensor | None = None,  # [entries, H, P, N] prefix caching's snapshots
) -> torch.Tensor:
    """y [T, H, P] float32 (without the D x skip): `ssd_scan` of each group of sequences in
    its packed layout, from their states in `ssm`, which get the final ones. With `snaps`, a
    group's `snap_chunks`' start states are copied into its `snap_entries` of them."""
    y = torch.empty(*x.shape, dtype=torch.float32, device=x.device)
    for g in groups:
        r = g.num_chunks * chunk
        xp, dtp, Bp, Cp = (_packed(t, g, r) for t in (x, dt, B, C))
        keep = None
        if snaps is not None and g.snap_chunks is not None and g.snap_chunks.numel():
            keep = (g.snap_chunks, snaps, g.snap_entries)
        yg, final = ssd_scan(xp, dtp, A, Bp, Cp, ssm.index_select(0, g.slots).float(), chunk,
                             g.counts, keep)  # fmt: skip
        del xp, dtp, Bp, Cp
        ssm.index_copy_(0, g.slots, final.to(ssm.dtype))
        y.index_copy_(0, g.tokens, yg[g.chunk_of, :, g.in_chunk])
    return y


def ssd_scan(
    x: torch.Tensor,  # [R, H, P] float32, packed (R = chunks * chunk)
    dt: torch.Tensor,  # [R, H] float32, softplus'd and clamped (0 on padding)
    A: torch.Tensor,  # [H] float32 (negative)
    B: torch.Tensor,  # [R, G, N] float32
    C: torch.Tensor,  # [R, G, N] float32
    state: torch.Tensor,  # [S, H, P, N] float32, each sequence's state (sorted order): updated
    chunk: int,
    counts: list[int],  # `PackedHost.counts`
    keep: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [chunks, H, chunk, P] without the D x skip, final states [S, H, P, N] (`state`
    itself)): transformers' `mamba2_chunk_scan` over the packed layout. Within a chunk the
    decay from s to l is exp(cumsum(a)[l] - cumsum(a)[s]) (as vLLM's kernels take it).
    `keep`: (packed chunks, a state tensor, its rows): those chunks' start states copied
    there (prefix caching's snapshots)."""
    R, H, P = x.shape
    G, N = B.shape[1:]
    hpg, nc, ln = H // G, R // chunk, chunk
    a_cum = torch.cumsum((dt * A).view(nc, ln, H).transpose(1, 2), dim=-1)  # [nc, H, l]
    xdt = (x * dt[..., None]).view(nc, ln, G, hpg, P).permute(0, 2, 3, 1, 4)  # [nc,G,hpg,l,P]
    Bg = B.view(nc, ln, G, N).transpose(1, 2)  # [nc, G, l, N]
    Cg = C.view(nc, ln, G, N).transpose(1, 2)
    # 1. within each chunk: y = (C B^T * decay) x, the decay turned into the scores in place
    scores = a_cum[..., :, None] - a_cum[..., None, :]  # [nc, H, l, s], <= 0 below the diagonal
    # exp(-80) is 2e-35: the clamp changes no sum, and keeps the CPU's exp on its fast path
    # (25x slower out of range); the upper triangle is then zeroed
    scores.clamp_(-80.0, 0.0).exp_().tril_()
    scores = scores.view(nc, G, hpg, ln, ln)
    scores.mul_(torch.matmul(Cg, Bg.transpose(-1, -2))[:, :, None])
    y = torch.matmul(scores, xdt)  # [nc, G, hpg, l, P]
    del scores
    # 2. each chunk's own contribution to the state at its end: [nc, G, hpg * P, N]
    to_end = torch.exp(a_cum[..., -1:] - a_cum).view(nc, G, hpg, 1, ln)
    xe = torch.empty(nc, G, hpg, P, ln, dtype=x.dtype, device=x.device)
    torch.mul(xdt.transpose(-1, -2), to_end, out=xe)
    del xdt, to_end
    own = torch.matmul(xe.view(nc, G, hpg * P, ln), Bg).view(nc, H, P, N)
    del xe
    # 3. the recurrence over chunk positions: each chunk's own state becomes its start state
    g = torch.exp(a_cum[..., -1])[..., None, None]  # [nc, H, 1, 1]
    off = 0
    for n in counts:
        rows = slice(off, off + n)
        new = torch.addcmul(own[rows], state[:n], g[rows])
        own[rows] = state[:n]
        state[:n] = new
        off += n
    del new
    if keep is not None:  # each chunk's start state is in `own` now
        chunks, dst, rows = keep
        dst.index_copy_(0, rows, own.index_select(0, chunks).to(dst.dtype))
    # 4. each chunk's start state read out at every position of it
    out = torch.matmul(Cg, own.view(nc, G, hpg * P, N).transpose(-1, -2))  # [nc, G, l, hpg*P]
    del own
    out = out.view(nc, G, ln, hpg, P).transpose(2, 3)
    y.addcmul_(out, torch.exp(a_cum).view(nc, G, hpg, ln, 1))
    return y.view(nc, H, ln, P), state


def _packed(t: torch.Tensor, g, rows: int) -> torch.Tensor:
    """A group's tokens of `t` in its packed layout (float32, zeros on the padding)."""
    out = torch.zeros(rows, *t.shape[1:], dtype=torch.float32, device=t.device)
    return out.index_copy_(0, g.rows, t.index_select(0, g.tokens).float())
