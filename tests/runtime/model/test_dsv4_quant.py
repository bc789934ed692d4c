"""DeepSeek-V4's released format (model/dsv4_quant.py), one expert matrix in each of its FP4
stores: ``I8`` with ``X.scale`` (the files'), ``U8`` with ``X.weight_scale`` (vLLM's name) and
torch's ``float4_e2m1fn_x2`` (``F4``) with ``X.weight_scale_inv`` (transformers'), the same
packed bytes and scales: read back through the checkpoint reader, checked against the config and
dequantized, each gives the I8 path's float32 matrix; the weights estimate counts the three
alike."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model import dsv4_quant
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights
from pagoda.runtime.server.stored import Stored

_STORES = {0: (torch.int8, "scale"), 1: (torch.uint8, "weight_scale"),
           2: (torch.float4_e2m1fn_x2, "weight_scale_inv")}  # fmt: skip


def test_u8_packed_fp4_experts_with_weight_scale_names_dequantize_as_i8(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    n, k = 8, 64
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scale = torch.exp2(torch.randint(-3, 3, (n, k // 32), generator=g).float())
    tensors = {}
    for e, (dtype, scale_name) in _STORES.items():
        base = f"model.layers.0.mlp.experts.{e}.down_proj."
        tensors[base + "weight"] = packed.clone().view(dtype)
        tensors[base + scale_name] = scale.to(torch.float8_e8m0fnu)
    save_file(tensors, tmp_path / "model.safetensors")
    weights = SafetensorsWeights([tmp_path / "model.safetensors"])
    headers = {name: weights.dtype_and_shape(name) for name in weights}
    assert [headers[f"model.layers.0.mlp.experts.{e}.down_proj.weight"][0] for e in _STORES] == [
        "I8", "U8", "F4"]  # fmt: skip
    q = dsv4_quant.Dsv4Quant(block=(128, 128), expert_fp4=True)
    read = dsv4_quant.Dequantized(weights, q, torch.device("cpu"))
    want = dsv4_quant.dequantize_fp4(packed.view(torch.int8), scale)
    assert want.abs().max() > 0
    for e in _STORES:
        name = f"model.layers.0.mlp.experts.{e}.down_proj.weight"
        stored = headers[name]
        dsv4_quant.check(q, name, name, tuple(stored[1]), headers, (n, k))
        got = read[name]
        assert got.dtype == torch.float32 and torch.equal(got, want), name
    stored = {name: Stored(name, kind, tuple(shape), 1) for name, (kind, shape) in headers.items()}
    held = dsv4_quant.held_tensors(stored)
    assert sorted(held) == [f"model.layers.0.mlp.experts.{e}.down_proj.weight" for e in _STORES]
    assert {(t.kind, t.shape, t.nbytes) for t in held.values()} == {("F32", (n, k), 4 * n * k)}
    bad = headers | {"model.layers.0.mlp.experts.1.down_proj.weight_scale": ("F8_E8M0", [n, 1])}
    name = "model.layers.0.mlp.experts.1.down_proj.weight"
    with pytest.raises(ValueError, match=r"^checkpoint tensor .*experts\.1\.down_proj\."
                                         r"weight_scale is F8_E8M0 \[8, 1\]; the U8 matrix"):  # fmt: skip
        dsv4_quant.check(q, name, name, (n, k // 2), bad, (n, k))
