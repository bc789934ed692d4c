"""The bf16 GEMV/GEMM reads oneDNN's packed weights in place, agrees with oneDNN's GEMM, and gives
a row the same bits whatever the row count, its place in the batch or the threads; on CPUs
without AMX it takes every row count (checked here in a process whose oneDNN is limited to
AVX-512 BF16, which is what such CPUs run)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from pagoda.runtime.cpu import amx_gemm, gemv
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
@pytest.mark.parametrize("rows", [1, 2, 3, gemv.MAX_ROWS, 7, 24, 33, 50])  # 24, 33: key chunks
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


@pytest.mark.parametrize("k", [576, 70])  # whole 32-key blocks (read in place) or padded
def test_a_rows_bits_do_not_depend_on_the_other_rows(monkeypatch, k):
    fast = _forced(monkeypatch)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(1000, k, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(230, k, generator=g).to(torch.bfloat16)
    call = fast.bind(_pack(w), None)
    want = torch.cat([call(x[i : i + 1]) for i in range(len(x))])  # every row alone
    cases = [(0, 2), (0, 4), (1, 5), (3, 6), (0, 7), (5, 13), (0, 97), (2, 228)]
    cases += [(0, 19), (7, 24), (1, 32), (9, 41), (0, 48)]  # runs swept in key chunks
    for lo, m in cases:
        assert torch.equal(call(x[lo : lo + m]), want[lo : lo + m]), f"rows {lo}..{lo + m}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(call(x), want), "thread count changed the bits"
    finally:
        torch.set_num_threads(threads)


def test_linear_takes_the_gemv_for_the_rows_max_rows_says(monkeypatch):
    monkeypatch.setenv(amx_gemm.AMX_SWITCH, "0")  # where AMX runs, its GEMM would take every row
    _forced(monkeypatch)
    lin = Linear((torch.randn(576, 576) * 0.05).to(torch.bfloat16))
    assert isinstance(lin.fast, gemv.GemvWeight) and lin.fast_rows == gemv.max_rows()
    calls = []
    real = lin.fast
    lin.fast = lambda x: calls.append(x.shape[0]) or real(x)
    x = torch.randn(gemv.MAX_ROWS + 1, 576).to(torch.bfloat16)
    lin(x[:1])
    lin(x[: gemv.MAX_ROWS])
    lin(x)
    assert lin(x[:0]).shape == (0, 576)  # a prefill step with no row to sample
    every = [] if gemv.onednn_uses_amx() else [gemv.MAX_ROWS + 1]
    assert calls == [1, gemv.MAX_ROWS, *every]


def test_switch_off_keeps_onednn(monkeypatch):
    monkeypatch.setenv(gemv.ENV_SWITCH, "0")
    monkeypatch.setenv(amx_gemm.AMX_SWITCH, "0")
    assert Linear(torch.randn(64, 64).to(torch.bfloat16), invariant=False).fast is None


def test_rows_taken_follow_onednns_isa(monkeypatch):
    monkeypatch.delenv(gemv.ENV_SWITCH, raising=False)
    assert gemv.wanted()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not gemv.onednn_uses_amx() and gemv.max_rows() >= 1 << 32
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    amx = gemv.onednn_uses_amx()
    assert gemv.max_rows() == (gemv.MAX_ROWS if amx else 1 << 62)


NON_AMX_CHILD = textwrap.dedent("""
    import torch
    from pagoda.runtime.cpu import gemv
    from pagoda.runtime.model.linear import Linear, bf16_rows_invariant
    from pagoda.runtime.model.linear import _pack
    if gemv.load(_pack) is None:
        print("SKIP no AVX-512 BF16 GEMV"); raise SystemExit
    assert not gemv.onednn_uses_amx() and bf16_rows_invariant()
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(960, 576, generator=g) * 0.05).to(torch.bfloat16)
    lin = Linear(w, invariant=True)
    assert isinstance(lin.fast, gemv.GemvWeight), type(lin.fast)
    x = torch.randn(300, 576, generator=g).to(torch.bfloat16)
    full = lin(x)
    for m in (1, 2, 5, 33, 299):
        assert torch.equal(lin(x[:m]), full[:m]), m
    ref = torch.ops.mkldnn._linear_pointwise(x, lin.packed, None, "none", [], "")
    assert torch.allclose(full.float(), ref.float(), rtol=1 / 128, atol=1e-2)
    print("OK nb", lin.fast.nb)
""")


def test_without_amx_the_kernel_takes_every_row_count():
    """What a Zen 4 runs: oneDNN limited to AVX-512 BF16 (set before it loads, so a child)."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "PYTHONSAFEPATH": "1"}
    env.pop(gemv.ENV_SWITCH, None)
    out = subprocess.run(
        [sys.executable, "-P", "-c", NON_AMX_CHILD], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.startswith("OK nb")


def test_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(gemv.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match="PAGODA_CPU_GEMV"):
        gemv.wanted()
