"""The fused-MoE kernel: against its torch reference (and the reference against a float64
per-token loop), the expert alignment's invariants, batch invariance, the config lookup.

Tiny K/N keep the interpreter fast; E = 8, 60, 128 and top-k 1, 2, 8 with random routing (so
experts go empty at small T) and routing squeezed onto a few experts (runs of several blocks).
On CUDA (marked gpu) the same comparisons run compiled, plus Qwen3-30B-A3B's expert shape for
invariance and CUDA-graph capture.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL
from pagoda.kernels import fused_moe_reference as reference
from pagoda.kernels.config import KernelConfigError, clear_config_cache, save_kernel_config

K, N = 32, 24  # hidden, expert FFN width: neither a multiple of the tiles


def _inputs(T, E, top_k, dtype, device, *, experts=None, k=K, n=N, seed=0):
    """Random tokens, weights and top-k routing; ``experts``: route only to these."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor(experts if experts is not None else range(E))
    scores = torch.rand((T, len(pool)), generator=gen)
    ids = pool[scores.topk(top_k, dim=1).indices].to(torch.int32)
    return {
        "hidden_states": torch.randn((T, k), generator=gen).to(device, dtype),
        "w13": (torch.randn((E, 2 * n, k), generator=gen) / k**0.5).to(device, dtype),
        "w2": (torch.randn((E, k, n), generator=gen) / n**0.5).to(device, dtype),
        "topk_weights": torch.rand((T, top_k), generator=gen).softmax(-1).to(device),
        "topk_ids": ids.to(device),
    }


def _naive(hidden_states, w13, w2, topk_weights, topk_ids):
    """One token and slot at a time, float64, no rounding: the definition."""
    x, w13, w2 = hidden_states.double(), w13.double(), w2.double()
    n = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gu = w13[e] @ x[t]
            h = torch.nn.functional.silu(gu[:n]) * gu[n:]
            out[t] += float(topk_weights[t, j]) * (w2[e] @ h)
    return out


CASES = [  # (E, top_k, T, experts the routing may use)
    (8, 1, 1, None),
    (8, 2, 33, None),
    (60, 8, 13, None),  # most experts empty
    (60, 2, 24, [3, 7, 59]),  # 48 assignments on 3 experts: runs of several blocks
    (128, 8, 40, None),
    (128, 1, 7, None),
]


