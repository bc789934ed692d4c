"""Kimi Delta Attention's rule (Kimi Linear's linear-attention layers): the gated delta rule of
`gated_delta.py` with a decay per key channel instead of per head, in torch: a port of
transformers' `chunk_kimi_delta_attention` (prefill chunks) and `recurrent_kimi_delta_attention`
(decode rows). Per head, a state S [key_dim, value_dim] and per token (q and k L2-normalised, q
scaled by key_dim ** -0.5, g [key_dim] <= 0 the log decay of each key channel):

    S <- diag(exp(g)) S;    S <- S + k (beta (v - k^T S))^T;    o = q^T S

The prefill runs in `gated_delta.prefill`'s packed layout (`rule=chunked`); the per-head rule
keeps its cheaper [chunk, chunk] decay, this one needs [chunk, chunk, key_dim] per head.
States and outputs are float32.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model import gated_delta

# The most float32 elements of the intra-chunk decay [chunks, H, C, C, K] held at once (256 MiB;
# a 64-token chunk of 32 heads at key_dim 128 is 2 ** 24 of them, so 4 chunks a group)
DECAY_ELEMENTS = 2**26


def recurrent_step(
    state: torch.Tensor,  # [S, H, K, V] float32: updated in place
    q: torch.Tensor,  # [S, H, K] float32, normalised and scaled
    k: torch.Tensor,  # [S, H, K] float32, normalised
    v: torch.Tensor,  # [S, H, V] float32
    g: torch.Tensor,  # [S, H, K] float32 (log decay per key channel)
    beta: torch.Tensor,  # [S, H] float32
) -> torch.Tensor:
    """One token of each of S sequences: o [S, H, V]; `state` holds the new states."""
    return gated_delta.delta_step(state, torch.exp(g)[..., None], q, k, v, beta)


def chunked(
    q: torch.Tensor,  # [R, H, K] float32, packed (R = chunks * C), normalised and scaled
    k: torch.Tensor,  # [R, H, K] float32, normalised (0 on padding)
    v: torch.Tensor,  # [R, H, V] float32
    g: torch.Tensor,  # [R, H, K] float32 (0 on padding)
    beta: torch.Tensor,  # [R, H] float32 (0 on padding)
    state: torch.Tensor,  # [S, H, K, V] float32, each sequence's state (sorted order): updated
    chunk: int,
    counts: list[int],  # sequences with a chunk at each chunk position (`ssd.ScanGroup`)
    keep: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """o [chunks, H, C, V] of the packed rows (`gated_delta.chunked_form`, the decay per key
    channel); `state` holds the final states; `keep` as `gated_delta.chunked`'s."""
    return gated_delta.chunked_form(q, k, v, g, beta, state, chunk, counts, keep, _channel_decays)


def _channel_decays(q, k, k_beta, cum) -> tuple[torch.Tensor, torch.Tensor]:
    """The triangular system and the intra-chunk scores [nc, H, C, C] with a decay per key
    channel (`cum` [nc, H, C, K]): the [C, C, K] decay per head and chunk, in groups of chunks
    of at most `DECAY_ELEMENTS`."""
    nc, H, C, K = cum.shape
    tril = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    system, intra = q.new_empty(nc, H, C, C), q.new_empty(nc, H, C, C)
    step = max(1, DECAY_ELEMENTS // (H * C * C * K))
    for a in range(0, nc, step):
        at = slice(a, a + step)
        c = cum[at]
        # exp(cum_i - cum_j) per key channel below the diagonal (the clamp as gated_delta's)
        decay = (c[..., :, None, :] - c[..., None, :, :]).clamp_(-80.0, 0.0).exp_()
        decay.mul_(tril[..., None])  # [chunks, H, C, C, K]
        system[at] = torch.einsum("nhik,nhjk,nhijk->nhij", k_beta[at], k[at], decay)
        intra[at] = torch.einsum("nhik,nhjk,nhijk->nhij", q[at], k[at], decay)
        del decay
    return system, intra


def prefill_bytes(tokens: int, heads: int, key_dim: int, value_dim: int, chunk: int) -> int:
    """An upper bound on the prefill's float32 temporaries (`gated_delta.prefill_bytes`'s, plus
    a [key_dim] row per head and packed row (the cumulative decay), plus one group's decay:
    at most `DECAY_ELEMENTS`, or one chunk's where that is more)."""
    from pagoda.runtime.model.ssd import scan_rows

    rows = scan_rows(tokens, chunk)
    per_chunk = heads * chunk * chunk * key_dim
    group = min(rows // chunk, max(1, DECAY_ELEMENTS // per_chunk)) * per_chunk
    return int((rows * heads * (3 * chunk + 9 * max(key_dim, value_dim)) + group) * 4)
