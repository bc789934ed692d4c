"""xLSTM (`xLSTMForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the "xlstm"
entry of tests/runtime/hybrid_cases.py: mLSTM layers and SwiGLU FFNs, chunked, batched, on a
warm prefix cache, preempted, against transformers): the state slots and weights estimates, the
checkpoint check naming a missing gate, 16/32 bits only and a tensor-parallel size that does not
divide the heads (refused in one line), the same weights stored as `weight_mode` "fused"
(xLSTM-7b's form) reading alike, both forms on two tensor-parallel ranks, and xLSTM-7b's
config.json read without weights, its parameters as transformers counts them."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import check, generate, prompts
from hybrid_cases import check_missing_refused, check_refused

transformers = pytest.importorskip("transformers")

# NX-AI/xLSTM-7b's config.json (the fields the runtime reads; transcribed, not fetched in this
# session): 32 blocks of 4096, 8 heads, q/k half as wide as v, the projections fused, untied
XLSTM_7B = {"architectures": ["xLSTMForCausalLM"], "model_type": "xlstm", "vocab_size": 50304,
            "embedding_dim": 4096, "hidden_size": 4096, "num_blocks": 32,
            "num_hidden_layers": 32, "num_heads": 8, "use_bias": False, "add_out_norm": True,
            "norm_eps": 1e-6, "qk_dim_factor": 0.5, "v_dim_factor": 1.0, "eps": 1e-6,
            "ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64, "gate_soft_cap": 15.0,
            "output_logit_soft_cap": 30.0, "weight_mode": "fused", "tie_word_embeddings": False,
            "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}  # fmt: skip


def test_xlstm_estimates_and_refusals(built):
    """No KV cache; per layer and sequence C, n and m (float32) and no conv state; the weights
    estimate within 2%; a missing gate named; 4 ranks (2 heads) and FP8 refused in one line."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import memory

    path, _, loaded, _ = built("xlstm", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert mc.num_kv_layers == 0 and (m.n_heads, m.d_state, m.head_dim) == (2, 16, 32)
    check_estimate(path, rel=0.02)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    per_layer = 2 * 16 * (32 + 2) * 4  # C [H, dqk, dv], n and m beside it, float32
    assert memory.check(mc, cfg, path, 256).parts()["Mamba state"] == 8 * 2 * per_layer
    check_missing_refused(loaded, ["model.layers.1.mlstm_layer.fgate_preact.bias"])
    check_refused("xlstm", mc)


def test_xlstm_fused_weights_read_alike(built, tmp_path):
    """The tiny checkpoint's tensors stored as `weight_mode` "fused" (q/k/v/o as
    `qkv_opreact`, the gates as `ifgate_preact`, the FFN's gate and up as `proj_up_gate_z`;
    transformers cannot build that form at random: its init mixes the halves' shapes): the
    engine reads it as transformers' tokens and logits of the unfused model."""
    from pagoda.runtime import LLM

    path, _, _, reference = built("xlstm")
    loaded = _fused(path, tmp_path)
    assert loaded.config.family.mamba.fused_projections
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=3)
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"xlstm fused: prompt {i}")


def _fused(path, out):
    """The checkpoint at `path` written to `out` in `weight_mode` "fused", loaded."""
    from pagoda.runtime.model.loader import load_model
    from safetensors.torch import load_file, save_file

    t = load_file(str(path / "model.safetensors"))
    for i in range(2):
        p, f = f"backbone.blocks.{i}.mlstm_layer.", f"backbone.blocks.{i}.ffn."
        parts = [t.pop(p + n + ".weight") for n in ("q", "k", "v", "ogate_preact")]
        t[p + "qkv_opreact.weight"] = torch.cat(parts)
        for kind in ("weight", "bias"):
            gates = [t.pop(f"{p}{g}_preact.{kind}") for g in ("igate", "fgate")]
            t[f"{p}ifgate_preact.{kind}"] = torch.cat(gates)
        up = [t.pop(f + n + ".weight") for n in ("proj_up_gate", "proj_up")]
        t[f + "proj_up_gate_z.weight"] = torch.cat(up)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in path.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((path / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "weight_mode": "fused"}))
    return load_model(str(out))


@pytest.mark.slow  # second processes (gloo)
def test_two_ranks_match_transformers(built, tmp_path):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank one head's
    rows of q, k, v, the output gate and both gates, its norm channels and C, n, m slots,
    out_proj's columns, the FFN's rows; transformers' tokens and logits; rank 0's weights
    estimate; the fused form (its matrices' parts each split) too."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("xlstm")
    m = loaded.config.family.mamba
    assert m.on_ranks(2).ssm_shape == (1, m.d_state, m.head_dim + 2)
    check_two_ranks(path, loaded, reference, "xlstm")
    check_estimate(path, 2, rel=0)
    fused = _fused(path, tmp_path)
    check_two_ranks(tmp_path, fused, reference, "xlstm fused")


def test_xlstm_7b_config(tmp_path):
    """xLSTM-7b: 32 mLSTM layers of 8 heads (q/k 256, v 512 a head), the FFN 10944 wide; its
    parameters as transformers counts them on the meta device (built "single": transformers'
    random init of the fused form fails, the count is the same)."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(XLSTM_7B))
    mc = read_model_config(str(tmp_path))
    m = mc.family.mamba
    assert (m.num_layers, m.n_heads, m.d_state, m.head_dim) == (32, 8, 256, 512)
    assert mc.intermediate_size == 10944 and m.fused_projections and mc.num_kv_layers == 0
    with torch.device("meta"):
        config = transformers.xLSTMConfig(**{**XLSTM_7B, "weight_mode": "single"})
        model = transformers.xLSTMForCausalLM(config)
    assert mc.num_params == sum(p.numel() for p in model.parameters())
