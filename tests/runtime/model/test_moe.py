"""The mixture-of-experts layer's CPU path and the fused kernel's torch reference.

The reference (`kernels.reference.fused_experts`) against a per-token float64 loop, with
routings that leave most experts without tokens (E = 8, 60, 128; top-k 1, 2, 8); the engine's
CPU layer (`moe.SparseMoE`: packed `Linear`s per expert) against the reference, and a token's
output bit for bit the same whatever other tokens share the call.
"""

from __future__ import annotations

import functools

import pytest
import torch
from pagoda.kernels import reference
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.ops import TORCH_OPS


def _weights(e: int, n: int, k: int, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, 2 * n, k, generator=g) / k**0.5).to(dtype)
    w2 = (torch.randn(e, k, n, generator=g) / n**0.5).to(dtype)
    return w13, w2


def _routing(t: int, e: int, top_k: int, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(t, e, generator=g), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).float(), ids.to(torch.int32)


def _token_loop(x, w13, w2, tw, ti, act):
    n, out = w13.shape[1] // 2, torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            h = w13[e].double() @ x[t].double()
            out[t] += float(tw[t, j]) * (w2[e].double() @ (act(h[:n]) * h[n:]))
    return out


@pytest.mark.parametrize(("experts", "top_k"), [(8, 1), (60, 2), (128, 8)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_reference_matches_a_token_loop_with_empty_experts(experts, top_k, activation):
    t, n, k = 6, 32, 48
    x = torch.randn(t, k)
    w13, w2 = _weights(experts, n, k)
    tw, ti = _routing(t, experts, top_k)
    assert len(set(ti.flatten().tolist())) < experts  # some experts get no token
    act = (
        torch.nn.functional.silu
        if activation == "silu"
        else functools.partial(torch.nn.functional.gelu, approximate="tanh")
    )
    got = reference.fused_experts(x, w13, w2, tw, ti, activation=activation)
    want = _token_loop(x, w13, w2, tw, ti, act)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def _layer(w13, w2, top_k: int, dtype) -> SparseMoE:
    """A SparseMoE over these experts with a random router, on the CPU path."""
    ctx = LayerContext(
        ops=TORCH_OPS, backend=None, rms_norm=TORCH_OPS.rms_norm,
        act_and_mul=TORCH_OPS.silu_and_mul, linear=Linear, eps=1e-6, num_heads=1,
        num_kv_heads=1, head_dim=1,
    )  # fmt: skip
    e, k = w13.shape[0], w13.shape[2]
    router = Linear(torch.randn(e, k, generator=torch.Generator().manual_seed(3)).to(dtype))
    experts = [(Linear(w13[i].clone()), Linear(w2[i].clone())) for i in range(e)]
    return SparseMoE(ctx, router, experts, None, None, top_k, True, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("experts", "top_k"), [(8, 1), (60, 2), (16, 8)])
def test_cpu_layer_matches_reference_and_rows_do_not_depend_on_the_batch(dtype, experts, top_k):
    t, n, k = 40, 32, 64
    w13, w2 = _weights(experts, n, k, dtype)
    layer = _layer(w13, w2, top_k, dtype)
    x = torch.randn(t, k).to(dtype)
    full = layer(x)
    probs = torch.softmax(layer.router(x).float(), dim=-1)
    tw, ti = torch.topk(probs, top_k, dim=-1)
    tw = tw / tw.sum(-1, keepdim=True)
    want = reference.fused_experts(x, w13, w2, tw, ti.to(torch.int32))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(full.float(), want.float(), atol=tol, rtol=tol)
    for rows in ([7], [0, 1], list(range(3, 20)), list(range(t - 1, -1, -3))):
        part = layer(x[rows])  # these tokens alone, or among others, in another order
        assert torch.equal(part, full[rows]), f"rows {rows[:4]}... differ"
