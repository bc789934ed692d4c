"""The non-invariant Triton backend's prefill rows through torch SDPA (`sdpa_prefill`).

Each step goes through ``TritonAttentionBackend.forward`` with ``batch_invariant=False``: the
decode rows in the Triton decode kernel, the prompt rows in SDPA. The output must match the
kernels' reference for fresh prompts, chunks on cached context, mixed batches and GQA; with an
FP8 cache it must match the Triton kernel on the same step; window and softcap layers, and
decode-only steps, must not take the SDPA path.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL, make_batch, mixed_seqs
from pagoda.kernels import reference
from pagoda.runtime.attention import get_attention_backend, sdpa_prefill
from test_kernel_backend import _meta

HEADS, KV_HEADS, HEAD_DIM, BS = 6, 2, 32, 16  # GQA 3:1, tiny


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls = []
    real = sdpa_prefill.sdpa_prefill

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa_prefill, "sdpa_prefill", spy)
    return calls


def _run(batch, device, *, invariant=False, kv_heads=KV_HEADS, window=None, softcap=None,
         kv_scales=None, k_cache=None, v_cache=None):  # fmt: skip
    be = get_attention_backend(
        "triton", device, HEADS, kv_heads, HEAD_DIM, HEAD_DIM**-0.5, batch_invariant=invariant,
        kv_cache_dtype="fp8" if kv_scales else "auto", softcap=softcap,
    )  # fmt: skip
    k_cache = (batch.k_cache if k_cache is None else k_cache).clone()
    v_cache = (batch.v_cache if v_cache is None else v_cache).clone()
    meta = _meta(batch, BS)
    be.prepare(meta)
    out = be.forward(batch.q, batch.k_new, batch.v_new, k_cache, v_cache, meta, window, kv_scales)
    return out, k_cache, v_cache


SHAPES = {
    "fresh": [(BS, BS), (2 * BS + 5, 2 * BS + 5), (3, 3)],
    "chunk-on-context": [(5, 3 * BS + 2), (BS, 2 * BS), (1, 7)],
    "mixed": mixed_seqs(BS),
}


@pytest.mark.parametrize("kv_heads", [KV_HEADS, HEADS], ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sdpa_prefill_matches_reference(device, dtype, shape, kv_heads, sdpa_calls):
    batch = make_batch(SHAPES[shape], num_heads=HEADS, num_kv_heads=kv_heads, head_dim=HEAD_DIM,
                       block_size=BS, dtype=dtype, device=device, fill_new=False)  # fmt: skip
    got, k_cache, v_cache = _run(batch, device, kv_heads=kv_heads)
    assert sdpa_calls == [1]
    args = batch.attention_args(HEAD_DIM**-0.5)
    want = reference.paged_attention(**{**args, "k_cache": k_cache, "v_cache": v_cache})
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_window_softcap_decode_only_and_many_prompts_stay_on_triton(device, sdpa_calls):
    mixed = make_batch(SHAPES["mixed"], num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                       block_size=BS, dtype=torch.float32, device=device, fill_new=False)  # fmt: skip
    _run(mixed, device, window=8)
    _run(mixed, device, softcap=30.0)
    _run(mixed, device, invariant=True)
    decodes = make_batch([(1, 5), (1, BS + 1)], num_heads=HEADS, num_kv_heads=KV_HEADS,
                         head_dim=HEAD_DIM, block_size=BS, dtype=torch.float32, device=device,
                         fill_new=False)  # fmt: skip
    _run(decodes, device)
    many = make_batch([(1, 4), *[(3, 3 + i) for i in range(sdpa_prefill.MAX_SDPA_SEQS + 1)]],
                      num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BS,
                      dtype=torch.float32, device=device, fill_new=False)  # fmt: skip
    got, k_cache, v_cache = _run(many, device)  # more prefills than MAX_SDPA_SEQS: one launch
    assert sdpa_calls == []
    args = many.attention_args(HEAD_DIM**-0.5)
    want = reference.paged_attention(**{**args, "k_cache": k_cache, "v_cache": v_cache})
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_sdpa_prefill_fp8_cache_matches_triton_kernel(device, per_head, sdpa_calls):
    from pagoda.kernels.fp8 import FP8_DTYPE, fp8_supported

    if device.type == "cuda" and not fp8_supported(device):
        pytest.skip("no FP8 on this GPU")
    batch = make_batch(SHAPES["mixed"], num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                       block_size=BS, dtype=torch.float32, device=device, fill_new=False)  # fmt: skip
    n = KV_HEADS if per_head else 1
    scales = (torch.full((n,), 0.02, device=device), torch.full((n,), 0.01, device=device))
    k8 = (batch.k_cache / scales[0].view(1, 1, -1, 1)).to(FP8_DTYPE)
    v8 = (batch.v_cache / scales[1].view(1, 1, -1, 1)).to(FP8_DTYPE)
    got, k_after, _ = _run(batch, device, kv_scales=scales, k_cache=k8, v_cache=v8)
    assert sdpa_calls == [1]
    want, k_want, _ = _run(batch, device, invariant=True, kv_scales=scales, k_cache=k8, v_cache=v8)
    assert torch.equal(k_after.view(torch.uint8), k_want.view(torch.uint8))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
