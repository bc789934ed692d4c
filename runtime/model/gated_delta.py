"""The gated delta rule (Gated DeltaNet: Qwen3-Next's and Qwen3.5's linear-attention layers,
`model/qwen3_next.py`) over a step's rows, in torch: a port of transformers'
`torch_chunk_gated_delta_rule` (prefill chunks) and `torch_recurrent_gated_delta_rule` (decode
rows), the reference of flash-linear-attention's kernels.

Per head, a state S [key_dim, value_dim] and per token (q and k L2-normalised, q scaled by
key_dim ** -0.5, the decay g = -exp(A_log) softplus(a + dt_bias) <= 0, beta = sigmoid(b)):

    S <- exp(g) S;    S <- S + k (beta (v - k^T S))^T;    o = q^T S

- decode rows (one token each): that step for all of them at once (`recurrent_step`), on
  states gathered from their slots;
- prefill chunks: in the packed layout of the Mamba2 scan (`ssd.pack`: each sequence's tokens
  in chunks of its own, padded to a whole chunk with beta 0 and g 0, which neither decay nor
  feed a state), the chunked (WY / UT-transform) form for every chunk at once: within a chunk
  the triangular system (I + tril(beta k k^T decay, -1)) solved for the corrected values and
  decayed keys, then the recurrence over chunk positions, all sequences at once, restarting at
  each sequence's first chunk from its own state (`chunked`), so a prompt split over steps
  computes what one pass would.

States are float32 (transformers keeps them so); the outputs are float32 [T, H, value_dim].
"""

from __future__ import annotations

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (transformers' and FLA's `l2norm`)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def recurrent_step(
    state: torch.Tensor,  # [S, H, K, V] float32: updated in place
    q: torch.Tensor,  # [S, H, K] float32, normalised and scaled
    k: torch.Tensor,  # [S, H, K] float32, normalised
    v: torch.Tensor,  # [S, H, V] float32
    g: torch.Tensor,  # [S, H] float32 (log decay)
    beta: torch.Tensor,  # [S, H] float32
) -> torch.Tensor:
    """One token of each of S sequences: o [S, H, V]; `state` holds the new states."""
    return delta_step(state, torch.exp(g)[..., None, None], q, k, v, beta)


def delta_step(state, decay, q, k, v, beta) -> torch.Tensor:
    """`recurrent_step` with the decay factor given, broadcast over `state` ([S, H, 1, 1] per
    head, or KDA's [S, H, K, 1] per key channel: `kda.recurrent_step`)."""
    state.mul_(decay)
    kv_mem = torch.matmul(k.unsqueeze(-2), state).squeeze(-2)  # [S, H, V]: k^T S
    delta = (v - kv_mem) * beta[..., None]
    state.add_(k.unsqueeze(-1) * delta.unsqueeze(-2))
    return torch.matmul(q.unsqueeze(-2), state).squeeze(-2)


