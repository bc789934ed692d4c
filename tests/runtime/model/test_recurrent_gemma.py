"""RecurrentGemma (`RecurrentGemmaForCausalLM`) beyond the token-for-token case of
test_hybrid_ssm.py (the "recurrent-gemma" entry of tests/runtime/hybrid_cases.py: RG-LRU blocks
beside local attention, chunked, batched, on a warm prefix cache, preempted, against
transformers): the state slots and weights estimates, the checkpoint check naming a missing
gate, 16/32 bits only (FP8 refused in one line; two ranks: tests/runtime/distributed/test_tp_hybrid.py), and recurrentgemma-2b's config.json
read without weights, its parameters as transformers counts them."""

from __future__ import annotations

import json

import pytest
import torch
from hybrid_cases import check_missing_refused, check_refused

transformers = pytest.importorskip("transformers")

# google/recurrentgemma-2b's config.json (transcribed, not fetched in this session; its shapes
# are the model card's 2.7B parameters: 26 layers, two recurrent blocks then local attention,
# one KV head of 256, the MLP 15360 / 2 wide)
RG_2B = {"architectures": ["RecurrentGemmaForCausalLM"], "model_type": "recurrent_gemma",
         "attention_bias": False, "attention_window_size": 2048,
         "block_types": ["recurrent", "recurrent", "attention"], "bos_token_id": 2,
         "conv1d_width": 4, "eos_token_id": 1, "hidden_activation": "gelu_pytorch_tanh",
         "hidden_size": 2560, "intermediate_size": 15360, "logits_soft_cap": 30.0,
         "lru_width": 2560, "num_attention_heads": 10, "num_hidden_layers": 26,
         "num_key_value_heads": 1, "pad_token_id": 0, "partial_rotary_factor": 0.5,
         "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "vocab_size": 256000}  # fmt: skip


def test_recurrent_gemma_estimates_and_refusals(built):
    """The recurrent layers keep a conv state and a float32 h per sequence, the attention
    layer a KV cache (its window); the weights estimate within 2%; a missing gate named;
    3 ranks (which do not divide its heads) and FP8 refused in one line."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import memory

    path, _, loaded, _ = built("recurrent-gemma", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert m.layers == (True, False, True) and mc.num_kv_layers == 1
    assert mc.family.window(1) == 8 and mc.intermediate_size == 96
    check_estimate(path, rel=0.02)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    per_layer = 64 * 3 * 2 + 64 * 4  # conv [lru_width, 3] in bf16, h [lru_width] in float32
    assert memory.check(mc, cfg, path, 256).parts()["Mamba state"] == 8 * 2 * per_layer
    gate = "model.layers.2.temporal_block.rg_lru.recurrent_gate_weight"
    check_missing_refused(
        loaded, [gate, "model.layers.1.self_attn.o_proj.bias"]
    )  # (read as Llama's)
    check_refused("recurrent-gemma", mc)


def test_recurrent_gemma_2b_config(tmp_path):
    """recurrentgemma-2b: 18 recurrent layers, 8 local attention ones (window 2048, half of
    each head rotated), the logits capped at 30; its parameters as transformers counts them on
    the meta device."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(RG_2B))
    mc = read_model_config(str(tmp_path))
    m, f = mc.family.mamba, mc.family
    assert m.num_layers == 18 and mc.num_kv_layers == 8 and (m.n_heads, m.head_dim) == (10, 256)
    assert (mc.head_dim, mc.num_kv_heads, mc.intermediate_size) == (256, 1, 7680)
    assert f.window(2) == 2048 and f.window(0) is None and f.final_logit_softcapping == 30.0
    assert mc.rope_scaling["partial_rotary_factor"] == 0.5
    with torch.device("meta"):
        config = transformers.RecurrentGemmaConfig(**RG_2B)
        model = transformers.RecurrentGemmaForCausalLM(config)
    want = sum(p.numel() for p in model.parameters())  # (tied: counted once)
    assert mc.num_params == want