@pytest.mark.parametrize("E,top_k,T,experts", CASES)
def test_reference_matches_a_float64_loop(E, top_k, T, experts):
    args = _inputs(T, E, top_k, torch.float32, "cpu", experts=experts)
    got = reference.fused_experts(**args)
    assert got.dtype == torch.float32 and got.shape == (T, K)
    torch.testing.assert_close(got.double(), _naive(**args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("E,top_k,T,experts", CASES)
def test_kernel_matches_reference(device, dtype, E, top_k, T, experts):
    from pagoda.kernels import fused_experts

    args = _inputs(T, E, top_k, dtype, device, experts=experts)
    got = fused_experts(**args)
    assert got.dtype == dtype and got.shape == (T, K)
    want = reference.fused_experts(**args)
    # one bf16 ulp: the interpreter truncates fp32 -> bf16 where the reference rounds
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernel_matches_reference_over_several_tiles(device, dtype):
    """K = 160 and N = 80: several K steps of 64 with a masked tail in both GEMMs, several N
    tiles; 72 assignments over 16 experts."""
    from pagoda.kernels import fused_experts

    args = _inputs(24, 16, 3, dtype, device, k=160, n=80)
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=2, num_warps=4, num_stages=2)
    got = fused_experts(**args, config=cfg)
    torch.testing.assert_close(got.float(), reference.fused_experts(**args).float(), **TOL[dtype])


def test_kernel_handles_int64_ids_and_no_tokens(device):
    from pagoda.kernels import fused_experts

    args = _inputs(5, 8, 2, torch.float32, device)
    want = fused_experts(**args)
    args["topk_ids"] = args["topk_ids"].long()  # as torch.topk returns them
    assert torch.equal(fused_experts(**args), want)
    empty = {k: (v[:0] if k not in ("w13", "w2") else v) for k, v in args.items()}
    assert fused_experts(**empty).shape == (0, K)


def test_none_ids_pick_no_expert(device):
    """``none_ids``: a slot of id -1 (LongCat-Flash's zero-computation experts) adds nothing
    and costs no GEMM row: the same as its weight zeroed on a real expert; a token whose every
    slot is -1 gets zeros (as top_k 1 would)."""
    from pagoda.kernels import fused_experts

    args = _inputs(5, 4, 2, torch.float32, device)
    none = torch.zeros_like(args["topk_ids"], dtype=torch.bool)
    none[::2, 0] = True  # every other token's first pick: no expert
    none[3] = True  # token 3: none at all
    zeroed = dict(args, topk_weights=args["topk_weights"].masked_fill(none, 0.0))
    args["topk_ids"] = args["topk_ids"].masked_fill(none, -1)
    got = fused_experts(**args, none_ids=True)
    torch.testing.assert_close(got, reference.fused_experts(**zeroed), **TOL[torch.float32])
    torch.testing.assert_close(reference.fused_experts(**args, none_ids=True), got,
                               **TOL[torch.float32])  # fmt: skip
    assert not got[3].any()


def _check_alignment(ids: torch.Tensor, E: int, bm: int, sorted_ids, expert_ids, num_padded):
    """What the GEMM relies on, stated directly."""
    from pagoda.kernels.fused_moe import max_padded_slots

    flat = ids.reshape(-1).long().cpu()
    A = flat.numel()
    sorted_ids, expert_ids = sorted_ids.long().cpu(), expert_ids.long().cpu()
    total = int(num_padded)
    assert sorted_ids.numel() == max_padded_slots(A, E, bm) == expert_ids.numel() * bm
    counts = torch.bincount(flat, minlength=E)
    assert total == int(((counts + bm - 1) // bm * bm).sum()) and total % bm == 0
    used, tail = sorted_ids[:total], sorted_ids[total:]
    assert (tail == A).all() and (expert_ids[total // bm :] == -1).all()
    real = used[used < A]
    assert torch.equal(real.sort().values, torch.arange(A))  # every assignment exactly once
    blocks = used.view(-1, bm)
    assert (expert_ids[: total // bm] >= 0).all()
    assert torch.equal(expert_ids[: total // bm].sort().values, expert_ids[: total // bm])
    for b, e in enumerate(expert_ids[: total // bm].tolist()):
        rows = blocks[b][blocks[b] < A]
        assert rows.numel() > 0 and (flat[rows] == e).all()  # no block is all padding
        assert torch.equal(rows, rows.sort().values)  # token order within an expert
    assert set(expert_ids[: total // bm].tolist()) == set(flat.tolist())  # empty experts: none


@pytest.mark.parametrize(
    "E,top_k,T,bm",
    [(8, 2, 1, 16), (60, 8, 13, 16), (128, 8, 40, 64), (8, 2, 600, 16), (4, 1, 33, 16)],
)
def test_alignment_invariants_and_reference(device, E, top_k, T, bm):
    """(8, 2, 600): 1,200 assignments, more than one chunk of the align kernel's loop."""
    from pagoda.kernels.fused_moe import moe_align_block_size

    ids = _inputs(T, E, top_k, torch.float32, device, k=16, n=16)["topk_ids"]
    got = moe_align_block_size(ids, E, bm)
    _check_alignment(ids, E, bm, *got)
    want = reference.moe_align_block_size(ids.cpu(), E, bm)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.cpu(), w)


@pytest.mark.usefixtures("row_independent_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_tokens_bits_do_not_depend_on_the_batch(device, dtype):
    """The last tokens' rows, alone, among 40 tokens, and with their routing shared by many
    others (longer runs, other block positions), all give the same bits."""
    from pagoda.kernels import fused_experts

    E, top_k = 16, 4
    args = _inputs(40, E, top_k, dtype, device)
    full = fused_experts(**args)

    def part(sel):
        return fused_experts(
            **{k: (v[sel] if k not in ("w13", "w2") else v) for k, v in args.items()}
        )

    assert torch.equal(part(slice(-3, None)), full[-3:])
    assert torch.equal(part(slice(-1, None)), full[-1:])
    crowd = part(torch.cat([torch.arange(40), torch.full((20,), 39)]))  # token 39 21 times
    assert torch.equal(crowd[:40], full) and torch.equal(crowd[40:], full[39:].expand(20, -1))
    reordered = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    assert torch.equal(part(reordered), full[reordered])


def test_config_lookup_invariant_and_by_tokens(tmp_path, monkeypatch):
    from pagoda.kernels import config as kc
    from pagoda.kernels.fused_moe import INVARIANT_TOKENS, get_moe_config, moe_config_shape

    shape = dict(num_experts=128, intermediate=768, hidden=2048, dtype=torch.bfloat16)
    fixed = [get_moe_config(**shape, num_tokens=t, device="default") for t in (1, 256, 8192)]
    assert fixed[0] == fixed[1] == fixed[2]  # batch-invariant: one config for every T
    small, large = (
        get_moe_config(**shape, num_tokens=t, device="default", batch_invariant=False)
        for t in (1, 8192)
    )
    assert small["BLOCK_M"] < large["BLOCK_M"]  # by token count: vLLM's rule
    assert moe_config_shape(**shape, num_tokens=0)["tokens"] == 1 and shape["dtype"].itemsize == 2

    monkeypatch.setenv(kc.CONFIG_DIR_ENV, str(tmp_path))
    clear_config_cache()
    try:
        tuned = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_warps=2, num_stages=2)
        key = moe_config_shape(**shape, num_tokens=INVARIANT_TOKENS)
        save_kernel_config("fused_moe", key, tuned, device="Test GPU", directory=tmp_path)
        for t in (1, 4096):  # nearest bucket: a 60-expert Qwen1.5-MoE-ish shape still takes it
            got = get_moe_config(**{**shape, "num_experts": 60}, num_tokens=t, device="Test GPU")
            assert got == tuned
        assert get_moe_config(**shape, num_tokens=1, device="Other GPU") == fixed[0]
    finally:
        clear_config_cache()


def test_config_override_is_used(device):
    from pagoda.kernels import fused_experts

    args = _inputs(9, 8, 2, torch.float32, device)
    cfg = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=2)
    torch.testing.assert_close(
        fused_experts(**args, config=cfg), reference.fused_experts(**args), **TOL[torch.float32]
    )
    with pytest.raises(KernelConfigError, match="lacks BLOCK_N"):
        fused_experts(**args, config={"BLOCK_M": 16})


def test_bad_input_is_refused(device):
    from pagoda.kernels import fused_experts

    args = _inputs(3, 8, 2, torch.float32, device)
    bad = [
        ({"activation": "gelu"}, "not supported"),
        ({"w2": args["w2"][:, :, :-1]}, "do not fit"),
        ({"hidden_states": args["hidden_states"].bfloat16()}, "share a float dtype"),
        ({"topk_ids": args["topk_ids"][:, :1]}, "both be"),
        ({"topk_ids": args["topk_ids"].float()}, "must be int32"),
        ({"hidden_states": args["hidden_states"].T.contiguous().T}, "contiguous"),
    ]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            fused_experts(**{**args, **change})
    with pytest.raises(ValueError, match="top_k"):
        fused_experts(**_inputs(2, 8, 2, torch.float32, device, experts=[0, 1]) | {
            "topk_ids": torch.zeros((2, 9), dtype=torch.int32, device=device),
            "topk_weights": torch.zeros((2, 9), device=device),
        })  # fmt: skip


QWEN3_30B = dict(E=128, top_k=8, k=2048, n=768)


@pytest.mark.gpu
def test_model_sized_rows_are_invariant_and_graph_capturable(device):
    """Qwen3-30B-A3B's experts, compiled: a token's bits at every batch size the engine runs
    (decode, a graph-padded size, prefill chunks), and the launch inside a CUDA graph with
    host syncs turned into errors."""
    if device.type != "cuda":
        pytest.skip("model-sized shapes need a GPU")
    from pagoda.kernels import fused_experts

    E, top_k, k, n = QWEN3_30B.values()
    args = _inputs(2048, E, top_k, torch.bfloat16, device, k=k, n=n)
    full = fused_experts(**args)
    want = reference.fused_experts(**args)
    torch.testing.assert_close(full.float(), want.float(), **TOL[torch.bfloat16])
    for m in (1, 3, 64, 255, 256, 264):
        part = fused_experts(
            **{a: (v[-m:] if a not in ("w13", "w2") else v) for a, v in args.items()}
        )
        assert torch.equal(part, full[-m:]), f"rows differ at T={m}"

    small = {a: (v[:64] if a not in ("w13", "w2") else v) for a, v in args.items()}
    out = fused_experts(**small)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            captured = fused_experts(**small)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a in ("hidden_states", "topk_weights", "topk_ids"):  # another batch, same shapes
        small[a].copy_(args[a][64:128])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, full[64:128]) and not torch.equal(captured, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("E,top_k,T,experts", [(8, 2, 33, None), (60, 4, 13, None)])
def test_gpt_oss_biases_and_clamped_swiglu_match_reference(device, dtype, E, top_k, T, experts):
    """gpt-oss's experts: biases on both GEMMs, (clamp(up) + 1) * g * sigmoid(1.702 g) with g
    clamped at `limit` (low enough that both clamps bite); the reference against a float64
    loop of that definition, the kernel against the reference."""
    from pagoda.kernels import fused_experts

    args = _inputs(T, E, top_k, dtype, device, experts=experts)
    gen = torch.Generator().manual_seed(3)
    extra = dict(activation="swiglu_oai", alpha=1.702, limit=0.6,
                 w13_bias=torch.randn((E, 2 * N), generator=gen).to(device, dtype),
                 w2_bias=torch.randn((E, K), generator=gen).to(device, dtype))  # fmt: skip
    want = reference.fused_experts(**args, **extra)
    if dtype == torch.float32 and device.type == "cpu":
        x, w13, w2 = (args[n].double() for n in ("hidden_states", "w13", "w2"))
        b13, b2 = extra["w13_bias"].double(), extra["w2_bias"].double()
        naive = torch.zeros(x.shape, dtype=torch.float64)
        for t in range(T):
            for j in range(top_k):
                e = int(args["topk_ids"][t, j])
                gate, up = (w13[e] @ x[t] + b13[e]).chunk(2)
                g = gate.clamp(max=0.6)
                h = (up.clamp(-0.6, 0.6) + 1) * g * torch.sigmoid(1.702 * g)
                naive[t] += float(args["topk_weights"][t, j]) * (w2[e] @ h + b2[e])
        torch.testing.assert_close(want.double(), naive, atol=1e-5, rtol=1e-5)
    got = fused_experts(**args, **extra)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    assert not torch.allclose(want.float(), reference.fused_experts(**args).float(), **TOL[dtype])


def test_hy_v4_clamped_silu_matches_reference(device):
    """HY V4's routed experts: silu(min(gate, limit)) * clamp(up, -limit, limit), `limit` low
    enough that both clamps bite; the reference against a float64 loop of that definition, the
    kernel against the reference."""
    from pagoda.kernels import fused_experts

    T, E, top_k = 5, 4, 2
    args = _inputs(T, E, top_k, torch.float32, device)
    want = reference.fused_experts(**args, activation="silu_limit", limit=0.6)
    if device.type == "cpu":
        x, w13, w2 = (args[n].double() for n in ("hidden_states", "w13", "w2"))
        naive = torch.zeros(x.shape, dtype=torch.float64)
        for t in range(T):
            for j in range(top_k):
                e = int(args["topk_ids"][t, j])
                gate, up = (w13[e] @ x[t]).chunk(2)
                h = torch.nn.functional.silu(gate.clamp(max=0.6)) * up.clamp(-0.6, 0.6)
                naive[t] += float(args["topk_weights"][t, j]) * (w2[e] @ h)
        torch.testing.assert_close(want.double(), naive, atol=1e-5, rtol=1e-5)
    got = fused_experts(**args, activation="silu_limit", limit=0.6)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert not torch.allclose(want, reference.fused_experts(**args), **TOL[torch.float32])
