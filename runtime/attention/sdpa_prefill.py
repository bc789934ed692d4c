"""Prefill rows through ``torch.nn.functional.scaled_dot_product_attention`` (non-invariant mode).

With ``batch_invariant=False`` the Triton backend hands a step's prompt rows to torch's SDPA,
which on CUDA dispatches to its FlashAttention-2 kernel: the non-invariant prefill path is then
SDPA's speed by construction. The default (batch-invariant) mode never comes here; its rows all
go through our Triton prefill kernel so that a row's bits do not depend on the batch.

One SDPA call per prefill sequence; a step with more than `MAX_SDPA_SEQS` of them (many short
prompts) runs its prompt rows in the Triton prefill kernel's one launch instead. Everything is planned from the metadata's host lists (``query_lens_host``,
``seq_lens_host``), so no device-to-host sync happens:

* a sequence with no cached context (``q_len == seq_len``) attends over the step's own ``k``/``v``
  with ``is_causal=True`` (with an FP8 cache it reads the cache instead, so that it sees the same
  rounded keys as its later decodes and as the Triton kernel);
* a chunk over cached context gathers its ``seq_len`` keys from the paged cache (block table rows
  → ``index_select``; an FP8 cache is widened to q's dtype and multiplied by its scales) and its
  queries are the last ``q_len`` positions: a bottom-right causal mask
  (``torch.nn.attention.bias.causal_lower_right``, which on CUDA runs the flash kernel; on CPU an
  explicit boolean mask, the same thing torch would materialize);
* GQA through ``enable_gqa=True`` (the flash kernel reads the shared KV heads in place).

``torch.nn.attention.varlen.varlen_attn`` (torch ≥ 2.10, CUDA only) could take the whole ragged
batch, and even the paged cache, in one call; it is not used yet because it cannot be checked on
CPU and its paged mode wants larger pages than our 16-token blocks.

Layers that SDPA cannot express with its fused kernels stay on the Triton kernel
(`supports`): logit soft-capping and attention sinks (gpt-oss) have no SDPA equivalent, and a
sliding window or chunked attention (Llama 4) would need an explicit mask, which rules out the
flash backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionMetadata

# More prefill sequences than this in one step (many short prompts) go to the Triton prefill
# kernel's single launch instead: one SDPA call (plus a gather) per sequence per layer costs host
# time that grows with the count, and short prompts gain little from SDPA.
MAX_SDPA_SEQS = 8


def supports(
    meta: AttentionMetadata,
    window: int | None,
    softcap: float | None,
    sinks: bool = False,
    chunk: int | None = None,
) -> bool:
    """True when this step's prompt rows can run through SDPA: the step has prefill sequences
    (at most `MAX_SDPA_SEQS`), the host lists are there to plan with, and the layer has no
    window, no attention chunk, no softcap and no attention sinks."""
    if window is not None or chunk is not None or softcap is not None or sinks:
        return False
    if not 0 < meta.num_seqs - meta.num_decodes <= MAX_SDPA_SEQS:
        return False  # decode-only steps (and CUDA-graph capture) keep the decode kernel
    return len(meta.query_lens_host) == meta.num_seqs == len(meta.seq_lens_host)


def _gather_kv(
    cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    block_row: torch.Tensor,  # int32 [max_blocks]
    seq_len: int,
    dtype: torch.dtype,
    scale: torch.Tensor | None,
) -> torch.Tensor:  # [seq_len, Hkv, D] in dtype
    block_size = cache.shape[1]
    n_blocks = -(-seq_len // block_size)
    blocks = cache.index_select(0, block_row[:n_blocks])
    kv = blocks.reshape(n_blocks * block_size, *cache.shape[2:])[:seq_len]
    if kv.dtype != dtype:
        kv = kv.to(dtype)
    if scale is not None:  # FP8: one scale, or one per KV head
        s = scale.to(dtype)
        kv = kv * (s.view(1, -1, 1) if s.numel() > 1 else s.reshape(()))
    return kv


def _causal_sdpa(
    q: torch.Tensor,  # [L, H, D]
    k: torch.Tensor,  # [S, Hkv, D]
    v: torch.Tensor,
    scale: float,
) -> torch.Tensor:  # [L, H, D]
    q_len, s_len = q.shape[0], k.shape[0]
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, len, D]
    gqa = q.shape[1] != k.shape[1]
    if q_len == s_len:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa)
    elif q.is_cuda:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q_len, s_len)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    else:
        # Query i sits at absolute position s_len - q_len + i and sees keys 0 .. that position.
        pos_q = torch.arange(s_len - q_len, s_len, device=q.device).unsqueeze(1)
        mask = torch.arange(s_len, device=q.device).unsqueeze(0) <= pos_q
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o.squeeze(0).transpose(0, 1)


def sdpa_prefill(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, Hkv, D], the step's new keys
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], already holding this step's k/v
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, H, D]; the prefill rows are written
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the prefill sequences (those after ``meta.num_decodes``) into
    ``out``'s rows; the decode rows of ``out`` are left alone. Returns ``out``."""
    start = sum(meta.query_lens_host[: meta.num_decodes])
    for i in range(meta.num_decodes, meta.num_seqs):
        q_len, s_len = meta.query_lens_host[i], meta.seq_lens_host[i]
        end = start + q_len
        if q_len == 0:
            continue
        if q_len == s_len and k_scale is None:  # a fresh prompt: its keys are this step's k/v
            ks, vs = k[start:end], v[start:end]
        else:  # cached context (or FP8): all its keys are in the paged cache now
            row = meta.block_tables[i]
            ks = _gather_kv(k_cache, row, s_len, q.dtype, k_scale)
            vs = _gather_kv(v_cache, row, s_len, q.dtype, v_scale)
        out[start:end] = _causal_sdpa(q[start:end], ks, vs, scale)
        start = end
    return out
