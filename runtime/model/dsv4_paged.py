"""DeepSeek-V4's attention over a step's ragged tokens from the paged cache (the design:
docs/runtime.md, "DeepSeek-V4 in the engine"): what the engine layer runs once a step has
written its tokens' rotated KV rows into the layer's cache and its closed windows' entries into
the per-block entry tables (`dsv4_entries`). Not served yet: no model class calls it.

For the step's tokens ``t`` (sequence ``seq[t]``, absolute position ``pos[t]``):

- the window: the rows of positions ``pos - window < j <= pos`` through the sequence's block
  table (`window_slots`), as a sliding layer reads them;
- the entries (CSA / HCA): the sequence's entries ``w < (pos + 1) // rate`` (complete windows up
  to the token), read from the entry tables (`dsv4_entries.read_entries`); CSA keeps the
  ``index_topk`` its lightning indexer scores best (`pick`, `dsv4_attention.index_scores`'
  score per token), HCA all of them;
- one float32 softmax over both with the head's sink (`attend`), equal to
  `dsv4_attention.attend` over whole sequences.

Batched tensor indexing: no per-sequence Python loop.
"""

from __future__ import annotations

import torch


def window_slots(
    block_tables: torch.Tensor,  # [B, blocks]
    seq: torch.Tensor,  # [T] each token's sequence
    pos: torch.Tensor,  # [T] its position
    window: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [T, window], kept bool [T, window]): the cache slots of each token's window, oldest
    first (positions before 0 not kept; their slot is the sequence's first)."""
    j = pos[:, None] - torch.arange(window - 1, -1, -1, device=pos.device)[None, :]
    kept = j >= 0
    j = j.clamp(min=0)
    blocks = block_tables[seq].gather(1, j // block_size).long()
    return blocks * block_size + j % block_size, kept


def ready(pos: torch.Tensor, entries: int, rate: int) -> torch.Tensor:
    """bool [T, E]: the entries a token may attend: its sequence's complete windows."""
    return torch.arange(entries, device=pos.device)[None, :] < ((pos + 1) // rate)[:, None]


def index_scores(
    q: torch.Tensor,  # [T, Hi, Di] the indexer's rotated queries
    keys: torch.Tensor,  # [B, E, Di] its entries, per sequence
    weights: torch.Tensor,  # [T, Hi] weights_proj(x)
    seq: torch.Tensor,  # [T]
) -> torch.Tensor:
    """The lightning indexer's score of each token's sequence's entries [T, E], float32
    (`dsv4_attention.index_scores` per token)."""
    h, d = q.shape[-2:]
    s = torch.einsum("thd,ted->the", q.float(), keys[seq].float()).relu() * d**-0.5
    return (s * (weights.float() * h**-0.5).unsqueeze(-1)).sum(dim=1)


def pick(
    scores: torch.Tensor, allowed: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(entry indices [T, k], kept bool [T, k]): each token's ``topk`` best allowed entries
    (``k = min(topk, E)``; False where it has fewer)."""
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.topk(min(topk, scores.shape[1]), dim=-1)
    return top.indices, top.values > float("-inf")


def every(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HCA's (entry indices [T, E], kept [T, E]): all of them, the complete windows kept."""
    t, e = allowed.shape
    return torch.arange(e, device=allowed.device).expand(t, e), allowed


def attend(
    q: torch.Tensor,  # [T, H, D] rotated
    rows: torch.Tensor,  # [slots, D] the layer's cached rows (K = V)
    slots: torch.Tensor,  # [T, window]
    kept: torch.Tensor,  # bool [T, window]
    entries: torch.Tensor | None,  # [B, E, D] each sequence's entries, or None (sliding)
    picked: tuple[torch.Tensor, torch.Tensor] | None,  # (`pick` / `every`): [T, k] each
    seq: torch.Tensor,  # [T]
    sinks: torch.Tensor,  # float32 [H]
    scale: float,
) -> torch.Tensor:
    """Each token's softmax over its window's rows and its picked entries (only those gathered),
    with its head's sink → [T, H, D] (float32 scores, as `dsv4_attention.attend`)."""
    keys, allowed = rows[slots], kept  # [T, K, D]
    if entries is not None:
        idx, entry_kept = picked
        keys = torch.cat([keys, entries[seq[:, None], idx].to(keys.dtype)], dim=1)
        allowed = torch.cat([kept, entry_kept], dim=1)
    s = torch.einsum("thd,tkd->thk", q.float(), keys.float()) * scale
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sinks.view(1, -1, 1))
    e = torch.exp(s - m)
    p = e / (e.sum(dim=-1, keepdim=True) + torch.exp(sinks.view(1, -1, 1) - m))
    return torch.einsum("thk,tkd->thd", p.to(keys.dtype), keys)