def chunked(
    q: torch.Tensor,  # [R, H, K] float32, packed (R = chunks * C), normalised and scaled
    k: torch.Tensor,  # [R, H, K] float32, normalised (0 on padding)
    v: torch.Tensor,  # [R, H, V] float32
    g: torch.Tensor,  # [R, H] float32 (0 on padding)
    beta: torch.Tensor,  # [R, H] float32 (0 on padding)
    state: torch.Tensor,  # [S, H, K, V] float32, each sequence's state (sorted order): updated
    chunk: int,
    counts: list[int],  # sequences with a chunk at each chunk position (`ssd.ScanGroup`)
    keep: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """o [chunks, H, C, V] of the packed rows (transformers' `torch_chunk_gated_delta_rule`
    over the packed layout); `state` holds the final states. `keep`: (packed chunks, a state
    tensor, its rows): those chunks' start states copied there (prefix caching's snapshots,
    as `ssd.ssd_scan`'s)."""
    return chunked_form(q, k, v, g, beta, state, chunk, counts, keep, _head_decays)


def _head_decays(q, k, k_beta, cum) -> tuple[torch.Tensor, torch.Tensor]:
    """The triangular system and the intra-chunk scores [nc, H, C, C] with one decay per head
    (`cum` [nc, H, C, 1])."""
    c = cum[..., 0]
    # exp(cum_i - cum_j) below the diagonal, 0 above; exp(-80) is 1.8e-35: the clamp changes no
    # sum and keeps the CPU's exp on its fast path (`ssd.ssd_scan`'s), the upper half then zeroed
    decay = (c[..., :, None] - c[..., None, :]).clamp_(-80.0, 0.0).exp_().tril_()
    system = torch.matmul(k_beta, k.transpose(-1, -2)).mul_(decay)  # (its diagonal: unit)
    intra = torch.matmul(q, k.transpose(-1, -2)).mul_(decay)
    return system, intra


def chunked_form(q, k, v, g, beta, state, chunk: int, counts: list[int], keep, decays):
    """The chunked rule (`chunked`'s arguments; g [R, H] or, KDA's, [R, H, K]): the packed rows
    in chunks [nc, H, C, D], the cumulative log decay `cum` [nc, H, C, 1 or K], then
    ``decays(q, k, k * beta, cum)`` -> the triangular system (below its diagonal; the solve
    takes the diagonal as unit) and the intra-chunk scores [nc, H, C, C], the only part that
    differs between a decay per head (`_head_decays`) and per key channel (`kda.chunked`); the
    system solved for the corrected values and decayed keys, then the recurrence over chunk
    positions, all sequences at once."""
    R, H, _ = k.shape
    nc, C = R // chunk, chunk

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [R, H, D] -> [nc, H, C, D]
        return t.view(nc, C, H, -1).transpose(1, 2)

    q, k, v = chunks(q), chunks(k), chunks(v)
    beta = beta.view(nc, C, H).transpose(1, 2)  # [nc, H, C]
    cum = chunks(g).cumsum(-2)  # [nc, H, C, 1 or K]
    k_beta = k * beta[..., None]
    system, intra = decays(q, k, k_beta, cum)
    values = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False,
                                           unitriangular=True)  # fmt: skip
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * cum.exp(), upper=False,
                                               unitriangular=True)  # fmt: skip
    del system, k_beta
    q = q * cum.exp()
    k = k * (cum[..., -1:, :] - cum).exp()
    chunk_decay = cum[..., -1, :].exp()[..., None]  # [nc, H, 1 or K, 1]
    out = torch.empty_like(values)
    starts = None if keep is None else state.new_empty(nc, *state.shape[1:])
    off = 0
    for n in counts:  # the recurrence over chunk positions, all sequences at once
        rows = slice(off, off + n)
        s = state[:n]
        if starts is not None:  # each chunk's start state
            starts[rows] = s
        v_new = values[rows] - torch.matmul(k_cumdecay[rows], s)
        out[rows] = torch.matmul(q[rows], s) + torch.matmul(intra[rows], v_new)
        state[:n] = s * chunk_decay[rows] + torch.matmul(k[rows].transpose(-1, -2), v_new)
        off += n
    if keep is not None:
        at_chunks, dst, at = keep
        dst.index_copy_(0, at, starts.index_select(0, at_chunks).to(dst.dtype))
    return out


def packed(t: torch.Tensor, g, rows: int) -> torch.Tensor:
    """A group's tokens of `t` in its packed layout (float32, zeros on the padding)."""
    out = torch.zeros(rows, *t.shape[1:], dtype=torch.float32, device=t.device)
    return out.index_copy_(0, g.rows, t.index_select(0, g.tokens).float())


def prefill(
    q: torch.Tensor,  # [T, H, K] float32 the step's prefill tokens, normalised and scaled
    k: torch.Tensor,  # [T, H, K] float32, normalised
    v: torch.Tensor,  # [T, H, V]
    g: torch.Tensor,  # [T, H] float32
    beta: torch.Tensor,  # [T, H] float32
    ssm: torch.Tensor,  # [slots, H, K, V] the layer's state slots: read, and written back
    groups: list,  # the step's scan groups (`mamba2.ScanGroup`)
    chunk: int,
    snaps: torch.Tensor | None = None,  # [entries, H, K, V] prefix caching's snapshots
    rule=chunked,  # `kda.chunked` for a decay per key channel (g [T, H, K])
) -> torch.Tensor:
    """o [T, H, V] float32: `chunked` over each group of sequences in its packed layout, from
    their states in `ssm`, which get the final ones. With `snaps`, a group's `snap_chunks`'
    start states are copied into its `snap_entries` of them."""
    out = torch.empty(*v.shape, dtype=torch.float32, device=v.device)
    for grp in groups:
        r = grp.num_chunks * chunk
        parts = [packed(t, grp, r) for t in (q, k, v, g, beta)]
        state = ssm.index_select(0, grp.slots).float()
        keep = None
        if snaps is not None and grp.snap_chunks is not None and grp.snap_chunks.numel():
            keep = (grp.snap_chunks, snaps, grp.snap_entries)
        o = rule(*parts, state, chunk, grp.counts, keep)
        del parts
        ssm.index_copy_(0, grp.slots, state.to(ssm.dtype))
        out.index_copy_(0, grp.tokens, o[grp.chunk_of, :, grp.in_chunk])
    return out


def prefill_bytes(tokens: int, heads: int, key_dim: int, value_dim: int, chunk: int) -> int:
    """An upper bound on `prefill`'s float32 temporaries for a step of `tokens` prefill tokens
    (packed to `ssd.scan_rows` rows): per head and packed row, three [chunk] rows (the decay,
    the triangular system, the intra-chunk scores) and about eight [key_dim or value_dim] (the
    packed inputs, their chunked copies, the solved values and keys, the output)."""
    from pagoda.runtime.model.ssd import scan_rows

    rows = scan_rows(tokens, chunk)
    return int(rows * heads * (3 * chunk + 8 * max(key_dim, value_dim)) * 4)
