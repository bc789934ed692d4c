"""The decode GEMV reads oneDNN's packed weights in place and agrees with oneDNN's GEMM."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model import amx_gemm, gemv
from pagoda.runtime.model.linear import Linear, _can_pack, _pack

pytestmark = pytest.mark.skipif(not _can_pack(torch.bfloat16), reason="no oneDNN bf16 packing")


@pytest.fixture(autouse=True)
def _fresh_choice():
    """`load` caches the choice made under this test's environment: forget it after."""
    gemv.load.cache_clear()
    amx_gemm.load.cache_clear()
    yield
    gemv.load.cache_clear()
    amx_gemm.load.cache_clear()


def _forced(monkeypatch) -> gemv.Gemv:
    monkeypatch.setenv(gemv.ENV_SWITCH, "1")
    fast = gemv.load(_pack)
    if fast is None:
        pytest.skip("no AVX-512 BF16 compiler target or unknown oneDNN layout on this CPU")
    return fast


def test_probe_finds_the_layout_onednn_packs_to():
    nb = gemv.probe_layout(_pack)
    assert nb in (16, 32, 64), "oneDNN's bf16 packed layout changed: the GEMV would be off"


@pytest.mark.parametrize(
    "shape", [(960, 576), (576, 1536), (100, 70), (49, 33), (4096, 64), (64, 20000)]
)
@pytest.mark.parametrize("rows", [1, 2, 3, gemv.MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_onednn_within_bf16_rounding(monkeypatch, shape, rows, bias):
    fast = _forced(monkeypatch)
    g = torch.Generator().manual_seed(rows)
    n, k = shape
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    packed = _pack(w)
    assert fast.accepts(packed, n, k)
    got = fast.bind(packed, b)(x)
    want = x.float() @ w.float().T + (0 if b is None else b.float())
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    # float32 sums in two orders, each rounded once to bf16: at most one bf16 step apart
    assert torch.allclose(got.float(), want, rtol=1 / 128, atol=1e-2)


def test_a_rows_bits_do_not_depend_on_the_other_rows(monkeypatch):
    fast = _forced(monkeypatch)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(3072, 576, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(gemv.MAX_ROWS, 576, generator=g).to(torch.bfloat16)
    call = fast.bind(_pack(w), None)
    want = call(x[:1])
    for m in range(2, gemv.MAX_ROWS + 1):
        assert torch.equal(call(x[:m])[:1], want), f"row 0 at M={m}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(call(x)[:1], want), "thread count changed the bits"
    finally:
        torch.set_num_threads(threads)


def test_linear_takes_the_gemv_for_few_rows_only(monkeypatch):
    monkeypatch.setenv(amx_gemm.AMX_SWITCH, "0")  # where AMX runs, its GEMM would take every row
    _forced(monkeypatch)
    lin = Linear((torch.randn(576, 576) * 0.05).to(torch.bfloat16))
    assert isinstance(lin.fast, gemv.GemvWeight)
    calls = []
    real = lin.fast
    lin.fast = lambda x: calls.append(x.shape[0]) or real(x)
    x = torch.randn(gemv.MAX_ROWS + 1, 576).to(torch.bfloat16)
    lin(x[:1])
    lin(x[: gemv.MAX_ROWS])
    lin(x)
    assert lin(x[:0]).shape == (0, 576)  # a prefill step with no row to sample
    assert calls == [1, gemv.MAX_ROWS]


def test_switch_off_keeps_onednn(monkeypatch):
    monkeypatch.setenv(gemv.ENV_SWITCH, "0")
    monkeypatch.setenv(amx_gemm.AMX_SWITCH, "0")
    assert Linear(torch.randn(64, 64).to(torch.bfloat16), invariant=False).fast is None


def test_auto_follows_batch_invariance(monkeypatch):
    monkeypatch.delenv(gemv.ENV_SWITCH, raising=False)
    assert gemv.wanted(invariant=False)
    assert gemv.wanted(invariant=True) == gemv.onednn_uses_amx()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not gemv.onednn_uses_amx() and not gemv.wanted(invariant=True)


def test_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(gemv.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match="PAGODA_CPU_GEMV"):
        gemv.wanted()
