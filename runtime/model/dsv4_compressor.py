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

import numpy as np
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


def slot_start(done: torch.Tensor, rate: int, overlap: bool) -> torch.Tensor:
    """The first token a sequence's open-window slot holds once ``done`` tokens are in the
    cache: the open window's start, and for CSA (``overlap``) the last complete window's too
    (its Ca halves feed the next entry). At a window boundary HCA's slot is empty and CSA's
    holds that one window: the "Ca tail" a block stores (docs: "DeepSeek-V4 in the engine")."""
    closed = done // rate
    return (closed - 1).clamp(min=0) * rate if overlap else closed * rate


def step_widths(done: np.ndarray, q: np.ndarray, rate: int, overlap: bool) -> tuple[int, int]:
    """`step_entries`' two sizes from the host's lengths (no device sync): the spans' width,
    windows whole, and the new slots' most rows."""

    def first(n: np.ndarray) -> np.ndarray:  # `slot_start` on the host
        return np.maximum(n // rate - 1, 0) * rate if overlap else n // rate * rate

    start = first(done)
    span = done - start + q
    width = -(-int(span.max()) // rate) * rate
    n_slot = span - (first(done + q) - start)
    return width, max(int(n_slot.max()), 0)


def step_entries(
    slot_kv: torch.Tensor,  # [B, S, C] the slot rows (tokens slot_start(done) .. done - 1)
    slot_gate: torch.Tensor,
    new_kv: torch.Tensor,  # [B, Q, C] the step's rows, padded (the first q[b] real)
    new_gate: torch.Tensor,
    done: torch.Tensor,  # int64 [B] tokens cached before the step
    q: torch.Tensor,  # int64 [B] the step's tokens
    position_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    rate: int,
    overlap: bool,
    widths: tuple[int, int] | None = None,  # `step_widths`' (None: read from the device)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the compressor over a batch (the design's open-window slot): (entries
    [B, W, D] of the windows each span holds, first [B] absolute index of entries[:, 0], keep
    bool [B, W]: the entries that close in this step, the new slot's kv and gate [B, S', C]).
    The spans (slot then step rows) start on window boundaries, so `compress` over them gives
    the closing windows' entries; a CSA span's first window is the one before (its own entry,
    emitted earlier, is dropped). Batched: spans padded to the longest (padding only follows a
    sequence's rows, so it only touches windows past its own)."""
    dev = new_kv.device
    start, s_len = slot_start(done, rate, overlap), done - slot_start(done, rate, overlap)
    span = s_len + q
    width = -(-int(span.max()) // rate) * rate if widths is None else widths[0]
    b, c = new_kv.shape[0], new_kv.shape[-1]
    j = torch.arange(width, device=dev)[None, :]  # span position
    from_slot = j < s_len[:, None]
    slot_idx = j.clamp(max=max(slot_kv.shape[1] - 1, 0)).expand(b, -1)
    new_idx = (j - s_len[:, None]).clamp(0, max(new_kv.shape[1] - 1, 0))

    def gather(slot: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        a = slot.gather(1, slot_idx[..., None].expand(-1, -1, c)) if slot.shape[1] else 0
        n = new.gather(1, new_idx[..., None].expand(-1, -1, c))
        return torch.where(from_slot[..., None], a, n) if slot.shape[1] else n

    kv, gate = gather(slot_kv, new_kv), gather(slot_gate, new_gate)
    entries = compress(kv, gate, position_bias, norm_weight, eps, rate, overlap)
    first = start // rate
    w = first[:, None] + torch.arange(entries.shape[1], device=dev)[None, :]
    keep = (w >= done[:, None] // rate) & (w < (done + q)[:, None] // rate)
    # the new slot: span tokens from slot_start(done + q) on, left-aligned
    new_start = slot_start(done + q, rate, overlap) - start
    n_slot = span - new_start
    k = torch.arange(max(int(n_slot.max()), 0) if widths is None else widths[1], device=dev)[None]
    idx = (new_start[:, None] + k).clamp(max=width - 1)[..., None].expand(-1, -1, c)
    return entries, first, keep, kv.gather(1, idx), gate.gather(1, idx)
