"""Published config.json files at full size (configs alone, no weights) of checkpoints whose
families' own tests hold them shrunk or sparse: Qwen3.5's multimodal wrappers (text_config with
the published `rope_parameters`: interleaved M-RoPE, a quarter of each head rotated), Jamba
1.7 Large, and DeepSeek-V3.2-Exp / GLM-4.7-Flash at their real layer counts, read as
transformers reads them, and their parameter counts as their model cards state them."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")

LIN, FULL = "linear_attention", "full_attention"


def _hybrid_kinds(n: int) -> list[str]:
    return [FULL if i % 4 == 3 else LIN for i in range(n)]


# Qwen/Qwen3.5-35B-A3B's config.json (vision_config trimmed to its keys): the text shapes are
# transformers' Qwen3_5MoeTextConfig defaults (`@auto_docstring(checkpoint="Qwen/Qwen3.5-35B-
# A3B")` in transformers/models/qwen3_5_moe/configuration_qwen3_5_moe.py) and a vendored copy
# of that class on GitHub with the same defaults; the published keys beyond them (the M-RoPE
# rope_parameters with theta 1e7, eos 248044, mtp_*, mamba_ssm_dtype, the wrapper's token ids)
# as the hub's file has them (transcribed, not fetched in this session)
QWEN3_5_35B_A3B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054, "tie_word_embeddings": False,
    "vision_config": {"model_type": "qwen3_5_moe", "deepstack_visual_indexes": [], "depth": 27,
                      "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "in_channels": 3,
                      "intermediate_size": 4304, "num_heads": 16, "num_position_embeddings": 2304,
                      "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2},
    "text_config": {
        "model_type": "qwen3_5_moe_text", "attention_bias": False, "attention_dropout": 0.0,
        "attn_output_gate": True, "dtype": "bfloat16", "eos_token_id": 248044,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "layer_types": _hybrid_kinds(40), "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144, "moe_intermediate_size": 512,
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
        "num_hidden_layers": 40, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
        "use_cache": True, "vocab_size": 248320,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                            "rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25},
    },
}  # fmt: skip
# Qwen/Qwen3.5-27B's: the dense wrapper; its shapes (64 layers, hidden 5120, MLP 17408, 24
# heads over 4 KV heads of 256, untied, theta 1e7, a quarter rotated) as THUDM/slime's
# scripts/models/qwen3.5-27B.sh gives them, the DeltaNet heads (16 key, 48 value of 128) as
# the hub's file has them (transcribed)
QWEN3_5_27B = json.loads(json.dumps(QWEN3_5_35B_A3B))
QWEN3_5_27B.update(architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5")
QWEN3_5_27B["vision_config"].update(model_type="qwen3_5", out_hidden_size=5120)
for _k in ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "router_aux_loss_coef",
           "shared_expert_intermediate_size"):  # fmt: skip
    del QWEN3_5_27B["text_config"][_k]
QWEN3_5_27B["text_config"].update(
    model_type="qwen3_5_text", hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
    layer_types=_hybrid_kinds(64), num_attention_heads=24, num_key_value_heads=4,
    linear_num_value_heads=48)  # fmt: skip
# ai21labs/AI21-Jamba-Large-1.7's config.json (transcribed from the hub, not fetched in this
# session; 1.5 Large's alike): 72 layers, attention at 4 + 8k, experts on the odd layers
JAMBA_LARGE_1_7 = {
    "architectures": ["JambaForCausalLM"], "model_type": "jamba", "attention_dropout": 0.0,
    "attn_layer_offset": 4, "attn_layer_period": 8, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 0, "expert_layer_offset": 1, "expert_layer_period": 2, "hidden_act": "silu",
    "hidden_size": 8192, "initializer_range": 0.02, "intermediate_size": 24576,
    "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_dt_rank": 512,
    "mamba_expand": 2, "mamba_proj_bias": False, "max_position_embeddings": 262144,
    "num_attention_heads": 64, "num_experts": 16, "num_experts_per_tok": 2,
    "num_hidden_layers": 72, "num_key_value_heads": 8, "num_logits_to_keep": 1,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_mamba_kernels": True, "vocab_size": 65536,
}  # fmt: skip


def _read(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return read_model_config(str(tmp_path)), transformers.AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("cfg", "tied", "params"),
    [(QWEN3_5_35B_A3B, False, (34e9, 36e9)), (QWEN3_5_27B, False, (26e9, 28e9)),
     (QWEN3_5_27B, True, (25e9, 28e9))],
    ids=["35b-a3b", "27b", "27b-tied-on-top"],
)  # fmt: skip
def test_published_qwen3_5_wrappers_read_as_transformers_reads_them(tmp_path, cfg, tied, params):
    """The text config under the multimodal wrapper: heads, head size, the DeltaNet layers
    where transformers' layer_types say linear, the gate on attention, the experts, the
    M-RoPE rope_parameters (theta 1e7, a quarter rotated, interleaved sections), eos, and the
    tie the wrapper's top level names (the small checkpoints tie there, not in text_config),
    as transformers reads them; the text model's size (the vision tower and MTP layer not
    counted)."""
    cfg = {**cfg, "tie_word_embeddings": tied}
    o, top = _read(tmp_path, cfg)
    t = top.get_text_config()
    rope = t.rope_parameters
    assert o.architecture == cfg["model_type"]
    assert (o.num_heads, o.num_kv_heads, o.head_dim, o.num_layers, o.vocab_size) == (
        t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.num_hidden_layers,
        t.vocab_size)  # fmt: skip
    m = o.family.mamba
    assert m.mixer == "gated_deltanet" and m.attn_output_gate == t.attn_output_gate
    assert m.layers == tuple(k == LIN for k in t.layer_types)
    assert o.num_kv_layers == t.layer_types.count(FULL)
    assert (m.n_groups, m.n_heads, m.d_state, m.head_dim, m.d_conv) == (
        t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim,
        t.linear_value_head_dim, t.linear_conv_kernel_dim)  # fmt: skip
    assert o.family.num_experts == (getattr(t, "num_experts", None) or 0)
    if o.family.num_experts:
        f = o.family
        assert (f.num_experts_per_tok, f.moe_intermediate_size,
                f.shared_expert_intermediate_size) == (
            t.num_experts_per_tok, t.moe_intermediate_size, t.shared_expert_intermediate_size)  # fmt: skip
    assert o.rope_theta == rope["rope_theta"] == 1e7
    assert o.rope_scaling["partial_rotary_factor"] == rope["partial_rotary_factor"] == 0.25
    assert o.rope_scaling["mrope_section"] == rope["mrope_section"]
    assert (o.rms_norm_eps, o.max_position_embeddings) == (t.rms_norm_eps,
                                                           t.max_position_embeddings)  # fmt: skip
    assert list(o.eos_token_ids) == [t.eos_token_id] == [248044]
    assert o.tie_word_embeddings == top.tie_word_embeddings == tied
    assert params[0] < o.num_params < params[1], o.num_params


def test_published_jamba_large_1_7_reads_as_transformers_reads_it(tmp_path):
    """Jamba 1.7 Large at full size: attention on 9 of 72 layers (4 + 8k), 16 experts (top 2)
    on the odd layers, Mamba-1's sizes (inner 16384, dt rank 512), as transformers reads them;
    398B parameters, as AI21's model card states."""
    o, t = _read(tmp_path, JAMBA_LARGE_1_7)
    m = o.family.mamba
    assert m.mixer == "mamba1"
    assert m.layers == tuple(k == "mamba" for k in t.layers_block_type)
    assert o.num_kv_layers == t.layers_block_type.count("attention") == 9
    assert o.family.moe_layers == tuple(n > 1 for n in t.layers_num_experts)
    assert (o.family.num_experts, o.family.num_experts_per_tok) == (16, 2)
    assert (m.dt_rank, m.d_state, m.d_conv) == (t.mamba_dt_rank, t.mamba_d_state, t.mamba_d_conv)
    assert m.n_heads * m.head_dim == t.mamba_expand * t.hidden_size
    assert (o.num_heads, o.num_kv_heads, o.head_dim) == (64, t.num_key_value_heads, 128)
    assert (list(o.eos_token_ids), o.tie_word_embeddings) == ([t.eos_token_id], False)
    assert 397e9 < o.num_params < 400e9, o.num_params


def test_deepseek_v3_2_exp_and_glm_4_7_flash_at_their_layer_counts(tmp_path):
    """The configs test_dsa.py and test_deepseek.py hold shrunk to 4 layers, at the hub's layer
    counts (61: three dense, 58 of experts; 47: one dense, 46 of experts): the experts' layers
    as transformers derives them, and 671B / 30B parameters (the MTP layer not counted), as
    their model cards state."""
    from test_deepseek import GLM47_FLASH
    from test_dsa import V32_EXP

    for cfg, layers, dense, lo, hi in ((V32_EXP, 61, 3, 670e9, 673e9),
                                       (GLM47_FLASH, 47, 1, 29e9, 31e9)):  # fmt: skip
        d = tmp_path / cfg["model_type"]
        d.mkdir()
        o, t = _read(d, {**cfg, "num_hidden_layers": layers})
        assert o.num_layers == layers == len(o.family.moe_layers)
        assert o.family.moe_layers == tuple(k == "sparse" for k in t.mlp_layer_types)
        assert o.family.moe_layers == (False,) * dense + (True,) * (layers - dense)
        assert lo < o.num_params < hi, (cfg["model_type"], o.num_params)
