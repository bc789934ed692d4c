"""Pure-PyTorch references with the launchers' signatures: the ground truth in the tests.

Written for clarity, not speed (per-sequence loops, float32 maths). They never read cache blocks
a sequence does not own, so they also work on huge, lazily-allocated pools in the tests.
"""

from __future__ import annotations

import torch


def paged_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    num_decodes: int | None = None,
    num_kv_splits: int | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    attention_chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    image_spans: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention by absolute position, gathered through the block tables (float32 maths).

    With ``sliding_window`` W, the query at position p sees the keys p - W + 1 .. p (as Hugging
    Face's sliding-window mask); with ``softcap`` c, scores are c * tanh(scores / c) before the
    mask (Gemma); with ``sinks`` [H], each head's sink joins its softmax's denominator (a logit
    no value is read for, as Hugging Face's gpt-oss attention); with ``attention_chunk`` C,
    the query at p sees the keys p - p % C .. p (Hugging Face's chunked mask, Llama 4); with
    ``alibi_slopes`` [H], each head's scores plus slope * (key - query) (ALiBi); with
    ``image_spans`` int32 [T, 2], query row t also sees the keys ``image_spans[t, 0] ..
    image_spans[t, 1]`` (its image's, both ways: transformers' ``token_type_ids`` mask; an
    empty span where the first is past the last). Only the blocks of the first query's window
    or chunk (or its sequence's first image) on are read.
    """
    del max_query_len, max_seq_len, num_decodes, num_kv_splits  # planning hints only
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    starts = query_start_loc.tolist()
    for seq, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[seq], starts[seq + 1]
        if hi == lo:
            continue
        if seq_len == 0:
            out[lo:hi] = 0
            continue
        p0 = seq_len - (hi - lo)  # the first query's position
        first = 0 if sliding_window is None else max(0, p0 - sliding_window + 1)
        if attention_chunk is not None:
            first = max(first, p0 - p0 % attention_chunk)
        span = None if image_spans is None else image_spans[lo:hi].long()
        if span is not None and bool((span[:, 0] <= span[:, 1]).any()):
            first = min(first, int(span[:, 0].min()))
        b0, n_blocks = first // block_size, -(-seq_len // block_size)
        blocks = block_tables[seq, b0:n_blocks].long()  # the window's (chunk's) blocks only
        start, d = b0 * block_size, k_cache.shape[3]
        k = k_cache[blocks].reshape(-1, num_kv_heads, d)[: seq_len - start].float()
        v = v_cache[blocks].reshape(-1, num_kv_heads, d)[: seq_len - start].float()
        k = k.repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.repeat_interleave(group, dim=1)
        qs = q[lo:hi].float()  # [L, H, D]
        scores = torch.einsum("lhd,shd->hls", qs, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(seq_len - (hi - lo), seq_len, device=q.device)
        k_pos = torch.arange(start, seq_len, device=q.device)
        hidden = k_pos[None, None, :] > q_pos[None, :, None]
        if sliding_window is not None:
            hidden |= k_pos[None, None, :] <= q_pos[None, :, None] - sliding_window
        if attention_chunk is not None:  # another chunk's key (transformers' chunked_overlay)
            c = attention_chunk
            hidden |= k_pos[None, None, :] // c != q_pos[None, :, None] // c
        if span is not None:  # an image's rows see its whole span (transformers' mm mask)
            seen = (k_pos[None, :] >= span[:, :1]) & (k_pos[None, :] <= span[:, 1:])
            hidden &= ~seen[None]
        if alibi_slopes is not None:
            rel = (k_pos[None, None, :] - q_pos[None, :, None]).float()
            scores = scores + alibi_slopes.float()[:, None, None] * rel
        scores = scores.masked_fill(hidden, float("-inf"))
        if sinks is not None:  # a column for the sink, dropped after the softmax
            sink = sinks.float()[:, None, None].expand(-1, hi - lo, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.einsum("hls,shd->lhd", probs, v).to(out.dtype)
    return out


def write_kv_cache(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``cache[slot // block_size, slot % block_size] = row`` for every slot >= 0."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[keep].to(v_cache.dtype)


def rms_norm(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm in float32, rounded to x's dtype before the weight (as HF Llama); with
    ``residual`` the sum is rounded to x's dtype before the norm."""
    new_residual = None
    if residual is not None:
        new_residual = (x.float() + residual.float()).to(x.dtype)
        x = new_residual
    xf = x.float()
    result = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    result = (result.float() * weight.float()).to(x.dtype)  # exact product, rounded once
    if out is not None:
        out.copy_(result)
        result = out
    if new_residual is None:
        return result
    if residual_out is not None:
        residual_out.copy_(new_residual)
        new_residual = residual_out
    return result, new_residual


def rotary_embedding(
    *,
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place on q/k (also returned): HF ``x*cos + rotate_half(x)*sin`` (NeoX) or interleaved pairs (GPT-J)."""
    rot = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)  # [T, rot/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x in (q, k):
        xr = x[..., :rot].float()
        if is_neox:
            x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        x[..., :rot] = rotated.to(x.dtype)
    return q, k


def silu_and_mul(*, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` in float32, cast back to x's dtype."""
    inter = x.shape[-1] // 2
    result = (torch.nn.functional.silu(x[:, :inter].float()) * x[:, inter:].float()).to(x.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out
