"""Pure-PyTorch references for ``pagoda.kernels.fused_moe`` (no Triton needed), same signatures.

``fused_experts`` is grouped by expert, as an efficient CPU path would be: the assignments are
sorted by expert once, each expert that has tokens runs one gate/up matmul and one down matmul
over all of its rows, and the weighted rows land at their assignment's index; there is no
per-token Python loop. Rounding points follow the kernel (fp32 products rounded once per
matmul; gate and up rounded to the input dtype before SiLU-and-mul). One difference: the down
projection is rounded to the dtype before the routing weight multiplies it (the kernel weighs
its fp32 accumulator), under one ulp of the dtype.

The top-k outputs of a token are summed in slot order in fp32 rather than ``index_add_``-ed into
the output: on CUDA ``index_add_`` accumulates with atomics in the dtype, in an order that
changes run to run, and this way a token's sum does not depend on the other tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's alignment, in torch: ``(sorted_ids, expert_ids, num_padded)`` laid out as
    ``pagoda.kernels.fused_moe.moe_align_block_size`` returns them (tests compare them)."""
    ids = topk_ids.reshape(-1).long()
    num_assign = ids.numel()
    slots = -(-(num_assign + min(num_experts, num_assign) * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    padded = (counts + block_m - 1) // block_m * block_m
    first = torch.cumsum(padded, 0) - padded  # each expert's first slot
    order = torch.argsort(ids, stable=True)  # by expert, index order within one
    rank = (
        torch.arange(num_assign, device=ids.device) - (torch.cumsum(counts, 0) - counts)[ids[order]]
    )
    sorted_ids = torch.full((slots,), num_assign, dtype=torch.int32, device=ids.device)
    sorted_ids[first[ids[order]] + rank] = order.to(torch.int32)
    ends = torch.cumsum(padded, 0)
    starts = torch.arange(0, slots, block_m, device=ids.device)
    expert_ids = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    expert_ids[expert_ids >= num_experts] = -1
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def swiglu_oai_ref(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float):
    """gpt-oss's expert activation: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g)``,
    ``g = min(gate, limit)``."""
    g = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * g * torch.sigmoid(alpha * g)


def silu_limit_ref(gate: torch.Tensor, up: torch.Tensor, limit: float):
    """HY V4's routed experts' activation: ``silu(min(gate, limit)) * clamp(up, -limit, limit)``."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def fused_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    config: dict | None = None,
    batch_invariant: bool = True,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
    none_ids: bool = False,
) -> torch.Tensor:
    """``sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))``, ``e = ids[t, j]``; ``[T, K]``
    in ``hidden_states``' dtype. ``config`` and ``batch_invariant`` are launch hints (ignored).
    ``none_ids``: an id of -1 picks no expert, its slot adds nothing."""
    del config, batch_invariant
    if activation not in ("silu", "swiglu_oai", "silu_limit"):
        raise ValueError(f"activation {activation!r} is not supported; choose from "
                         "('silu', 'swiglu_oai', 'silu_limit')")  # fmt: skip
    T, K = hidden_states.shape
    E = w2.shape[0]
    top_k = topk_ids.shape[1]
    dtype = hidden_states.dtype
    ids = topk_ids.reshape(-1).long()
    weights = topk_weights.reshape(-1).float()
    order = torch.argsort(ids, stable=True)  # assignments grouped by expert (-1's first)
    none = int((ids < 0).sum()) if none_ids else 0
    counts = torch.bincount(ids[ids >= 0], minlength=E).tolist()  # one host read per call
    rows = torch.zeros((T * top_k, K), dtype=dtype, device=hidden_states.device)
    start = none
    for e, n in enumerate(counts):
        if n == 0:
            continue
        sel = order[start : start + n]
        start += n
        x = hidden_states[sel // top_k]
        gate_up = F.linear(x, w13[e])  # rounded to the dtype, as stored
        if w13_bias is not None:
            gate_up = gate_up + w13_bias[e]
        gate, up = gate_up.chunk(2, dim=-1)
        if activation == "swiglu_oai":
            h = swiglu_oai_ref(gate.float(), up.float(), alpha, limit).to(dtype)
        elif activation == "silu_limit":
            h = silu_limit_ref(gate.float(), up.float(), limit).to(dtype)
        else:
            h = (F.silu(gate.float()) * up.float()).to(dtype)
        y = F.linear(h, w2[e])
        if w2_bias is not None:
            y = y + w2_bias[e]
        y = y.float() * weights[sel, None]
        rows[sel] = y.to(dtype)
    return rows.view(T, top_k, K).float().sum(dim=1).to(dtype)
