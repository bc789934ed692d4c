"""Zaya (`ZayaForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the "zaya"
entry of tests/runtime/hybrid_cases.py: q/k from convs of 2 and 3 taps over the conv state,
delayed values, the router state carried from layer to layer, the skip choice, chunked,
batched, on a warm prefix cache, preempted, against transformers): every layer a KV cache and
a conv state, the weights estimate from the tensors and from the shapes alone, the checkpoint
check, what is refused in one line, and ZAYA1-8B's config.json read without weights."""

from __future__ import annotations

import json

import pytest
import torch
from hybrid_cases import check_missing_refused, check_refused
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")

# ZAYA1-8B's shape (its model card: 40 layers, 16 query heads over 2 KV heads of 128, 16
# experts, rotary base 5e6 on half of each head; its config.json's rope_parameters nested by
# layer kind with a stray top-level rope_type, which transformers drops), the rest ZayaConfig's
PUBLISHED = {"architectures": ["ZayaForCausalLM"], "model_type": "zaya", "hidden_size": 2048,
             "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
             "head_dim": 128, "num_experts": 16, "vocab_size": 262_272,
             "rope_parameters": {"rope_type": "default", "hybrid": {
                 "rope_type": "default", "rope_theta": 5_000_000.0,
                 "partial_rotary_factor": 0.5}}}  # fmt: skip


def test_state_slots_estimates_checkpoint_check_and_refusals(built):
    """Every layer keeps a KV cache and a conv state of q, k and half the values over 2 + 3 - 2
    tokens; the weights estimate exact from the tensors and from the shapes alone; the
    checkpoint check names a missing conv, router or scaling tensor; tensor parallelism over
    more ranks than KV heads and FP8 refused in one line (two ranks: test_tp_hybrid.py)."""
    from model_bytes import check_estimate
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("zaya", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert mc.num_kv_layers == m.num_layers == 3 and m.d_conv == 4
    assert m.conv_dim == (4 + 2) * 16 + 2 * 16 // 2 and mc.family.lm_head_bias
    check_estimate(path, rel=1e-6)
    ckpt = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):  # (two ranks: each its heads' q/k and convs, the values whole)
        got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
        shapes = weights.from_shapes(mc, torch.bfloat16, False, tp)  # (the balancing biases,
        assert got - shapes == 3 * 5 * 2, tp  # held in float32, counted in the dtype)
    p = "model.layers.1."
    check_missing_refused(loaded, [p + "self_attn.qkv_proj.conv_qk_grouped.weight",
                                   p + "mlp.gate.router_states_scale",
                                   p + "post_mlp_residual_scale.residual_scale",
                                   "model.input_hidden_states_scale"])  # fmt: skip
    check_refused("zaya", mc)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"num_experts_per_tok": 2}, "zaya num_experts_per_tok must be 1"),
        ({"layer_types": ["hybrid_sliding"], "sliding_window": 8}, r"\['hybrid_sliding'\]"),
        ({"attention_bias": True}, "zaya attention_bias is not supported"),
        ({"cca_time0": 1, "cca_time1": 1}, "must be at least 3, got 2"),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {**PUBLISHED, "num_hidden_layers": 1, **edit}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


def test_zaya1_8b_config_reads_as_transformers_does(tmp_path):
    """The published shape's config.json: the "hybrid" layers' rotary (base 5e6, 64 of 128
    dims rotating), top-1 of 16 experts of 2048, tied; its parameter count as transformers
    counts it on the meta device."""
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED))
    mc = read_model_config(str(tmp_path))
    assert mc.rope_theta == 5_000_000.0 and mc.rope_scaling["partial_rotary_factor"] == 0.5
    f, m = mc.family, mc.family.mamba
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (16, 1, 2048)
    assert mc.tie_word_embeddings and mc.num_kv_layers == 40 and m.d_conv == 3
    assert m.zaya.router_hidden == 256 and m.conv_dim == 18 * 128 + 128
    cfg = transformers.ZayaConfig(**{k: v for k, v in PUBLISHED.items()
                                     if k not in ("architectures", "model_type")})  # fmt: skip
    with torch.device("meta"):
        model = transformers.ZayaForCausalLM(cfg)
    hf = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for b in model.buffers() if b.dim() == 1 and b.numel() == 17
    )
    assert mc.num_params == hf  # (the balancing biases: buffers in the checkpoint)
