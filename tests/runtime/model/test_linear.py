"""Packed CPU linear layers give a row the same bits whatever the number of rows M.

This is what greedy reproducibility on the CPU rests on (docs/runtime.md, "What is
guaranteed"). Several weight shapes are used in one process, in an order where later shapes
follow earlier ones: on an AMX Xeon, oneDNN's bf16 GEMM gave the first shape of a process
invariant rows and later shapes rows whose rounding changed for M between 33 and ~1,000."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.cpu import amx_gemm
from pagoda.runtime.cpu.gemv import onednn_uses_amx
from pagoda.runtime.model.linear import Linear, _pack, bf16_rows_invariant

SHAPES = [(3072, 576), (576, 576), (576, 1536), (960, 576), (4096, 576)]  # SmolLM2's, in order
ROWS = [1, 2, 3, 17, 32, 33, 64, 100, 300, 513, 1024]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_row_count(dtype):
    if dtype == torch.bfloat16 and not bf16_rows_invariant():
        pytest.skip("oneDNN's AMX bf16 GEMM rounds a row differently with M (docs/runtime.md)")
    g = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        lin = Linear((torch.randn(n, k, generator=g) * 0.05).to(dtype), invariant=True)
        x = torch.randn(max(ROWS), k, generator=g).to(dtype)
        want = lin(x[:2])[:1]
        for m in ROWS:
            assert torch.equal(lin(x[:m])[:1], want), f"{dtype} {n}x{k}: row 0 at M={m}"


def test_bf16_on_amx_takes_the_invariant_amx_gemm():
    """Where oneDNN's bf16 GEMM would run on AMX, every bf16 call goes to the AMX GEMM instead."""
    if not onednn_uses_amx() or amx_gemm.load(_pack) is None:
        pytest.skip("no AMX GEMM on this machine")
    lin = Linear((torch.randn(576, 576) * 0.05).to(torch.bfloat16), invariant=True)
    assert isinstance(lin.fast, amx_gemm.AmxWeight) and lin.fast_rows >= 2048
    assert bf16_rows_invariant()
