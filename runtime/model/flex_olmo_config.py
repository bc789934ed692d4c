"""FlexOlmo's config.json (`FlexOlmoForCausalLM`: allenai/FlexOlmo-7x7B-1T, -RT) as
transformers' FlexOlmoConfig reads it: OLMo 2's layer (norms after attention and the MLP, q and
k each RMS-normalised over the whole projection, the norms scaling in float32) with OLMoE's
experts in every layer (softmax top-k of `num_experts` of `intermediate_size`, renormalised
with `norm_topk_prob`, the weights rounded to the model's dtype): `olmo2.FlexOlmoModel`. Kept
apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from typing import Any

ARCHITECTURES = {"FlexOlmoForCausalLM": "flex_olmo"}
MODEL_CLASSES = {"flex_olmo": ("olmo2", "FlexOlmoModel")}
# transformers' FlexOlmoConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "flex_olmo": {"vocab_size": 100_352, "hidden_size": 4096, "intermediate_size": 11_008,
                  "num_hidden_layers": 32, "num_attention_heads": 32,
                  "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                  "rope_theta": 500_000.0, "eos_token_id": 100_257, "num_experts_per_tok": 5,
                  "num_experts": 7, "norm_topk_prob": False},
}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a FlexOlmo config.json, as transformers reads them."""
    return {
        "olmo2_norms": True,
        "qk_norm_whole": True,
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["intermediate_size"]),
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "round_topk_to_model_dtype": True,
    }
