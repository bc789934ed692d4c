"""FP8 (E4M3) quantization math (`pagoda.kernels.fp8`) against a float64 reference.

The reference builds the E4M3 value set from the format's definition (4 exponent bits, bias 7,
3 mantissa bits, no infinities, 0x7F/0xFF NaN) and rounds in float64 to the nearest value, ties
to the even code, after saturating to ±448. It shares no code with torch's cast.
"""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import fp8


def e4m3_values() -> torch.Tensor:
    """The 127 non-negative finite E4M3 values, float64, in code order (0x00 .. 0x7E)."""
    vals = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        vals.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return torch.tensor(vals, dtype=torch.float64)


GRID = e4m3_values()


def round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """float64 ``v`` → nearest E4M3 value (ties to the even code), saturated to ±448."""
    a = v.abs().clamp(max=448.0)
    hi = torch.searchsorted(GRID, a).clamp(max=len(GRID) - 1)  # first grid value >= a
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - GRID[lo], GRID[hi] - a
    pick = torch.where(d_lo < d_hi, lo, hi)
    pick = torch.where((d_lo == d_hi) & (lo % 2 == 0), lo, pick)
    return torch.copysign(GRID[pick], v)


def near_tie(v: torch.Tensor, rel: float = 2.0**-22) -> torch.Tensor:
    """Where ``|v|`` is within ``rel`` of a midpoint between two E4M3 values (rounding there may
    differ between a float32 and a float64 quotient)."""
    mids = (GRID[1:] + GRID[:-1]) / 2
    a = v.abs().clamp(max=448.0)
    i = torch.searchsorted(mids, a).clamp(max=len(mids) - 1)
    dist = torch.minimum((a - mids[i]).abs(), (a - mids[(i - 1).clamp(min=0)]).abs())
    return dist <= rel * a


