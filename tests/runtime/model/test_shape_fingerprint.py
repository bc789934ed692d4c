"""The shape fingerprint a tuned profile records: the dimensions of the config.json that
`pagoda serve` reads, experts and FP8 weights included (a config alone: no weights needed)."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime.model.shape_fingerprint import FINGERPRINT_KEYS, model_fingerprint

MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("quantization_config", "flag", "want"),
    [
        (None, None, "none"),
        (None, "fp8", "fp8"),  # --quantization fp8 on a 16-bit checkpoint
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None, "fp8"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128]}, None, "fp8 block 128x128"),
    ],
)  # fmt: skip
def test_the_fingerprint_of_a_config(tmp_path, quantization_config, flag, want):
    config = {**MIXTRAL, **({"quantization_config": quantization_config}
                            if quantization_config else {})}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes = model_fingerprint(str(tmp_path), flag)
    assert tuple(shapes) == FINGERPRINT_KEYS
    assert shapes == {
        "hidden_size": 64, "intermediate_size": 96, "num_heads": 4, "num_kv_heads": 2,
        "head_dim": 16, "vocab_size": 1000, "num_layers": 3, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 96,
        "shared_expert_intermediate_size": 0, "num_moe_layers": 3, "quantization": want,
        "mlp_matrices": 3,
    }  # fmt: skip


# Qwen/Qwen1.5-MoE-A2.7B's config.json, sizes shrunk, every other field as published
QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 8192,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "use_sliding_window": False,
    "sliding_window": 32768, "max_window_layers": 21, "decoder_sparse_step": 1,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128, "num_experts": 6,
    "num_experts_per_tok": 4, "norm_topk_prob": False, "tie_word_embeddings": False,
    "bos_token_id": 151643, "eos_token_id": 151643,
}  # fmt: skip


@pytest.mark.parametrize(
    "change", [{"shared_expert_intermediate_size": 96}, {"mlp_only_layers": [1, 3]}]
)
def test_qwen2_moe_shapes_that_tune_differently_fingerprint_differently(tmp_path, change):
    """The shared expert's width is a GEMM shape of its own, and a layer in mlp_only_layers runs
    the dense MLP instead of the experts: a profile tuned for one is not the other's."""
    shapes = []
    for name, config in (("a", QWEN2_MOE), ("b", {**QWEN2_MOE, **change})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        shapes.append(model_fingerprint(str(tmp_path / name), None))
    assert shapes[0]["shared_expert_intermediate_size"] == 128
    assert shapes[0]["num_moe_layers"] == 4
    assert shapes[0] != shapes[1]


# deepseek-ai/DeepSeek-V2-Lite's config.json, sizes shrunk, every other field as published
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 163840,
    "aux_loss_alpha": 0.001, "ep_size": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32,
    "moe_intermediate_size": 32, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 8,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_experts_per_tok": 2,
    "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "topk_group": 1, "topk_method": "greedy", "rms_norm_eps": 1e-06,
    "bos_token_id": 100000, "eos_token_id": 100001, "tie_word_embeddings": False,
}  # fmt: skip


def test_latent_attention_shapes_fingerprint_their_ranks(tmp_path):
    """DeepSeek's cache head (one latent row: kv_lora_rank 32 + rope 16), its ungated shared
    experts (2 x 32) and the latent ranks; a q bottleneck is another set of GEMMs."""
    shapes = []
    for name, config in (("a", DEEPSEEK_V2_LITE), ("b", {**DEEPSEEK_V2_LITE, "q_lora_rank": 24})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        shapes.append(model_fingerprint(str(tmp_path / name), None))
    assert shapes[0]["head_dim"] == 48 and shapes[0]["num_kv_heads"] == 1  # one latent row
    assert shapes[0]["shared_expert_intermediate_size"] == 64
    assert shapes[0]["num_moe_layers"] == 2
    assert {k: shapes[0][k] for k in ("q_lora_rank", "kv_lora_rank", "v_head_dim")} == {
        "q_lora_rank": 0, "kv_lora_rank": 32, "v_head_dim": 32}  # fmt: skip
    assert shapes[1]["q_lora_rank"] == 24
