"""Solar Open's config.json (`SolarOpenForCausalLM`: upstage/Solar-Open-100B) as transformers'
SolarOpenConfig reads it. Its model is GLM-4.5's (`model/glm4_moe.py`) without the q/k norms
and with experts in every layer: Llama's attention (q/k/v biases where `attention_bias` says,
the whole head rotating unless `rope_parameters` names a `partial_rotary_factor`), then
DeepSeek-V3's router (`moe_routing.GroupedRouter`: float32 sigmoid scores, the correction bias
`mlp.gate.e_score_correction_bias` for the choice, `n_group` / `topk_group`, `norm_topk_prob`,
`routed_scaling_factor`) beside an ungated shared MLP of `moe_intermediate_size x
n_shared_experts`. Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model import glm4_moe_config

ARCHITECTURES = {"SolarOpenForCausalLM": "solar_open"}
MODEL_CLASSES = {"solar_open": ("glm4_moe", "Glm4MoeModel")}
# transformers' SolarOpenConfig defaults, where config.json leaves one out (its base 1e6)
DEFAULTS: dict[str, dict[str, Any]] = {
    "solar_open": {"vocab_size": 196_608, "hidden_size": 4096, "num_hidden_layers": 48,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
                   "moe_intermediate_size": 1280, "num_experts_per_tok": 8,
                   "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0,
                   "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                   "rope_theta": 1_000_000.0},
}  # fmt: skip
PARTIAL_ROTARY = ("solar_open",)  # (rope_parameters' partial_rotary_factor, 1 by default)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Solar Open config.json (its layers: `n`), as transformers
    reads them: GLM-4.5's with no dense layers and no q/k norms."""
    return glm4_moe_config.family_fields(
        {**cfg, "first_k_dense_replace": 0, "use_qk_norm": False}, n
    )
