"""DeepSeek-V4's KV compressors as pure functions of per-token rows (the design in
docs/runtime.md, "DeepSeek-V4 in the engine"): transformers' ``DeepseekV4CSACompressor`` (and its
indexer's, at ``index_head_dim``) and ``DeepseekV4HCACompressor`` keep a per-request buffer, an
overlap slice and the running entries in their cache; here compressed entry ``w`` of a sequence
is computed from the projected rows of the tokens it covers alone, so an engine that keeps those
rows in its paged cache (one row per token, as every other cache row) needs no hidden state:
chunked prefill, prefix caching and preemption see only token rows.

Entry ``w`` of a compressor of ``rate`` m (its tokens ``[w m, (w + 1) m)``), over the token rows
``kv`` and ``gate`` (``kv_proj(x)``, ``gate_proj(x)``; ``position_bias`` [m, C] added to the
gate):

- HCA (no overlap, C = D): ``sum_j softmax_j(gate_j + bias_j) * kv_j`` over the window's m
  tokens (the softmax per channel, float32);
- CSA (overlap, C = 2 D): the window's tokens' second halves (Cb) and the previous window's
  tokens' first halves (Ca) together, 2 m slots (window 0: only its own m; the previous
  window's slots weigh 0, as transformers' first call);

then RMSNorm (``kv_norm``, float32 weight) and the interleaved rotary of the trailing
``rope_dim`` dims at position ``w m`` (the "compress" rotary table). Batched: ``kv`` and
``gate`` are ``[B, L, C]`` (B sequences, L a multiple of m: their complete windows), the result
``[B, L / m, D]``.
"""

from __future__ import annotations

import torch


def compress(
    kv: torch.Tensor,
    gate: torch.Tensor,
    position_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    rate: int,
    overlap: bool,
) -> torch.Tensor:
    """The normed entries ``[B, W, D]`` (no rotary yet) of the complete windows of ``kv`` /
    ``gate`` ``[B, W * rate, C]`` (module docstring)."""
    b, length, c = kv.shape
    w = length // rate
    kv = kv.view(b, w, rate, c)
    gate = gate.view(b, w, rate, c) + position_bias
    if overlap:
        d = c // 2
        prev_kv = torch.zeros_like(kv[..., :d])  # window w - 1's Ca: none before window 0
        prev_gate = torch.full_like(gate[..., :d], float("-inf"))
        prev_kv[:, 1:] = kv[:, :-1, :, :d]
        prev_gate[:, 1:] = gate[:, :-1, :, :d]
        kv = torch.cat([prev_kv, kv[..., d:]], dim=2)  # [B, W, 2 m, D]
        gate = torch.cat([prev_gate, gate[..., d:]], dim=2)
    weights = gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)
    pooled = (kv * weights).sum(dim=2)
    x = pooled.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (norm_weight * x).to(pooled.dtype)


def rotate_trailing(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [..., D] with its last ``2 * cos.shape[-1]`` dims rotated in interleaved pairs
    (DeepSeek-V4's rotary: pair (2i, 2i + 1) by angle i), in float32; ``cos`` / ``sin``
    broadcast to ``x[..., :1]`` with the half rotary width."""
    r = 2 * cos.shape[-1]
    nope, rope = x[..., :-r], x[..., -r:].float()
    even, odd = rope[..., 0::2], rope[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat([nope, rotated.to(x.dtype)], dim=-1)


def entry_positions(windows: int, rate: int, device: torch.device) -> torch.Tensor:
    """The rotary position of each entry: its window's first token, ``w * rate``."""
    return torch.arange(windows, device=device) * rate
