"""The FP8 Triton kernels against their references (`pagoda.kernels.fp8`): activation
quantization and the KV-cache write bit for bit, the GEMM within float32 rounding, and the
GEMM's batch invariance.

Under ``TRITON_INTERPRET=1`` the kernels run unchanged except for one switch: the float32 → E4M3
cast goes through an exact float32 rounding first (`fp8_quant.to_fp8`; the interpreter's own
cast is wrong). The interpreter multiplies E4M3 tiles exactly (decoded to float16, float32
sums). Compiled on a GPU (``-m gpu``) the same comparisons check the hardware cast and FP8 MMA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda.kernels import fp8

FP8 = fp8.FP8_DTYPE
CFG = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=2)


@pytest.fixture(autouse=True)
def _fp8_device(device):
    if device.type == "cuda" and not fp8.fp8_supported(device):
        pytest.skip("FP8 kernels need compute capability 8.9 or later")


@pytest.fixture
def row_independent_fp8_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """`conftest.row_independent_dot` for E4M3 operands too: each output summed from its own
    row's exact products (E4M3 → float32 is exact), whatever the host BLAS does with tiles."""
    from pagoda.kernels._common import interpreter_enabled

    if not interpreter_enabled():
        return
    import triton.language as tl
    from triton.runtime import interpreter

    def widen(h) -> np.ndarray:
        if h.dtype.primitive_bitwidth == 8 and h.dtype.is_floating():
            raw = interpreter._convert_float(h.data, h.dtype, tl.float16, None)
            return raw.view(np.float16).astype(np.float32)
        return h.data.astype(np.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        prod = widen(a)[..., :, :, None] * widen(b)[..., None, :, :]
        return interpreter.TensorHandle(prod.sum(axis=-2) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


def codes(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


# --- activation quantization -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantize_fp8_matches_reference_bit_for_bit(device, dtype):
    from pagoda.kernels import quantize_fp8

    x = torch.randn(6, 2500) * torch.exp(torch.randn(6, 1) * 3)  # > one 1024-wide pass
    x[2] = 0.0
    x = x.to(device, dtype)
    q, scale = quantize_fp8(x=x)
    want_q, want_scale = fp8.quantize_fp8(x=x)
    assert q.dtype == FP8 and scale.shape == (6,) and torch.equal(scale, want_scale)
    assert torch.equal(codes(q), codes(want_q))
    static = torch.tensor([0.01], device=device)  # large rows saturate
    q, s = quantize_fp8(x=x[:, :300], scale=static)
    assert s is static and torch.equal(
        codes(q), codes(fp8.quantize_fp8(x=x[:, :300], scale=static)[0])
    )
    assert (q.float().abs() == 448).any()


def test_quantize_fp8_cast_rounds_ties_to_even_and_saturates(device):
    """Every E4M3 value, every midpoint between neighbours (ties), values just off them, and
    values past 448, through the kernel with scale 1: torch's cast bit for bit."""
    from pagoda.kernels import quantize_fp8

    grid = torch.arange(0x7F, dtype=torch.uint8).view(FP8).float()
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat([grid, mids, mids * (1 + 2.0**-12), mids * (1 - 2.0**-12)])
    vals = torch.cat([vals, -vals, torch.tensor([449.0, 463.0, 464.0, 465.0, 1e9, -1e9])])
    x = vals.reshape(1, -1).to(device)
    q, _ = quantize_fp8(x=x, scale=torch.ones(1, device=device))
    assert torch.equal(codes(q), codes(x.clamp(-448, 448).to(FP8)))


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (codes compared as E4M3 values)."""
    got, want = got.float(), want.float()
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(
        got.nan_to_num(0.0), want.nan_to_num(0.0)
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN / scale
def test_quantize_fp8_and_kv_write_keep_nan_as_torch_does(device):
    """A NaN stays NaN (E4M3's NaN code) as in torch's cast, not -448 (``max(NaN, -448)`` is
    -448 on a GPU and in the interpreter); a row holding one gets a NaN scale, as the
    reference's amax, rather than the other values' scale; an inf row's scale is inf."""
    from pagoda.kernels import quantize_fp8, write_kv_cache

    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, 2.0, 3.0], [1.0, 2.0, inf, 3.0], [0.5, -1.0, 0.0, 2.0]])
    x = x.to(device)
    for scale in (None, torch.tensor([0.01], device=device)):
        q, s = quantize_fp8(x=x, scale=scale)
        want_q, want_s = fp8.quantize_fp8(x=x, scale=scale)
        assert _same(q, want_q) and _same(s, want_s), (q, want_q, s, want_s)
        assert q[0, 1].float().isnan()
    k = torch.randn(3, 2, 8, device=device)
    k[1, 0, 5] = nan
    k_cache = torch.zeros(2, 4, 2, 8, device=device).to(FP8)
    want = k_cache.clone()
    args = dict(k=k, v=k, slot_mapping=torch.tensor([0, 1, 2], device=device),
                k_scale=torch.tensor([0.01], device=device),
                v_scale=torch.tensor([0.01], device=device))  # fmt: skip
    write_kv_cache(k_cache=k_cache, v_cache=k_cache.clone(), **args)
    fp8.write_kv_cache(k_cache=want, v_cache=want.clone(), **args)
    assert _same(k_cache, want) and k_cache[0, 1, 0, 5].float().isnan()


def test_quantize_fp8_outputs_and_errors(device):
    from pagoda.kernels import quantize_fp8

    x = torch.randn(5, 64, device=device)
    out = torch.empty(5, 64, dtype=FP8, device=device)
    out_scale = torch.empty(5, device=device)
    q, s = quantize_fp8(x=x, out=out, out_scale=out_scale)
    assert q is out and s is out_scale and torch.equal(codes(q), codes(fp8.quantize_fp8(x=x)[0]))
    q, s = quantize_fp8(x=x[:0])
    assert q.shape == (0, 64) and s.shape == (0,)
    with pytest.raises(ValueError, match="2-D"):
        quantize_fp8(x=x.to(torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        quantize_fp8(x=x.T)
    with pytest.raises(ValueError, match="static scale"):
        quantize_fp8(x=x, scale=torch.ones(5, device=device))
    with pytest.raises(ValueError, match="out must be"):
        quantize_fp8(x=x, out=torch.empty(5, 64, device=device))


# --- the GEMM --------------------------------------------------------------------------------


def _operands(n: int, k: int, m: int, device, dtype=torch.bfloat16):
    w = torch.randn(n, k, device=device) / k**0.5 * torch.logspace(-1, 1, n, device=device)[:, None]
    wq, ws = fp8.quantize_weight(w)
    x = torch.randn(m, k, device=device) * torch.logspace(-2, 2, m, device=device)[:, None]
    return wq, ws, x.to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, wq, ws) -> None:
    """Within one rounding of the output dtype, plus sums in another order: 2⁻¹² of the sum of
    the products' magnitudes (Hopper's FP8 MMA adds within a K slice with ~14 bits). ``x``: the
    activations before quantization."""
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-20}[got.dtype]
    mag = x.float().abs() @ fp8.dequantize(wq, ws.reshape(-1, 1)).abs().T
    tol = ulp * want.float().abs() + 2.0**-12 * mag + 1e-30
    err = (got.float() - want.float()).abs()
    assert (err <= tol).all(), f"max |diff| {err.max():.3g}, worst ratio {(err / tol).max():.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("mode", ["dynamic", "static", "prequantized", "weight_only"])
def test_fp8_linear_matches_reference(device, dtype, mode):
    from pagoda.kernels import fp8_linear

    n, k = 72, 144  # neither a multiple of the tiles
    wq, ws, x = _operands(n, k, 19, device, dtype)
    bias = torch.randn(n, device=device).to(dtype)
    kw: dict = {"bias": bias}
    if mode == "static":
        kw["x_scale"] = torch.tensor([x[5].abs().max().item() / 448.0], device=device)
    elif mode == "weight_only":
        kw["weight_only"] = True
    x_in = x
    if mode == "prequantized":
        x_in, kw["x_scale"] = fp8.quantize_per_token(x)
        kw["out_dtype"] = dtype
    got = fp8_linear(x=x_in, weight=wq, weight_scale=ws, config=CFG, **kw)
    want = fp8.fp8_linear(x=x_in, weight=wq, weight_scale=ws, **kw)
    assert got.dtype == dtype and got.shape == (19, n)
    _close(got, want, x, wq, ws)


def test_fp8_linear_per_tensor_scales_out_and_errors(device):
    from pagoda.kernels import fp8_linear

    wq, ws, x = _operands(40, 96, 5, device)
    w_tensor = ws.max().reshape(1)  # one scale for the whole weight
    xq, _ = fp8.quantize_per_token(x)
    x_tensor = torch.tensor([0.05], device=device)
    out = torch.empty(5, 40, dtype=torch.bfloat16, device=device)
    got = fp8_linear(x=xq, weight=wq, weight_scale=w_tensor, x_scale=x_tensor, out=out)
    assert got is out
    want = fp8.fp8_linear(x=xq, weight=wq, weight_scale=w_tensor, x_scale=x_tensor)
    _close(got, want, fp8.dequantize(xq, x_tensor), wq, w_tensor)
    assert fp8_linear(x=x[:0], weight=wq, weight_scale=ws).shape == (0, 40)
    bad = {
        "weight must be float8": dict(x=x, weight=wq.bfloat16(), weight_scale=ws),
        "needs its x_scale": dict(x=xq, weight=wq, weight_scale=ws),
        "weight_scale must have": dict(x=x, weight=wq, weight_scale=ws[:7]),
        "weight_scale must be float32": dict(x=x, weight=wq, weight_scale=ws.double()),
        "x_scale must have": dict(x=xq, weight=wq, weight_scale=ws, x_scale=torch.ones(3, device=device)),
        "takes no x_scale": dict(x=x, weight=wq, weight_scale=ws, weight_only=True, x_scale=x_tensor),
        "weight_only takes": dict(x=xq, weight=wq, weight_scale=ws, x_scale=x_tensor, weight_only=True),
        "expected x": dict(x=x[:, :95], weight=wq, weight_scale=ws),
        "BLOCK_K >= 32": dict(x=x, weight=wq, weight_scale=ws, config={**CFG, "BLOCK_K": 16}),
    }  # fmt: skip
    for match, kw in bad.items():
        with pytest.raises(ValueError, match=match):
            fp8_linear(**kw)


def _gemm_shapes(device: torch.device) -> list[tuple[int, int]]:
    if device.type == "cuda":  # Llama-3-8B: qkv, o, gate_up, down
        return [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    return [(72, 144), (40, 200)]


def _row_counts(device: torch.device) -> list[int]:
    return [1, 3, 64, 255, 256, 264, 2048] if device.type == "cuda" else [1, 2, 5, 37]


@pytest.mark.usefixtures("row_independent_fp8_dot")
@pytest.mark.parametrize("mode", ["dynamic", "weight_only"])
def test_fp8_linear_rows_do_not_depend_on_the_number_of_rows(device, mode):
    """A token's output bits are the same alone, among a few tokens, in a CUDA-graph-padded
    batch or a prefill chunk: its activation scale is its own, its K order fixed by (N, K)."""
    from pagoda.kernels import fp8_linear

    counts = _row_counts(device)
    cfg = None if device.type == "cuda" else CFG
    for n, k in _gemm_shapes(device):
        wq, ws, _ = _operands(n, k, 1, device)
        x = torch.randn(max(counts), k, device=device, dtype=torch.bfloat16)
        wo = mode == "weight_only"

        def run(rows, wq=wq, ws=ws, wo=wo):
            return fp8_linear(x=rows, weight=wq, weight_scale=ws, weight_only=wo, config=cfg)

        full = run(x)
        for m in counts[:-1]:
            assert torch.equal(run(x[-m:]), full[-m:]), f"[{n}x{k}] rows differ at M={m}"
        want = fp8.fp8_linear(x=x[:4], weight=wq, weight_scale=ws, weight_only=wo)
        _close(full[:4], want, x[:4], wq, ws)


# --- the KV-cache write ----------------------------------------------------------------------


@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_write_kv_cache_fp8_matches_reference(device, dtype, per_head):
    from pagoda.kernels import write_kv_cache

    T, Hkv, D, bs, blocks = 11, 3, 40, 16, 6  # D not a power of two
    k = (torch.randn(T, Hkv, D) * torch.tensor([1.0, 20.0, 300.0])[None, :, None]).to(device, dtype)
    v = torch.randn(T, Hkv, D).to(device, dtype)
    slots = torch.randperm(blocks * bs)[:T].to(device)
    slots[4] = -1
    if per_head:
        k_scale = (k.float().abs().amax(dim=(0, 2)) / 448).contiguous()
        v_scale = (v.float().abs().amax(dim=(0, 2)) / 448).contiguous()
    else:  # one scale for all heads: the large head saturates
        k_scale, v_scale = torch.tensor([0.05], device=device), torch.tensor([0.01], device=device)
    k_cache = torch.full((blocks, bs, Hkv, D), 7.0, device=device).to(FP8)
    v_cache = k_cache.clone()
    want_k, want_v = k_cache.clone(), v_cache.clone()
    args = dict(k=k, v=v, slot_mapping=slots, k_scale=k_scale, v_scale=v_scale)
    write_kv_cache(k_cache=k_cache, v_cache=v_cache, **args)
    fp8.write_kv_cache(k_cache=want_k, v_cache=want_v, **args)
    assert torch.equal(codes(k_cache), codes(want_k)) and torch.equal(codes(v_cache), codes(want_v))
    untouched = torch.ones(blocks * bs, dtype=torch.bool)
    untouched[slots[slots >= 0].cpu()] = False
    assert (k_cache.view(-1, Hkv, D)[untouched.to(device)].float() == 7.0).all()
    if not per_head:
        assert (k_cache.float().abs() == 448).any()


def test_write_kv_cache_fp8_errors(device):
    from pagoda.kernels import write_kv_cache

    k = torch.randn(2, 2, 16, device=device)
    cache = torch.zeros(1, 16, 2, 16, device=device).to(FP8)
    one = torch.ones(1, device=device)
    args = dict(
        k=k, v=k, k_cache=cache, v_cache=cache.clone(), slot_mapping=torch.arange(2, device=device)
    )
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        write_kv_cache(**args)
    with pytest.raises(ValueError, match="1 or Hkv=2"):
        write_kv_cache(
            **args, k_scale=torch.ones(3, device=device), v_scale=torch.ones(3, device=device)
        )
    with pytest.raises(ValueError, match="1 or Hkv=2"):
        write_kv_cache(**args, k_scale=one, v_scale=torch.ones(2, device=device))
    bf16 = torch.zeros(1, 16, 2, 16, device=device)
    with pytest.raises(ValueError, match="are for float8_e4m3fn caches"):
        write_kv_cache(k=k, v=k, k_cache=bf16, v_cache=bf16.clone(), slot_mapping=args["slot_mapping"],
                       k_scale=one, v_scale=one)  # fmt: skip
    with pytest.raises(ValueError, match="dtypes differ"):
        write_kv_cache(k=k, v=k, k_cache=cache, v_cache=bf16, slot_mapping=args["slot_mapping"],
                       k_scale=one, v_scale=one)  # fmt: skip


# --- attention over an FP8 cache -------------------------------------------------------------

ATTN_PATHS = {
    "prefill-kernel": {},
    "split4": {"num_kv_splits": 4},
    "invariant": {"batch_invariant": True},
    "unified": {"flash_prefill": False},
}


def _fp8_batch(device, dtype, per_head, group=2, head_dim=64, block_size=16):
    """A mixed batch (`kernel_testlib.mixed_seqs`) whose caches are quantized to E4M3 with
    per-tensor or per-KV-head scales (heads of different magnitudes)."""
    from kernel_testlib import make_batch, mixed_seqs

    kv_heads = 2
    b = make_batch(mixed_seqs(block_size), num_heads=kv_heads * group, num_kv_heads=kv_heads,
                   head_dim=head_dim, block_size=block_size, dtype=dtype, device=device)  # fmt: skip
    mags = torch.tensor([0.5, 4.0], device=device)[None, None, :, None]
    k, v = (b.k_cache.float() * mags).to(dtype), b.v_cache
    if per_head:
        k_scale = (k.float().abs().amax(dim=(0, 1, 3)) / 448).contiguous()
        v_scale = (v.float().abs().amax(dim=(0, 1, 3)) / 448).contiguous()
    else:
        k_scale = (k.float().abs().amax() / 448).reshape(1)
        v_scale = torch.ones(1, device=device)  # vLLM's uncalibrated default
    b.k_cache = fp8.quantize(k, k_scale.reshape(1, 1, -1, 1))
    b.v_cache = fp8.quantize(v, v_scale.reshape(1, 1, -1, 1))
    return b, k_scale, v_scale


@pytest.mark.parametrize("path", list(ATTN_PATHS))
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_paged_attention_reads_fp8_cache_like_the_reference(device, dtype, per_head, path):
    """Both kernels (unified; split-KV decodes) and the invariant mode over an E4M3 cache:
    `fp8.paged_attention` (the pool dequantized in float32, then float64-free attention)."""
    from kernel_testlib import TOL
    from pagoda.kernels import paged_attention

    b, k_scale, v_scale = _fp8_batch(device, dtype, per_head)
    args = b.attention_args(scale=64**-0.5)
    want = fp8.paged_attention(**args, k_scale=k_scale, v_scale=v_scale)
    got = paged_attention(**args, k_scale=k_scale, v_scale=v_scale, num_decodes=b.num_decodes,
                          **ATTN_PATHS[path])  # fmt: skip
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


def test_fp8_cache_written_and_read_by_the_kernels(device):
    """write_kv_cache (E4M3, per-head scales) then paged_attention: the reference of both, and
    within FP8's error of attention over the unquantized keys and values."""
    from kernel_testlib import make_batch, mixed_seqs
    from pagoda.kernels import paged_attention, reference, write_kv_cache

    b = make_batch(mixed_seqs(16), num_heads=6, num_kv_heads=2, head_dim=32, block_size=16,
                   dtype=torch.bfloat16, device=device)  # fmt: skip
    k_scale = (b.k_cache.float().abs().amax(dim=(0, 1, 3)) / 448).contiguous()
    v_scale = (b.v_cache.float().abs().amax(dim=(0, 1, 3)) / 448).contiguous()
    kc, vc = fp8.quantize(b.k_cache, k_scale.reshape(1, 1, -1, 1)), torch.zeros_like(b.v_cache)
    vc = fp8.quantize(b.v_cache, v_scale.reshape(1, 1, -1, 1))
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    write_kv_cache(k=b.k_new, v=b.v_new, k_cache=kc, v_cache=vc, slot_mapping=b.slot_mapping,
                   **scales)  # fmt: skip
    args = b.attention_args(scale=32**-0.5)
    got = paged_attention(**{**args, "k_cache": kc, "v_cache": vc}, num_decodes=b.num_decodes,
                          **scales)  # fmt: skip
    want = fp8.paged_attention(**{**args, "k_cache": kc, "v_cache": vc}, **scales)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
    exact = reference.paged_attention(**args)  # the bf16 cache the new rows were written into
    assert (got.float() - exact.float()).abs().max() < 0.15 * exact.float().abs().max()


def test_paged_attention_fp8_cache_errors(device):
    from pagoda.kernels import paged_attention

    b, k_scale, v_scale = _fp8_batch(device, torch.float32, per_head=True)
    args = b.attention_args(scale=0.1)
    with pytest.raises(ValueError, match="needs its k_scale and v_scale"):
        paged_attention(**args)
    with pytest.raises(ValueError, match="1 or Hkv=2"):
        paged_attention(**args, k_scale=torch.ones(3, device=device), v_scale=v_scale)
    plain = {**args, "k_cache": b.k_cache.float(), "v_cache": b.v_cache.float()}
    with pytest.raises(ValueError, match="are for float8_e4m3fn caches"):
        paged_attention(**plain, k_scale=k_scale, v_scale=v_scale)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        paged_attention(**{**args, "k_cache": b.k_cache.to(torch.float16)})
