"""Hy3's config.json (`HYV3ForCausalLM`: tencent/Hy3-preview) as transformers' HYV3Config reads
it. Its model is GLM-4.5's (`model/glm4_moe.py`) with Apertus's attention (an RMSNorm over each
head of q and of k before rotary) and its own router: dense MLPs where `mlp_layer_types` says
(by default the first layer), elsewhere `num_experts` experts picked by float32 sigmoid scores
plus a choice-only `mlp.expert_bias`, weighted by the uncorrected scores renormalised, times
`router_scaling_factor`, beside an ungated `mlp.shared_mlp` of `moe_intermediate_size x
num_shared_experts`; the router stored as `mlp.router.gate` (the names `model/moe_names.py`
keeps). The layers after `num_hidden_layers` (its MTP layer) are not read, as transformers skips
them. Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"HYV3ForCausalLM": "hy_v3"}
MODEL_CLASSES = {"hy_v3": ("glm4_moe", "Glm4MoeModel")}
# transformers' HYV3Config defaults, where config.json leaves one out (its base 11,158,840)
DEFAULTS: dict[str, dict[str, Any]] = {
    "hy_v3": {"vocab_size": 120_832, "hidden_size": 4096, "intermediate_size": 13_312,
              "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
              "num_experts": 192, "num_experts_per_tok": 8, "num_shared_experts": 1,
              "moe_intermediate_size": 1536, "router_scaling_factor": 2.826,
              "rope_theta": 11_158_840.0},
}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Hy3 config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    if cfg.get("mlp_bias"):
        raise ValueError("Hy3 with mlp_bias (biases on the MLPs) is not supported")
    mlp = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    if len(mlp) != n:
        raise ValueError(f"mlp_layer_types names {len(mlp)} layers, the model has {n}")
    width = int(cfg["moe_intermediate_size"])
    routing = ExpertRouting(scoring="sigmoid", correction_bias=True,
                            routed_scaling_factor=float(cfg["router_scaling_factor"]))  # fmt: skip
    return {
        "qk_norm": True,
        "routing": routing,
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": width,
        "norm_topk_prob": True,
        "moe_layers": tuple(t == "sparse" for t in mlp),
        "shared_expert_intermediate_size": width * int(cfg["num_shared_experts"] or 0),
    }
