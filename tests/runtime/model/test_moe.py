"""The mixture-of-experts layer's CPU path (`moe.SparseMoE`: picks grouped by expert over packed
`Linear`s): against a per-token float64 loop with routings that leave most experts without
tokens (E = 8, 60, 128; top-k 1, 2, 8), against the fused kernel's torch reference, and a
token's output bit for bit the same whatever other tokens share the call."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import fused_moe_reference
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.ops import TORCH_OPS

CASES = [(8, 1), (60, 2), (128, 8)]


def _layer(experts: int, top_k: int, n: int, k: int, dtype, seed=0) -> SparseMoE:
    """A SparseMoE with random router and experts, on the CPU path; w13/w2 kept for checks."""
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(experts, 2 * n, k, generator=g) / k**0.5).to(dtype)
    w2 = (torch.randn(experts, k, n, generator=g) / n**0.5).to(dtype)
    ctx = LayerContext(
        ops=TORCH_OPS, backend=None, rms_norm=TORCH_OPS.rms_norm,
        act_and_mul=TORCH_OPS.silu_and_mul, linear=Linear, eps=1e-6, num_heads=1,
        num_kv_heads=1, head_dim=1,
    )  # fmt: skip
    router = Linear(torch.randn(experts, k, generator=g).to(dtype))
    pairs = [(Linear(w13[i].clone()), Linear(w2[i].clone())) for i in range(experts)]
    layer = SparseMoE(ctx, router, pairs, None, None, top_k, True, False)
    layer.w13_ref, layer.w2_ref = w13, w2
    return layer


def _routing(layer: SparseMoE, x: torch.Tensor):
    probs = torch.softmax(layer.router(x).float(), dim=-1)
    w, ids = torch.topk(probs, layer.top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


@pytest.mark.parametrize(("experts", "top_k"), CASES)
def test_cpu_layer_matches_a_token_loop_and_the_fused_reference(experts, top_k):
    t, n, k = 6, 32, 48
    layer = _layer(experts, top_k, n, k, torch.float32)
    x = torch.randn(t, k)
    got = layer(x)
    tw, ids = _routing(layer, x)
    assert len(set(ids.flatten().tolist())) < experts  # some experts get no token
    want = torch.zeros(t, k, dtype=torch.float64)
    for i in range(t):
        for j in range(top_k):
            e = int(ids[i, j])
            h = layer.w13_ref[e].double() @ x[i].double()
            act = torch.nn.functional.silu(h[:n]) * h[n:]
            want[i] += float(tw[i, j]) * (layer.w2_ref[e].double() @ act)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    fused = fused_moe_reference.fused_experts(
        x, layer.w13_ref, layer.w2_ref, tw.float(), ids.to(torch.int32)
    )
    torch.testing.assert_close(got, fused, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("experts", "top_k"), [*CASES, (16, 8)])
def test_cpu_layer_rows_do_not_depend_on_the_batch(dtype, experts, top_k):
    t, k = 40, 64
    layer = _layer(experts, top_k, 32, k, dtype)
    x = torch.randn(t, k).to(dtype)
    full = layer(x)
    for rows in ([7], [0, 1], list(range(3, 20)), list(range(t - 1, -1, -3))):
        part = layer(x[rows])  # these tokens alone, or among others, in another order
        assert torch.equal(part, full[rows]), f"rows {rows[:4]}... differ"
