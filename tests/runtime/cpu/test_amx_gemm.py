"""The AMX GEMM agrees with a float32 reference and gives a row the same bits for every M."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.cpu import amx_gemm
from pagoda.runtime.model.linear import _can_pack, _pack

pytestmark = pytest.mark.skipif(not _can_pack(torch.bfloat16), reason="no oneDNN bf16 packing")

ROW_COUNTS = [1, 2, 3, 16, 17, 31, 32, 33, 64, 100, 300, 513, 1024, 2048]


@pytest.fixture(scope="module")
def gemm() -> amx_gemm.AmxGemm:
    fast = amx_gemm.load(_pack)
    if fast is None:
        pytest.skip("no AMX here (or tile state not granted, or another oneDNN layout)")
    return fast


def _weights(n: int, k: int, seed: int, bias: bool):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    return w, b, g


# SmolLM2-135M's weights, then shapes with a partial N-block, K-block or both
CASES = [((960, 576), 40), ((576, 576), 300), ((3072, 576), 33), ((576, 1536), 65)]
CASES += [((49152, 576), 3), ((100, 70), 50), ((49, 33), 17), ((64, 100), 1), ((33, 1000), 2)]


@pytest.mark.parametrize(("shape", "rows"), CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_close_to_float32_reference(gemm, shape, rows, bias):
    n, k = shape
    w, b, g = _weights(n, k, rows, bias)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    packed = _pack(w)
    assert gemm.accepts(packed, n, k)
    got = gemm.bind(packed, b)(x)
    want = x.float() @ w.float().T + (0 if b is None else b.float())
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    # a float32 sum in another order, rounded once to bf16: at most about one bf16 step off
    assert torch.allclose(got.float(), want, rtol=1 / 128, atol=1e-2)


@pytest.mark.parametrize(("shape", "bias"), [((576, 576), False), ((100, 70), True)])
def test_row_bits_do_not_depend_on_row_count(gemm, shape, bias):
    n, k = shape
    w, b, g = _weights(n, k, 1, bias)
    x = torch.randn(max(ROW_COUNTS), k, generator=g).to(torch.bfloat16)
    call = gemm.bind(_pack(w), b)
    first = call(x[:1])
    for m in ROW_COUNTS:
        y = call(x[:m])
        assert torch.equal(y[:1], first), f"row 0 at M={m}"
        mid = m // 2
        assert torch.equal(y[mid : mid + 1], call(x[mid : mid + 1])), f"row {mid} at M={m}"
        assert torch.equal(y[m - 1 :], call(x[m - 1 : m])), f"last row at M={m}"


@pytest.mark.parametrize(("shape", "rows"), [((100, 70), 600), ((576, 576), 97)])
def test_every_row_equals_the_row_alone(gemm, shape, rows):
    """Every place in a tile (both A tiles, a partial last chunk) gives the lone row's bits."""
    n, k = shape
    w, b, g = _weights(n, k, 7, True)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    call = gemm.bind(_pack(w), b)
    alone = torch.cat([call(x[i : i + 1]) for i in range(rows)])
    assert torch.equal(call(x), alone)
    assert torch.equal(call(x[rows // 3 :]), alone[rows // 3 :])  # other chunk boundaries


def test_row_bits_do_not_depend_on_thread_count(gemm):
    w, _, g = _weights(3072, 576, 2, False)
    x = torch.randn(1024, 576, generator=g).to(torch.bfloat16)
    call = gemm.bind(_pack(w), None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = call(x)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(call(x), alone)
    finally:
        torch.set_num_threads(threads)


def test_other_rows_cannot_leak_in(gemm):
    """Rows of a tile never mix: infinities and NaNs elsewhere leave a row's bits alone."""
    w, b, g = _weights(96, 64, 3, True)
    x = torch.randn(40, 64, generator=g).to(torch.bfloat16)
    call = gemm.bind(_pack(w), b)
    want = call(x[5:6])
    x[:5], x[6:] = float("inf"), float("nan")
    assert torch.equal(call(x)[5:6], want)


def test_strided_rows_and_empty_input(gemm):
    w, _, g = _weights(64, 96, 4, False)
    call = gemm.bind(_pack(w), None)
    wide = torch.randn(20, 200, generator=g).to(torch.bfloat16)
    x = wide[:, 10:106]  # rows at a stride of 200 elements
    assert torch.equal(call(x), call(x.contiguous()))
    assert call(x[:0]).shape == (0, 64)


def test_large_outputs_are_stored_whole(gemm):
    """Outputs past STREAM_FROM bytes take the streaming store: same bits as the cached one."""
    w, b, g = _weights(1024, 64, 5, True)
    x = torch.randn(amx_gemm.STREAM_FROM // 2048 + 7, 64, generator=g).to(torch.bfloat16)
    call = gemm.bind(_pack(w), b)
    y = call(x)
    assert torch.equal(y[-7:], call(x[-7:]))
    assert torch.allclose(y.float(), x.float() @ w.float().T + b.float(), rtol=1 / 128, atol=1e-2)


def test_onednn_still_right_after_it(gemm):
    """It releases the tile state it configured: oneDNN's AMX GEMM on the same threads after it
    gives the same bits as before it."""
    w, b, g = _weights(576, 576, 6, True)
    packed = _pack(w)
    x = torch.randn(300, 576, generator=g).to(torch.bfloat16)
    before = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    for m in (300, 7):
        gemm.bind(packed, b)(x[:m])
        after = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        assert torch.equal(after, before)
