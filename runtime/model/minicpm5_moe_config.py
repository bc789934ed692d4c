"""MiniCPM5-MoE's config.json (`MiniCPM5MoeForCausalLM`, and the older `MiniCPM5MoEForCausalLM`:
openbmb/MiniCPM5-15B-A2.5B) as transformers' MiniCPM5MoeConfig (GLM-4.5's config) reads it. Its
model is GLM-4.5's (`model/glm4_moe.py`: DeepSeek-V3's router and experts) with Llama's
attention gated as Qwen3-Next's: q_proj gives each head's query and then its output gate
(`qwen3.GatedQuery`), no q/k norms, the whole head rotating (base 5e6 by default). Dense MLPs
where `mlp_layer_types` says (by default the first `first_k_dense_replace`, 1), elsewhere
`n_routed_experts` experts by float32 sigmoid scores plus the choice-only
`mlp.gate.e_score_correction_bias` (`n_group` / `topk_group`), renormalised, times
`routed_scaling_factor`, beside an ungated shared MLP of `moe_intermediate_size x
n_shared_experts`. Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pagoda.runtime.model import glm4_moe_config

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"MiniCPM5MoeForCausalLM": "minicpm5_moe", "MiniCPM5MoEForCausalLM": "minicpm5_moe"}
MODEL_CLASSES = {"minicpm5_moe": ("glm4_moe", "MiniCPM5MoeModel")}
# transformers' MiniCPM5MoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "minicpm5_moe": {"vocab_size": 130_560, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 28, "num_attention_heads": 32,
                     "num_key_value_heads": 2, "head_dim": 128,
                     "max_position_embeddings": 524_288, "rms_norm_eps": 1e-6,
                     "moe_intermediate_size": 512, "num_experts_per_tok": 16,
                     "n_shared_experts": 1, "n_routed_experts": 160,
                     "routed_scaling_factor": 3.66, "n_group": 1, "topk_group": 1,
                     "norm_topk_prob": True, "first_k_dense_replace": 1,
                     "rope_theta": 5_000_000.0, "bos_token_id": 0, "eos_token_id": [1, 130073]},
}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a MiniCPM5-MoE config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    if cfg.get("use_gated_attention") is False:  # (transformers refuses it too)
        raise ValueError("minicpm5_moe use_gated_attention false is not supported (its "
                         "attention is always gated)")  # fmt: skip
    if cfg.get("attention_bias"):
        raise ValueError("minicpm5_moe attention_bias (biases on the gated q_proj) is not "
                         "supported")  # fmt: skip
    dense = int(cfg["first_k_dense_replace"])
    mlp = cfg.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(n)]
    if len(mlp) != n:
        raise ValueError(f"minicpm5_moe mlp_layer_types names {len(mlp)} layers, the model "
                         f"has {n}")  # fmt: skip
    fields = glm4_moe_config.family_fields({**cfg, "use_qk_norm": False}, n)
    return {**fields, "moe_layers": tuple(t == "sparse" for t in mlp)}


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its q_proj in `checkpoint_shapes.expected_shapes`' tensors: each head's query, then its
    gate."""
    for i in range(c.num_layers):
        out[f"model.layers.{i}.self_attn.q_proj.weight"] = (2 * c.num_heads * c.head_dim,
                                                           c.hidden_size)  # fmt: skip


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of q_proj, its heads' queries and then their output gates
    (`qwen3.GatedQuery`), or None for the other tensors (`distributed/tp_families.py`)."""
    if not re.search(r"\bq_proj\.(weight|bias)$", part):
        return None
    q0, q1 = lay.heads(c.num_heads)
    return (q1 - q0) * c.head_dim * 2, cols
