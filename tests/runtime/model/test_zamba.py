"""Zamba (`ZambaForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the "zamba"
entry of tests/runtime/hybrid_cases.py: Mamba-1 mixers in two heads, one shared block used by
two hybrid layers; chunked, batched, on a warm prefix cache, preempted, against transformers):
the shared block held once, the state slots and weights estimates, the checkpoint check naming
a missing per-head tensor, 16/32 bits only and tensor-parallel sizes that split its heads
(refused in one line; two ranks: tests/runtime/distributed/test_tp_hybrid.py), and
Zamba-7B-v1's config.json read without weights, its parameters as transformers counts them."""

from __future__ import annotations

import json

import pytest
import torch
from hybrid_cases import check_missing_refused, check_refused

transformers = pytest.importorskip("transformers")

# Zyphra/Zamba-7B-v1's config.json (the fields the runtime reads; transformers' ZambaConfig
# defaults are this checkpoint's): 76 layers, the shared block before layers 2 and 7 + 6k
# (13 uses), attention of 16 heads of 464 over 2 x 3712 channels
ZAMBA_7B = {"architectures": ["ZambaForCausalLM"], "model_type": "zamba",
            "attention_hidden_size": 7424, "attention_head_dim": 464, "attn_layer_offset": 4,
            "attn_layer_period": 6, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "gelu",
            "hidden_mamba_act": "silu", "hidden_size": 3712, "intermediate_size": 14848,
            "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_state": 16,
            "mamba_dt_rank": 232, "mamba_expand": 2, "mamba_proj_bias": False,
            "max_position_embeddings": 4096, "n_mamba_heads": 2, "num_attention_heads": 16,
            "num_hidden_layers": 76, "num_key_value_heads": 16, "pad_token_id": 0,
            "rms_norm_eps": 1e-05, "tie_word_embeddings": True, "vocab_size": 32000}  # fmt: skip


def test_zamba_block_estimates_and_refusals(built):
    """Two hybrid layers share the one block (one object) and keep the KV cache; every layer a
    state slot of two heads; the weights estimate within 2%, the config-only one (`from_shapes`)
    the checkpoint's on one rank and two; a missing per-head tensor named;
    FP8 and a tensor-parallel size that does not divide the Mamba heads refused in one line."""
    from model_bytes import build, check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import memory, weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("zamba", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert m.num_layers == 4 and mc.num_kv_layers == 2 and (m.n_heads, m.head_dim) == (2, 64)
    layers = build(path, torch.float32).layers
    assert layers[1].block is layers[3].block and layers[0].block is None
    check_estimate(path, rel=0.02)
    table = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):  # the config-only count as the checkpoint's (rank 0's: its heads' share)
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert weights.from_shapes(mc, torch.bfloat16, False, tp) == got
    cfg = EngineConfig.create(str(path), device="cpu", dtype="float32", max_num_seqs=8)
    per_layer = 128 * 3 + 2 * 64 * 8  # conv [d_inner, 3], SSM [H, P, N]
    assert memory.check(mc, cfg, path, 256).parts()["Mamba state"] == 8 * 4 * per_layer * 4
    check_missing_refused(loaded, ["model.layers.3.mamba_decoder.mamba.dt_proj_weight"])
    check_refused("zamba", mc)


def test_zamba_7b_config(tmp_path):
    """Zamba-7B-v1: 76 Mamba-1 layers of two heads, 13 after a use of the shared block (the
    default pattern from attn_layer_period / offset); its parameters as transformers counts
    them on the meta device."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(ZAMBA_7B))
    mc = read_model_config(str(tmp_path))
    m = mc.family.mamba
    hybrid = [i for i, h in enumerate(m.zamba2.hybrid) if h]
    assert hybrid == [2, *range(7, 76, 6)] and mc.num_kv_layers == 13
    assert (m.n_heads, m.head_dim, m.dt_rank, mc.head_dim) == (2, 3712, 232, 464)
    assert mc.family.attention_multiplier == 232**-0.5 and not any(mc.family.rope_layers)
    with torch.device("meta"):
        model = transformers.ZambaForCausalLM(transformers.ZambaConfig(**ZAMBA_7B))
    want = sum(p.numel() for p in model.parameters())  # (tied, shared: counted once)
    assert mc.num_params == want
