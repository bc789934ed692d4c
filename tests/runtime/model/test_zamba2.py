"""Zamba2 (`Zamba2ForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the
"zamba2" entry of tests/runtime/hybrid_cases.py: two shared blocks used in turn by three
hybrid layers with LoRA adapters, chunked, batched, on a warm prefix cache, preempted, against
transformers): the shared blocks held once, the exact GELU, the weights estimate, the checkpoint
check naming a missing adapter, 16/32 bits only and tensor-parallel sizes that split its heads
(refused in one line; two ranks: tests/runtime/distributed/test_tp_hybrid.py), and
Zamba2-1.2B's config.json read without weights."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hybrid_cases import check_refused

transformers = pytest.importorskip("transformers")

# Zamba2-1.2B's config.json (the fields the runtime reads): 38 layers, a shared block after
# every sixth Mamba2 layer
TYPES = (["mamba"] * 5 + ["hybrid"]) * 6 + ["mamba"] * 2
SMALL = {"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "adapter_rank": 128,
         "add_bias_linear": False, "attention_head_dim": 256, "chunk_size": 256,
         "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 8192,
         "layers_block_type": TYPES, "mamba_d_conv": 4, "mamba_d_state": 128, "mamba_expand": 2,
         "mamba_headdim": 64, "mamba_ngroups": 1, "max_position_embeddings": 4096,
         "n_mamba_heads": 64, "num_attention_heads": 16, "num_hidden_layers": 38,
         "num_key_value_heads": 16, "num_mem_blocks": 1, "rms_norm_eps": 1e-05,
         "rope_theta": 10000, "time_step_min": 0.001, "use_conv_bias": True,
         "use_long_context": False, "use_mem_rope": True, "use_shared_attention_adapter": False,
         "vocab_size": 32000}  # fmt: skip


def test_zamba2_blocks_estimates_and_refusals(built):
    """Three hybrid layers share two blocks (block 0's weights one object in layers 1 and 4,
    each use with adapters of its own) and keep the KV cache; every layer a state slot; the
    MLP's GELU exact; the weights estimate within 2% (the config-only one within 5% on one rank
    and two); FP8 and a tensor-parallel size that does
    not divide the attention heads refused in one line."""
    from model_bytes import build, check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.model.ops import gelu_and_mul
    from pagoda.runtime.server import memory, weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("zamba2", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert m.num_layers == 5 and mc.num_kv_layers == 3 and mc.head_dim == 32
    assert [m.zamba2.block(i) for i in (1, 3, 4)] == [(0, 0), (1, 1), (0, 2)]
    layers = build(path, torch.float32).layers
    assert layers[1].block is layers[4].block is not layers[3].block
    assert layers[1].gate_up.down is not layers[4].gate_up.down
    assert layers[1].ctx.act_and_mul is gelu_and_mul
    check_estimate(path, rel=0.02)
    table = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):  # the config-only count as the checkpoint's (rank 0's share), but the
        # q/k/v adapters' B held block-diagonal (counted as three)
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert weights.from_shapes(mc, torch.bfloat16, False, tp) == pytest.approx(got, rel=0.05)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="float32", max_num_seqs=8)
    parts = memory.check(mc, cfg, path, 256).parts()
    per_layer = (128 + 2 * 2 * 16) * 3 + 4 * 32 * 16  # conv [conv_dim, 3], SSM [H, P, N]
    assert parts["Mamba state"] == 8 * 5 * per_layer * 4
    check_refused("zamba2", mc)


def test_zamba2_checkpoint_without_an_adapter_is_refused(built, tmp_path):
    from pagoda.runtime.model.loader import read_model_config
    from safetensors.torch import load_file, save_file

    path = built("zamba2", reference=False)[0]
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.shared_transformer.self_attn.linear_k_adapter_list.2.1.weight"
    del tensors[name]  # (the third use's: block 0's second, held by its first use's layer)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    with pytest.raises(ValueError, match=f"missing tensor '{re.escape(name)}'"):
        read_model_config(str(tmp_path))


def test_zamba2_1_2b_config(tmp_path):
    """Zamba2-1.2B: 38 Mamba2 layers (64 heads of 64, d_state 128), 6 of them after a use of
    its one shared block (attention of 16 heads of 256 over 2 x 2048 channels, rotary); 1.2B
    parameters; use_long_context refused in one line."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    mc = read_model_config(str(tmp_path))
    m = mc.family.mamba
    assert m.num_layers == 38 and mc.num_kv_layers == 6 and (m.n_heads, m.head_dim) == (64, 64)
    assert (mc.head_dim, mc.num_heads, mc.intermediate_size) == (256, 16, 8192)
    assert mc.family.attention_multiplier == 128**-0.5 and all(mc.family.rope_layers)
    assert (m.dt_min, m.dt_max, m.zamba2.blocks, m.zamba2.attention_adapters) == (
        0.001,
        float("inf"),
        1,
        False,
    )
    assert 1.15e9 < mc.num_params < 1.25e9
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "use_long_context": True}))
    with pytest.raises(ValueError, match=r"use_long_context .* is not supported"):
        read_model_config(str(tmp_path))


def test_zamba2_copies_under_later_uses_are_not_read(built, tmp_path):
    """A checkpoint that also holds block 0's tensors under its later use's layer (4), as
    exported ones may: the engine reads the first use's (transformers ties the later uses to
    it), and the weights estimate counts them once."""
    from model_bytes import check_estimate
    from safetensors.torch import load_file, save_file

    path = built("zamba2", reference=False)[0]
    tensors = load_file(str(path / "model.safetensors"))
    first = "model.layers.1.shared_transformer."
    copies = {k.replace(first, "model.layers.4.shared_transformer."): v.clone()
              for k, v in tensors.items() if k.startswith(first)}  # fmt: skip
    save_file({**tensors, **copies}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    for f in path.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    check_estimate(tmp_path, rel=0.02)
