"""GGUF blocks kept for `qgemm`: they dequantize to exactly what `gguf.quants` gives, rows
concatenate and permute like the float weights, and malformed blocks are refused."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from pagoda.runtime.model.qgemm import probe_weight
from pagoda.runtime.model.quantized import BLOCK_BYTES, QuantizedWeight, concat, from_gguf


@pytest.mark.parametrize("kind", sorted(BLOCK_BYTES))
def test_dequantize_is_gguf_bit_for_bit(kind):
    w = probe_weight(kind, 37, 96, seed=5)
    want = gguf.quants.dequantize(w.blocks.numpy(), gguf.GGMLQuantizationType[kind])
    np.testing.assert_array_equal(w.dequantize().numpy(), want.reshape(37, 96))


@pytest.mark.parametrize("kind", sorted(BLOCK_BYTES))
def test_quantize_roundtrip_through_gguf(kind):
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    data = gguf.quants.quantize(x, gguf.GGMLQuantizationType[kind])
    w = from_gguf(kind, data, 64)
    assert w is not None and (w.rows, w.cols) == (8, 64)
    want = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind]).reshape(8, 64)
    np.testing.assert_array_equal(w.dequantize().numpy(), want)


def test_other_formats_are_not_kept():
    assert from_gguf("F16", np.zeros((4, 64), np.uint8), 64) is None
    assert from_gguf("Q4_K", np.zeros((4, 144), np.uint8), 256) is None


def test_concat_stacks_rows_and_refuses_mixtures():
    a, b = probe_weight("Q4_1", 16, 64, seed=1), probe_weight("Q4_1", 8, 64, seed=2)
    both = concat([a, b])
    assert both is not None and both.rows == 24
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    assert concat([a, probe_weight("Q8_0", 8, 64)]) is None
    assert concat([a, probe_weight("Q4_1", 8, 96)]) is None
    assert concat([a, None]) is None and concat([]) is None


def test_malformed_blocks_are_refused():
    with pytest.raises(ValueError, match="not one of"):
        QuantizedWeight("Q5_0", torch.zeros(2, 22, dtype=torch.uint8), 32)
    with pytest.raises(ValueError, match="whole blocks"):
        QuantizedWeight("Q8_0", torch.zeros(2, 34, dtype=torch.uint8), 40)
    with pytest.raises(ValueError, match=r"uint8 \[rows, 68\]"):
        QuantizedWeight("Q8_0", torch.zeros(2, 34, dtype=torch.uint8), 64)
