"""DeepSeek-V4's attention math on whole sequences (the design: docs/runtime.md, "DeepSeek-V4 in
the engine"), as transformers' ``DeepseekV4Attention`` computes it: the step the engine layer
will run over rows gathered from its paged cache and entry tables (`dsv4_compressor` makes the
entries). Not served yet: no model class reads it.

For tokens ``[B, L]`` (one sequence per row, positions ``0 .. L - 1``):

- q: ``q_b_proj(q_norm(q_a_proj(x)))`` per head, RMS-normalised per head without a weight; the
  KV row ``kv_norm(kv_proj(x))`` (one head, K = V); both rotated on their trailing dims
  (`dsv4_compressor.rotate_trailing`) by the layer's table ("main" on sliding layers, else
  "compress");
- each query scores the rows of the last ``window`` tokens up to itself and the entries
  ``entry_mask`` allows (CSA: the indexer's picks; HCA: every complete window before it), one
  float32 softmax with the head's sink, then its output's rotary slice rotated back (−angle);
- the grouped output projection: heads in ``groups`` groups, each group's ``[H / g * D]`` to
  ``o_lora_rank`` by its block of ``o_a`` (`grouped_projection`), then ``o_b``.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.dsv4_compressor import rotate_trailing


def rms(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim in float32 (with ``weight``, float32, as transformers keeps
    DeepSeek-V4's), back in x's dtype."""
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (y if weight is None else weight * y).to(x.dtype)


def grouped_projection(x: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
    """``o_a_proj``: ``x`` [..., groups, n] times each group's rows of ``weight``
    [groups * r, n] → [..., groups, r] (one bmm over the groups)."""
    lead, n = x.shape[:-2], x.shape[-1]
    w = weight.view(groups, -1, n).transpose(1, 2)  # [g, n, r]
    y = torch.bmm(x.reshape(-1, groups, n).transpose(0, 1), w).transpose(0, 1)
    return y.reshape(*lead, groups, -1)


def window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [L, L]: query t sees token j when ``t - window < j <= t``."""
    t = torch.arange(length, device=device)
    d = t[:, None] - t[None, :]
    return (d >= 0) & (d < window)


def attend(
    q: torch.Tensor,  # [B, L, H, D] rotated
    rows: torch.Tensor,  # [B, L, D] rotated KV rows (K = V)
    entries: torch.Tensor | None,  # [B, E, D] compressed entries, or None (sliding layer)
    entry_mask: torch.Tensor | None,  # bool [B, L, E]: which entries each query attends
    window: int,
    sinks: torch.Tensor,  # float32 [H]
    scale: float,
) -> torch.Tensor:
    """Each query's softmax over its window's rows and its entries, with its head's sink →
    [B, L, H, D] (float32 scores, as transformers' eager attention in float32)."""
    b, length = rows.shape[:2]
    keys = rows if entries is None else torch.cat([rows, entries], dim=1)  # [B, K, D]
    s = torch.einsum("blhd,bkd->bhlk", q.float(), keys.float()) * scale
    allowed = window_mask(length, window, q.device).expand(b, -1, -1)
    if entries is not None:
        allowed = torch.cat([allowed, entry_mask], dim=-1)
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sinks.view(1, -1, 1, 1))
    e = torch.exp(s - m)
    p = e / (e.sum(dim=-1, keepdim=True) + torch.exp(sinks.view(1, -1, 1, 1) - m))
    return torch.einsum("bhlk,bkd->blhd", p.to(keys.dtype), keys)


def unrotate(out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The output's rotary slice rotated back by its query's angle (−sin)."""
    return rotate_trailing(out, cos, -sin)


def index_scores(
    q: torch.Tensor,  # [B, L, Hi, Di] the indexer's rotated queries
    entries: torch.Tensor,  # [B, E, Di] its rotated compressed keys
    weights: torch.Tensor,  # [B, L, Hi] weights_proj(x)
) -> torch.Tensor:
    """The lightning indexer's ``sum_h w_h / sqrt(Hi) * relu(q_h . k) / sqrt(Di)`` [B, L, E],
    float32."""
    h, d = q.shape[-2:]
    s = torch.einsum("blhd,bed->blhe", q.float(), entries.float()).relu() * d**-0.5
    return (s * (weights.float() * h**-0.5).unsqueeze(-1)).sum(dim=2)


def picked_entries(scores: torch.Tensor, rate: int, topk: int) -> torch.Tensor:
    """bool [B, L, E]: the ``topk`` best entries of each query among the complete windows
    before it (entry w when ``w < (t + 1) // rate``)."""
    length, e = scores.shape[1:]
    t = torch.arange(length, device=scores.device)
    ready = torch.arange(e, device=scores.device)[None, :] < ((t + 1) // rate)[:, None]
    scores = scores.masked_fill(~ready, float("-inf"))
    top = scores.topk(min(topk, e), dim=-1)
    keep = torch.zeros_like(scores, dtype=torch.bool)
    keep.scatter_(-1, top.indices, top.values > float("-inf"))
    return keep & ready


def all_entries(length: int, entries: int, rate: int, device: torch.device) -> torch.Tensor:
    """bool [L, E]: HCA's queries see every complete window before them."""
    t = torch.arange(length, device=device)
    return torch.arange(entries, device=device)[None, :] < ((t + 1) // rate)[:, None]
