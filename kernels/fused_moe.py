"""Fused mixture-of-experts MLP: the tokens of a batch through their top-k SwiGLU experts.

``fused_experts`` computes, for every token ``t``::

    out[t] = sum_j  w[t, j] * down_e( silu(gate_e(x[t])) * up_e(x[t]) ),   e = ids[t, j]

with ``w13[e]`` = gate rows ``0..N-1`` then up rows ``N..2N-1`` (vLLM's layout) and ``w2[e]`` the
down projection. The design is vLLM's ``fused_moe``, in three launches plus the output sum:

1. ``moe_align_block_size`` (one Triton program per expert): the ``T * top_k`` (token, slot)
   assignments sorted by expert (stable: token order within an expert), each expert's run padded
   to a multiple of ``BLOCK_M``, and the expert of every ``BLOCK_M`` block. Blocks past the last
   expert get expert -1; an id of -1 (no expert: `none_ids`) is left out. Every size is a static bound from host ints (``T * top_k +
   min(E, T * top_k) * (BLOCK_M - 1)`` slots), nothing is read back: no host sync, so it runs
   inside CUDA graphs, and empty experts cost nothing.
2. One grouped GEMM over those blocks for ``w13``: a program multiplies ``BLOCK_M`` rows of one
   expert by a ``BLOCK_N`` slice of its gate rows and the matching up rows (two fp32
   accumulators) and applies SiLU-and-mul in the epilogue, so the ``[A, 2N]`` gate/up output is
   never stored. Padding rows are masked; blocks of expert -1 exit at once.
3. The same kernel for ``w2`` over the ``[A, N]`` activations, the routing weight multiplied
   into the fp32 accumulator; each assignment's row lands at its own index.
4. A sum over the top-k slots per token, ``j = 0 .. top_k - 1`` in order, in fp32; with
   ``none_ids`` a slot whose id is -1 adds nothing (LongCat-Flash's zero-computation experts:
   such a pick costs no GEMM row, `model/longcat_flash.py`).

Numerics (and the torch reference's, ``fused_moe_reference``): products accumulate in fp32;
gate and up are rounded to the input dtype before SiLU-and-mul (as if stored, as the dense
MLP's ``silu_and_mul`` sees them); the activation is rounded once; the weighted expert output is
rounded once; the top-k sum is fp32, rounded once.

**Batch invariance.** A token's result does not depend on the rest of the batch, for a fixed
launch config: each of its rows is reduced over K from 0 in ``BLOCK_K`` steps into its own fp32
accumulator, whatever block, expert run or tile position the alignment gave it (other rows in
the tile only share the weight tile; padding rows are zeros that never reach a valid row), the
epilogues are per element, and the top-k sum adds the slots in a fixed order (no atomics, no
``index_add_``). What remains is the config itself: with ``batch_invariant=True`` (the default,
as the engine's ``--batch-invariant``) it is chosen from the expert shape alone (the
``INVARIANT_TOKENS`` bucket), like ``linear``'s, so the tile sizes, hence the K order and the
tensor-core instruction, are the same at every batch size. With ``batch_invariant=False`` the
config follows the batch's token count (vLLM's rule), which is faster at the extremes but lets a
GPU pick another MMA shape for another batch size. ``tests/kernels/test_fused_moe.py`` checks a
token's bits alone, among others and in several batch compositions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import cdiv, check_device, fit_stages, next_pow2
from pagoda.kernels.attn_common import dot_precision, mma
from pagoda.kernels.config import get_kernel_config
from pagoda.kernels.config_schema import check_launch_config

FUSED_MOE = "fused_moe"  # the kernel's name in configs/*.json
# The token-count bucket every batch uses in batch-invariant mode: a full decode batch, the most
# common step under load (`pagoda tune` times this bucket's candidates at the decode batch and
# at the prefill chunk, as for the matmuls).
INVARIANT_TOKENS = 256
# SwiGLU; gpt-oss's clamped one (`swiglu_oai_ref`); SwiGLU with gate <= limit, |up| <= limit
# (HY V4's routed experts: `silu_limit_ref`)
ACTIVATIONS = ("silu", "swiglu_oai", "silu_limit")
ALIGN_CHUNK = 1024  # assignments one align program reads per step


def moe_config_shape(
    *, num_experts: int, intermediate: int, hidden: int, dtype: torch.dtype, num_tokens: int
) -> dict[str, int]:
    """The lookup key of a ``fused_moe`` bucket in ``configs/*.json``."""
    return {
        "experts": num_experts,
        "intermediate": intermediate,
        "hidden": hidden,
        "itemsize": dtype.itemsize,
        "tokens": max(int(num_tokens), 1),
    }


def get_moe_config(
    *,
    num_experts: int,
    intermediate: int,
    hidden: int,
    dtype: torch.dtype,
    num_tokens: int,
    device: torch.device | str | None,
    batch_invariant: bool = True,
) -> dict:
    """The launch config for one expert shape: nearest bucket of the device file (then of
    ``default.json``); ``batch_invariant`` keys every batch on ``INVARIANT_TOKENS``."""
    tokens = INVARIANT_TOKENS if batch_invariant else num_tokens
    shape = moe_config_shape(
        num_experts=num_experts, intermediate=intermediate, hidden=hidden, dtype=dtype,
        num_tokens=tokens,
    )  # fmt: skip
    return get_kernel_config(FUSED_MOE, shape, device)


def max_padded_slots(num_assign: int, num_experts: int, block_m: int) -> int:
    """Slots of the aligned order: every assignment plus each non-empty expert's padding (at most
    ``min(E, A)`` experts have any), a multiple of ``block_m``. Host ints only."""
    return cdiv(num_assign + min(num_experts, num_assign) * (block_m - 1), block_m) * block_m


@triton.jit(do_not_specialize=["num_assign", "num_blocks"])
def _moe_align_kernel(
    topk_ids_ptr,  # [A] int32: the routing [T, top_k] flattened, A = T * top_k
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32 out: assignment index, or A on padding
    expert_ids_ptr,  # [num_blocks] int32 out: expert of each BLOCK_M block, -1 past the end
    num_padded_ptr,  # [1] int32 out: slots in use (a multiple of BLOCK_M)
    num_assign,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    BINS: tl.constexpr,  # power of two > num_experts, >= a warp: the last bin takes masked lanes
    CHUNK: tl.constexpr,
):
    e = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros([BINS], dtype=tl.int32)
    for start in range(0, num_assign, CHUNK):
        ids = tl.load(topk_ids_ptr + start + offs, mask=start + offs < num_assign, other=BINS - 1)
        ids = tl.where(ids < 0, BINS - 1, ids)  # -1: no expert (the last bin is no expert's)
        counts += tl.histogram(ids, BINS)
    bins = tl.arange(0, BINS)
    counts = tl.where(bins < num_experts, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    first = tl.sum(tl.where(bins < e, padded, 0), axis=0)  # this expert's first slot
    mine = tl.sum(tl.where(bins == e, counts, 0), axis=0)
    my_blocks = (mine + BLOCK_M - 1) // BLOCK_M

    seen = mine * 0
    for start in range(0, num_assign, CHUNK):  # this expert's assignments, in index order
        idx = start + offs
        hit = (tl.load(topk_ids_ptr + idx, mask=idx < num_assign, other=-1) == e).to(tl.int32)
        rank = seen + tl.cumsum(hit, 0) - 1
        tl.store(sorted_ids_ptr + first + rank, idx, mask=hit > 0)
        seen += tl.sum(hit, axis=0)
    pad = tl.arange(0, BLOCK_M)
    tl.store(sorted_ids_ptr + first + mine + pad, num_assign, mask=pad < my_blocks * BLOCK_M - mine)
    for b in range(0, my_blocks, CHUNK):
        blk = b + offs
        tl.store(expert_ids_ptr + first // BLOCK_M + blk, e + blk * 0, mask=blk < my_blocks)

    if e == 0:  # the tail: no expert, no assignment
        total = tl.sum(padded, axis=0)
        tl.store(num_padded_ptr, total)
        for b in range(total // BLOCK_M, num_blocks, CHUNK):
            blk = b + offs
            tl.store(expert_ids_ptr + blk, blk * 0 - 1, mask=blk < num_blocks)
        for s in range(total, num_blocks * BLOCK_M, CHUNK):
            slot = s + offs
            tl.store(sorted_ids_ptr + slot, slot * 0 + num_assign, mask=slot < num_blocks * BLOCK_M)


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) assignments by expert, each expert padded to ``block_m`` rows.

    ``topk_ids`` ``[T, top_k]`` (values in ``[0, num_experts)``, or -1 for no expert: left
    out; not checked on the device).
    Returns ``sorted_ids`` int32 ``[S]`` (assignment index ``t * top_k + j`` in expert order,
    ``T * top_k`` on padding and past the end), ``expert_ids`` int32 ``[S // block_m]`` (-1 past
    the end) and ``num_padded`` int32 ``[1]``; ``S = max_padded_slots(...)``.
    """
    check_device(topk_ids)
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    ids = ids.contiguous()
    num_assign = ids.numel()
    slots = max_padded_slots(num_assign, num_experts, block_m)
    num_blocks = slots // block_m
    if num_assign == 0:
        empty = torch.empty((0,), dtype=torch.int32, device=ids.device)
        return empty, empty, torch.zeros((1,), dtype=torch.int32, device=ids.device)
    sorted_ids = torch.empty((slots,), dtype=torch.int32, device=ids.device)
    expert_ids = torch.empty((num_blocks,), dtype=torch.int32, device=ids.device)
    num_padded = torch.empty((1,), dtype=torch.int32, device=ids.device)
    _moe_align_kernel[(num_experts,)](
        ids, sorted_ids, expert_ids, num_padded, num_assign, num_experts, num_blocks,
        BLOCK_M=block_m, BINS=max(next_pow2(num_experts + 1), 64), CHUNK=ALIGN_CHUNK,
    )  # fmt: skip
    return sorted_ids, expert_ids, num_padded


@triton.jit(do_not_specialize=["num_assign", "num_blocks"])
def _moe_gemm_kernel(
    a_ptr,  # [rows, K]: the tokens [T, K] (w13 pass) or the activations [A, K] (w2 pass)
    w_ptr,  # [E, N or 2N, K]
    c_ptr,  # [A, N]: one row per assignment
    topk_weights_ptr,  # [A] float32
    sorted_ids_ptr,  # [num_blocks * BLOCK_M] int32
    expert_ids_ptr,  # [num_blocks] int32
    num_assign,
    num_blocks,
    N,
    K,
    up_offset,  # N * stride_wn: from a gate row to its up row
    stride_am,
    stride_we,
    stride_wn,
    stride_cm,
    bias_ptr,  # [E, N or 2N] the experts' biases, read when HAS_BIAS
    stride_be,
    alpha,  # swiglu_oai's sigmoid gain and clamp
    limit,
    ROWS_PER_A: tl.constexpr,  # assignments per row of a: top_k for the tokens, else 1
    GATED: tl.constexpr,  # w holds gate rows then up rows: write act(gate) * up
    MUL_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,  # + the expert's bias (gate's and up's: N apart), as stored
    SWIGLU_OAI: tl.constexpr,  # GATED's activation: gpt-oss's clamped SwiGLU, not silu
    SILU_LIMIT: tl.constexpr,  # GATED's silu with gate and up clamped to `limit` (HY V4's)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert < 0:  # past the last expert's padding
        return

    assign = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    row_mask = assign < num_assign
    rows = (assign // ROWS_PER_A).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = (
        w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn
        + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]  # fmt: skip
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & n_mask[None, :]
        acc += mma(a, tl.load(w_ptrs, mask=w_mask, other=0.0), DOT_PRECISION)
        if GATED:
            acc_up += mma(a, tl.load(w_ptrs + up_offset, mask=w_mask, other=0.0), DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    out_ty = c_ptr.dtype.element_ty
    if HAS_BIAS:  # the product rounded as stored, then + bias rounded (x @ W + b, two ops)
        b_ptrs = bias_ptr + expert.to(tl.int64) * stride_be + offs_n
        bias = tl.load(b_ptrs, mask=n_mask, other=0.0).to(tl.float32)
        acc = (acc.to(out_ty).to(tl.float32) + bias).to(out_ty).to(tl.float32)
        if GATED:
            bias_up = tl.load(b_ptrs + N, mask=n_mask, other=0.0).to(tl.float32)
            acc_up = (acc_up.to(out_ty).to(tl.float32) + bias_up).to(out_ty).to(tl.float32)
    if GATED:  # gate and up as stored values, then the activation in fp32 (module docstring)
        gate = acc.to(out_ty).to(tl.float32)
        up = acc_up.to(out_ty).to(tl.float32)
        if SWIGLU_OAI:  # (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g <= limit
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit) + 1.0
            acc = gate / (1.0 + tl.exp(-alpha * gate)) * up
        else:
            if SILU_LIMIT:  # silu(min(gate, limit)) * clamp(up, -limit, limit)
                gate = tl.minimum(gate, limit)
                up = tl.minimum(tl.maximum(up, -limit), limit)
            acc = gate / (1.0 + tl.exp(-gate)) * up
    if MUL_WEIGHT:
        acc = acc * tl.load(topk_weights_ptr + assign, mask=row_mask, other=0.0)[:, None]
    c_ptrs = c_ptr + assign[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(out_ty), mask=row_mask[:, None] & n_mask[None, :])


@triton.jit
def _moe_sum_kernel(
    x_ptr,  # [T, TOP_K, K] contiguous
    ids_ptr,  # [T, TOP_K] the routing (read with NONE_IDS only)
    out_ptr,  # [T, K]
    K,
    stride_out,
    TOP_K: tl.constexpr,
    BLOCK: tl.constexpr,
    NONE_IDS: tl.constexpr,  # a slot of id -1 adds nothing (its row was never written)
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):  # slot order: the same sum whatever else is in the batch
        row = tl.load(x_ptr + (t * TOP_K + j) * K + offs, mask=mask, other=0.0).to(tl.float32)
        if NONE_IDS:
            row = tl.where(tl.load(ids_ptr + t * TOP_K + j) >= 0, row, 0.0)
        acc += row
    tl.store(out_ptr + t * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _check_biases(w13, w2, w13_bias, w2_bias) -> None:
    for name, bias, want in (("w13_bias", w13_bias, w13.shape[:2]),
                             ("w2_bias", w2_bias, w2.shape[:2])):  # fmt: skip
        if bias is not None and (bias.shape != want or not bias.is_contiguous()):
            raise ValueError(f"{name} must be contiguous {list(want)}, got {list(bias.shape)}")


def _validate(x, w13, w2, topk_weights, topk_ids, activation: str, none_ids: bool) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not supported; choose from {ACTIVATIONS}")
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"expected hidden_states [T, K], w13 [E, 2N, K], w2 [E, K, N]; got "
            f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}"
        )
    (E, two_n, K), N = w13.shape, w2.shape[2]
    if two_n != 2 * N or w2.shape[:2] != (E, K) or x.shape[1] != K:
        raise ValueError(
            f"shapes do not fit: hidden_states {tuple(x.shape)}, w13 {tuple(w13.shape)} (want "
            f"[E, 2N, K]), w2 {tuple(w2.shape)} (want [E, K, N])"
        )
    if not x.dtype == w13.dtype == w2.dtype or x.dtype not in (
        torch.float16, torch.bfloat16, torch.float32,
    ):  # fmt: skip
        raise ValueError(f"hidden_states/w13/w2 must share a float dtype: {x.dtype}, "
                         f"{w13.dtype}, {w2.dtype}")  # fmt: skip
    if x.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("the K dimension of hidden_states and the weights must be contiguous")
    if (
        topk_ids.dim() != 2
        or topk_ids.shape != topk_weights.shape
        or topk_ids.shape[0] != x.shape[0]
    ):
        raise ValueError(
            f"topk_weights and topk_ids must both be [T={x.shape[0]}, top_k]; got "
            f"{tuple(topk_weights.shape)}, {tuple(topk_ids.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_weights.is_floating_point():
        raise ValueError(f"topk_ids must be int32 (got {topk_ids.dtype}), topk_weights float32 "
                         f"(got {topk_weights.dtype})")  # fmt: skip
    top_k = topk_ids.shape[1]
    if top_k < 1 or (top_k > E and not none_ids):  # (none_ids: picks of no expert beside E)
        raise ValueError(f"top_k must be in [1, E={E}], got {top_k}")


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
    """The MoE MLP of a batch: ``[T, K]`` in ``hidden_states``' dtype (module docstring).

    ``hidden_states`` ``[T, K]``; ``w13`` ``[E, 2N, K]`` (gate rows, then up rows); ``w2``
    ``[E, K, N]``; ``topk_weights`` float32 and ``topk_ids`` int32, both ``[T, top_k]``, ids in
    ``[0, E)`` (not checked on the device: that would need a host sync). ``config`` overrides
    the launch config (tuning sweeps); any fixed config is batch-invariant. Shapes and host ints
    only: graph-capturable. gpt-oss's experts: ``w13_bias`` ``[E, 2N]`` and ``w2_bias``
    ``[E, K]`` added to each product (rounded as stored, before the activation and the routing
    weight), ``activation="swiglu_oai"`` with ``alpha`` and ``limit``
    (`fused_moe_reference.swiglu_oai_ref`); HY V4's: ``activation="silu_limit"`` with ``limit``
    (`fused_moe_reference.silu_limit_ref`). ``none_ids``: ids may also be -1, a slot that picks
    no expert and adds nothing (LongCat-Flash's zero-computation experts).
    """
    _validate(hidden_states, w13, w2, topk_weights, topk_ids, activation, none_ids)
    _check_biases(w13, w2, w13_bias, w2_bias)
    biases = [b for b in (w13_bias, w2_bias) if b is not None]
    device = check_device(hidden_states, w13, w2, topk_weights, topk_ids, *biases)
    (T, K), (E, N) = hidden_states.shape, (w2.shape[0], w2.shape[2])
    top_k = topk_ids.shape[1]
    out = torch.empty((T, K), dtype=hidden_states.dtype, device=device)
    if T == 0:
        return out
    if config is not None:
        check_launch_config(FUSED_MOE, config)
    cfg = config or get_moe_config(
        num_experts=E, intermediate=N, hidden=K, dtype=hidden_states.dtype, num_tokens=T,
        device=device, batch_invariant=batch_invariant,
    )  # fmt: skip
    bm = max(int(cfg["BLOCK_M"]), 16)  # tl.dot needs 16 rows
    sorted_ids, expert_ids, _ = moe_align_block_size(topk_ids, E, bm)
    num_assign, num_blocks = T * top_k, expert_ids.shape[0]
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    act = torch.empty((num_assign, N), dtype=hidden_states.dtype, device=device)
    # top_k == 1: one row per token, the w2 pass writes the output directly (not with
    # none_ids: a row of no expert is never written, the sum reads it as zeros)
    direct = top_k == 1 and not none_ids
    rows = out if direct else torch.empty((num_assign, K), dtype=out.dtype, device=device)
    common = dict(
        BLOCK_M=bm, GROUP_M=int(cfg["GROUP_M"]), DOT_PRECISION=dot_precision(out.dtype),
        num_warps=int(cfg["num_warps"]),
    )  # fmt: skip
    passes = (  # (a, w, c, rows per a, gated, weighted, output width, reduction width, bias)
        (hidden_states, w13, act, top_k, True, False, N, K, w13_bias),
        (act, w2, rows, 1, False, True, K, N, w2_bias),
    )
    # stages Triton keeps out of shared memory (measured on sm_90): one in float32, none in
    # 16-bit (its wgmma pipeline holds every stage's tiles: 4 stages of a 64x256x64 gated tile,
    # 295 kB, did not fit an H100)
    held = 1 if hidden_states.dtype == torch.float32 else 0
    for a, w, c, per_a, gated, weighted, n_out, k_in, bias in passes:
        bn = min(int(cfg["BLOCK_N"]), max(next_pow2(n_out), 16))
        bk = min(int(cfg["BLOCK_K"]), max(next_pow2(k_in), 16))  # from shapes only
        stage_bytes = (bm + (2 if gated else 1) * bn) * bk * a.element_size()  # gate+up tiles
        _moe_gemm_kernel[(num_blocks * triton.cdiv(n_out, bn),)](
            a, w, c, weights, sorted_ids, expert_ids, num_assign, num_blocks, n_out, k_in,
            n_out * w.stride(1), a.stride(0), w.stride(0), w.stride(1), c.stride(0),
            weights if bias is None else bias, 0 if bias is None else bias.stride(0),
            float(alpha), float(limit),
            ROWS_PER_A=per_a, GATED=gated, MUL_WEIGHT=weighted, HAS_BIAS=bias is not None,
            SWIGLU_OAI=activation == "swiglu_oai", SILU_LIMIT=activation == "silu_limit",
            BLOCK_N=bn, BLOCK_K=bk,
            num_stages=fit_stages(int(cfg["num_stages"]), stage_bytes, device, unbuffered=held),
            **common,
        )  # fmt: skip
    if not direct:
        block = min(1024, next_pow2(K))
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        _moe_sum_kernel[(T, triton.cdiv(K, block))](
            rows, ids, out, K, out.stride(0), TOP_K=top_k, BLOCK=block, NONE_IDS=none_ids,
            num_warps=4,
        )  # fmt: skip
    return out
