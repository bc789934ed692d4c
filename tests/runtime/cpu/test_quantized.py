"""Weights kept as stored for `qgemm` (GGUF blocks, 16-bit values): they dequantize to exactly what
`gguf.quants` gives, rows stack and permute like the float weights, and malformed blocks are
refused."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from pagoda.runtime.cpu.qgemm import probe_weight
from pagoda.runtime.cpu.quantized import (
    BLOCKS,
    QuantizedWeight,
    from_dense,
    from_gguf,
    stack,
)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_dequantize_is_gguf_bit_for_bit(kind):
    cols = 3 * BLOCKS[kind][0]
    w = probe_weight(kind, 37, cols, seed=5)
    want = gguf.quants.dequantize(w.blocks.numpy(), gguf.GGMLQuantizationType[kind])
    np.testing.assert_array_equal(w.dequantize().numpy(), want.reshape(37, cols))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])  # gguf-py can
def test_quantize_roundtrip_through_gguf(kind):
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    data = gguf.quants.quantize(x, gguf.GGMLQuantizationType[kind])
    w = from_gguf(kind, data, 64)
    assert w is not None and (w.rows, w.cols) == (8, 64)
    want = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind]).reshape(8, 64)
    np.testing.assert_array_equal(w.dequantize().numpy(), want)


def test_16_bit_tensors_are_kept_as_their_values():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float16)
    w = from_gguf("F16", x, 64)  # GGUF's reader gives float16 arrays for F16 tensors
    assert w is not None and (w.kind, w.rows, w.cols) == ("F16", 4, 64)
    np.testing.assert_array_equal(w.dequantize().numpy(), x.astype(np.float32))
    t = torch.randn(48, 96).to(torch.bfloat16)
    d = from_dense(t)
    assert d is not None and d.kind == "BF16" and d.blocks.data_ptr() == t.data_ptr()  # shared
    assert torch.equal(d.dequantize(), t.float())
    assert from_dense(t.float()) is None and from_dense(t[:, :40].contiguous()) is None
    assert from_dense(t.T) is None and from_dense(t[0]) is None  # not a row-major matrix


def test_other_formats_are_not_kept():
    assert from_gguf("F32", np.zeros((4, 64), np.float32), 64) is None
    assert from_gguf("Q2_K", np.zeros((4, 84), np.uint8), 256) is None
    assert from_gguf("Q4_K", np.zeros((4, 72), np.uint8), 128) is None  # not whole blocks


def test_stack_merges_neighbours_of_one_kind_and_keeps_mixtures_apart():
    a, b = probe_weight("Q4_1", 16, 256, seed=1), probe_weight("Q4_1", 8, 256, seed=2)
    c = probe_weight("Q6_K", 8, 256, seed=3)
    (both,) = stack([a, b])
    assert both.rows == 24
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    parts = stack([a, b, c])  # Q4_K_M-style q/k in one kind, v in another
    assert [(p.kind, p.rows) for p in parts] == [("Q4_1", 24), ("Q6_K", 8)]
    assert stack([a, probe_weight("Q4_1", 8, 512)]) is None  # other columns
    assert stack([a, None]) is None and stack([]) is None


def test_malformed_blocks_are_refused():
    with pytest.raises(ValueError, match="not one of"):
        QuantizedWeight("Q2_K", torch.zeros(2, 84, dtype=torch.uint8), 256)
    with pytest.raises(ValueError, match="whole blocks"):
        QuantizedWeight("Q8_0", torch.zeros(2, 34, dtype=torch.uint8), 40)
    with pytest.raises(ValueError, match=r"uint8 \[rows, 68\]"):
        QuantizedWeight("Q8_0", torch.zeros(2, 34, dtype=torch.uint8), 64)