def reference_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64: per-row scale = amax / 448 (float32-rounded as stored), values rounded."""
    x64 = x.double()
    scale = (x64.abs().amax(dim=1).clamp(min=fp8.AMAX_FLOOR) / 448.0).float()
    return round_e4m3(x64 / scale.double()[:, None]), scale


def test_reference_grid_is_torchs_e4m3():
    codes = torch.arange(0x7F, dtype=torch.uint8).view(fp8.FP8_DTYPE)
    assert torch.equal(codes.double(), GRID)
    assert GRID[-1] == fp8.FP8_MAX == torch.finfo(fp8.FP8_DTYPE).max


def test_torch_cast_rounds_like_the_reference_including_ties_and_saturation():
    mids = (GRID[1:] + GRID[:-1]) / 2  # exact ties
    eps = torch.cat([GRID, mids, mids * (1 + 2.0**-20), mids * (1 - 2.0**-20)])
    v = torch.cat([eps, -eps, torch.tensor([448.0, 460.0, 464.0, 470.0, 1e6, 2.0**-11, 2.0**-10])])
    got = fp8.quantize(v.float(), torch.tensor(1.0)).double()
    assert torch.equal(got, round_e4m3(v.double()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_per_row_quantization_matches_float64(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 257, generator=gen) * torch.exp(torch.randn(64, 1, generator=gen) * 3)
    x = x.to(dtype)
    q, scale = fp8.quantize_per_token(x)
    want_q, want_scale = reference_quantize_rows(x)
    assert q.dtype == fp8.FP8_DTYPE and scale.dtype == torch.float32 and scale.shape == (64,)
    assert torch.equal(scale, want_scale)  # float32 division of exact operands: correctly rounded
    quotient = x.double() / scale.double()[:, None]
    differ = q.double() != want_q
    # only where the float32 quotient lands on a tie the exact one misses by < 2^-22 (bf16
    # inputs, 8-bit ratios of amax, hit those more often than float32 ones)
    assert not (differ & ~near_tie(quotient)).any()
    assert differ.float().mean() < 0.01
    # error bound: half an E4M3 step of the scaled value, times the scale
    deq = fp8.dequantize(q, scale[:, None], torch.float64)
    a = quotient.abs()
    step = torch.where(
        a >= 2.0**-6, 2.0 ** (torch.floor(torch.log2(a.clamp(min=1e-30))) - 3), 2.0**-9
    )
    bound = (step / 2) * scale.double()[:, None] * (1 + 2.0**-16)  # + the near-tie slip
    assert ((deq - x.double()).abs() <= bound).all()
    # every row uses its full range: its largest value maps onto 448 (or the grid just below)
    assert (q.float().abs().amax(dim=1) >= 416).all()


def test_representable_values_round_trip_exactly():
    """Rows whose values are E4M3 values times 2^k, with 448·2^k among them: scale 2^k exactly,
    every value back bit for bit (all 253 finite codes of both signs appear)."""
    vals = torch.cat([GRID, -GRID[1:]])
    rows = []
    for k in (-20, -3, 0, 5, 30):
        perm = vals[torch.randperm(len(vals), generator=torch.Generator().manual_seed(k))]
        rows.append(perm * 2.0**k)
    x = torch.stack(rows).float()
    q, scale = fp8.quantize_per_token(x)
    assert torch.equal(scale, torch.tensor([2.0**k for k in (-20, -3, 0, 5, 30)]))
    assert torch.equal(fp8.dequantize(q, scale[:, None]), x)
    assert torch.equal(fp8.dequantize(q, scale[:, None], torch.bfloat16).float(), x)


def test_saturation_with_a_static_scale():
    scale = torch.tensor([0.5])
    x = torch.tensor([[96.0, 100.0, 224.0, 230.0, 1e4, -1e4, float("inf"), -float("inf"), 0.0]])
    q, s = fp8.quantize_per_token(x, scale)
    assert s is scale  # 200 is a tie between 192 and 208: to the even code, 192
    assert q.float().tolist() == [[192.0, 192.0, 448.0, 448.0, 448.0, -448.0, 448.0, -448.0, 0.0]]
    with pytest.raises(ValueError, match="1 element"):
        fp8.quantize_per_token(x, torch.tensor([0.5, 0.5]))


def test_zero_rows_get_a_positive_scale_and_read_back_zero():
    x = torch.zeros(3, 16, dtype=torch.bfloat16)
    x[1, 3] = 1.0
    q, scale = fp8.quantize_per_token(x)
    assert scale[0] == scale[2] == torch.tensor(fp8.AMAX_FLOOR / 448.0, dtype=torch.float32)
    assert scale[1] == torch.tensor(1.0 / 448.0, dtype=torch.float32)
    assert torch.equal(fp8.dequantize(q, scale[:, None]), x.float())
    assert not q.float().isnan().any()


def test_per_token_scales_follow_each_row_alone():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 40, generator=gen)
    q, scale = fp8.quantize_per_token(x)
    y = x.clone()
    y[0] *= 1000.0
    y[3] = 0.0
    q2, scale2 = fp8.quantize_per_token(y)
    same = [1, 2, 4, 5]
    assert torch.equal(scale2[same], scale[same])
    assert torch.equal(q2[same].view(torch.uint8), q[same].view(torch.uint8))
    z = x * 8.0  # a power of two moves only the scale
    qz, sz = fp8.quantize_per_token(z)
    assert torch.equal(qz.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sz, scale * 8)


def test_weight_quantization_is_per_output_channel():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(24, 64, generator=gen) * torch.logspace(-3, 3, 24)[:, None]
    q, scale = fp8.quantize_weight(w.bfloat16())
    want_q, want_scale = reference_quantize_rows(w.bfloat16())
    assert scale.shape == (24,) and torch.equal(scale, want_scale)
    assert (
        torch.equal(q.double(), want_q)
        or near_tie(w.bfloat16().double() / scale.double()[:, None]).any()
    )
    rel = (fp8.dequantize(q, scale[:, None]) - w.bfloat16().float()).abs() / scale[:, None]
    assert rel.max() <= 448 * 2.0**-4  # half a step at the top of the range, in scale units
    with pytest.raises(ValueError, match="2-D"):
        fp8.quantize_weight(torch.randn(4))


def _rounding_error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """|x − dequantize(quantize(x))| ≤ max(2⁻⁴·|x|, 2⁻¹⁰·scale) (relative half step of a normal
    E4M3 value; half the subnormal step), float64."""
    return torch.maximum(x.double().abs() * 2.0**-4, scale.double() * 2.0**-10)


def test_fp8_linear_reference_error_is_the_quantization_error():
    """W8A8 against the exact float64 product of the unquantized operands: within what the two
    operands' rounding errors allow, so the scales are applied to the right rows and columns."""
    gen = torch.Generator().manual_seed(3)
    n, k = 40, 96
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 2, n)[:, None]
    wq, ws = fp8.quantize_weight(w)
    dw = _rounding_error_bound(w, ws[:, None])
    exact_of = lambda x: x.double() @ w.double().T  # noqa: E731

    def budget(x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        dx = _rounding_error_bound(x, x_scale)
        a, b = x.double().abs(), w.double().abs()
        return (dx @ b.T + a @ dw.T + dx @ dw.T) * (1 + 2.0**-10) + 1e-30

    x = torch.randn(7, k, generator=gen) * torch.logspace(-3, 3, 7)[:, None]
    _, xs = fp8.quantize_per_token(x)
    y = fp8.fp8_linear(x=x, weight=wq, weight_scale=ws, out_dtype=torch.float32)
    assert ((y.double() - exact_of(x)).abs() <= budget(x, xs[:, None])).all()
    static = torch.tensor([x[3].abs().max().item() / 448.0])  # rows 4.. saturate, 0..2 underflow
    y = fp8.fp8_linear(
        x=x[3:4], weight=wq, weight_scale=ws, x_scale=static, out_dtype=torch.float32
    )
    assert ((y.double() - exact_of(x[3:4])).abs() <= budget(x[3:4], static)).all()
    y = fp8.fp8_linear(x=x, weight=wq, weight_scale=ws, weight_only=True)
    assert ((y.double() - exact_of(x)).abs() <= x.double().abs() @ dw.T * 1.001).all()
    assert (y.double() - exact_of(x)).abs().max() > 0  # and the weight rounding shows
    xq, xs = fp8.quantize_per_token(x)
    pre = fp8.fp8_linear(x=xq, weight=wq, weight_scale=ws, x_scale=xs)
    dyn = fp8.fp8_linear(x=x.bfloat16(), weight=wq, weight_scale=ws)
    assert pre.dtype == torch.bfloat16 and dyn.dtype == torch.bfloat16


def test_kv_reference_write_and_attention_dequantize_with_per_head_scales():
    from pagoda.kernels import reference

    gen = torch.Generator().manual_seed(4)
    T, H, Hkv, D, bs = 10, 4, 2, 16, 16
    k = torch.randn(T, Hkv, D, generator=gen) * torch.tensor([0.5, 2.0])[None, :, None]
    v = torch.randn(T, Hkv, D, generator=gen)
    k_scale = (k.abs().amax(dim=(0, 2)) / 448.0).float()
    v_scale = torch.tensor([v.abs().max().item() / 448.0])
    kc = torch.zeros(2, bs, Hkv, D, dtype=fp8.FP8_DTYPE)
    vc = torch.zeros_like(kc)
    slots = torch.arange(T)
    fp8.write_kv_cache(k=k, v=v, k_cache=kc, v_cache=vc, slot_mapping=slots,
                       k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    back = fp8.dequantize_kv_cache(kc, k_scale, torch.float64).view(-1, Hkv, D)[:T]
    assert ((back - k.double()).abs() <= k_scale.double()[None, :, None] * 16).all()
    q = torch.randn(T, H, D, generator=gen)
    args = dict(block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
                seq_lens=torch.tensor([T], dtype=torch.int32),
                query_start_loc=torch.tensor([0, T], dtype=torch.int32),
                max_query_len=T, max_seq_len=T, scale=D**-0.5)  # fmt: skip
    got = fp8.paged_attention(q=q, k_cache=kc, v_cache=vc, k_scale=k_scale, v_scale=v_scale, **args)
    kf = torch.zeros(2, bs, Hkv, D)
    vf = torch.zeros_like(kf)
    k_back = fp8.dequantize_kv_cache(kc, k_scale, torch.float32).view(-1, Hkv, D)[:T]
    v_back = fp8.dequantize_kv_cache(vc, v_scale, torch.float32).view(-1, Hkv, D)[:T]
    reference.write_kv_cache(k=k_back, v=v_back, k_cache=kf, v_cache=vf, slot_mapping=slots)
    torch.testing.assert_close(got, reference.paged_attention(q=q, k_cache=kf, v_cache=vf, **args))
    reference.write_kv_cache(k=k, v=v, k_cache=kf, v_cache=vf, slot_mapping=slots)
    unquantized = reference.paged_attention(q=q, k_cache=kf, v_cache=vf, **args)
    assert (got - unquantized).abs().max() < 0.1 * unquantized.abs().max()
    with pytest.raises(ValueError, match="KV scale"):
        fp8.write_kv_cache(k=k, v=v, k_cache=kc, v_cache=vc, slot_mapping=slots,
                           k_scale=torch.ones(3), v_scale=v_scale)  # fmt: skip
