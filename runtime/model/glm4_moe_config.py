"""GLM-4.5 / GLM-4.6's config.json (`Glm4MoeForCausalLM`: zai-org/GLM-4.5, GLM-4.5-Air,
GLM-4.6) as transformers' Glm4MoeConfig reads it: the `FamilyConfig` fields `model/glm4_moe.py`
runs. Kept apart from the model so that reading a config imports no layer code.

- attention: Llama's with q/k/v biases (`attention_bias`), an optional RMSNorm over each head of
  q and k before rotary (`use_qk_norm`: GLM-4.5 and 4.6 set it, Air does not), and a partial
  rotary (`partial_rotary_factor`, 0.5 by default) in the rotate-half layout over the first
  dims of each head (unlike GLM-4's interleaved pairs);
- MLP: dense in the first `first_k_dense_replace` layers, then routed experts picked by
  DeepSeek-V3's router (`moe_routing.GroupedRouter`: sigmoid scores, `e_score_correction_bias`
  for the choice, `n_group` / `topk_group`, `norm_topk_prob`, `routed_scaling_factor`) plus an
  ungated shared MLP of `moe_intermediate_size x n_shared_experts`;
- the multi-token-prediction layers the released checkpoints carry after the decoder
  (`num_nextn_predict_layers`: `model.layers.{num_hidden_layers}...`) are not read, as
  transformers skips them: the checks and the weights estimate look at layers below
  `num_hidden_layers` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"Glm4MoeForCausalLM": "glm4_moe"}
# transformers' Glm4MoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "glm4_moe": {"partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5,
                 "max_position_embeddings": 131_072, "n_routed_experts": 128,
                 "n_shared_experts": 1, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
                 "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                 "norm_topk_prob": True, "routed_scaling_factor": 1.0},
}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """`FamilyConfig` fields of a GLM-4.5 config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    experts = int(cfg["n_routed_experts"])
    groups = int(cfg["n_group"])
    if experts % groups or experts // groups < 2:
        raise ValueError(f"n_group {groups} must divide the {experts} routed experts into "
                         "groups of two or more (a group is scored by its best two)")  # fmt: skip
    routing = ExpertRouting(
        scoring="sigmoid",
        topk_method="noaux_tc",
        n_group=groups,
        topk_group=int(cfg["topk_group"]),
        routed_scaling_factor=float(cfg["routed_scaling_factor"]),
    )
    dense = int(cfg["first_k_dense_replace"])
    moe_width = int(cfg["moe_intermediate_size"])
    return {
        "qk_norm": bool(cfg.get("use_qk_norm", False)),
        "routing": routing,
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": moe_width,
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "moe_layers": tuple(i >= dense for i in range(n)),
        "shared_expert_intermediate_size": moe_width * int(cfg["n_shared_experts"]),
    }
