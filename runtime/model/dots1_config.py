"""dots.llm1's config.json (`Dots1ForCausalLM`: rednote-hilab/dots.llm1.base, dots.llm1.inst) as
transformers' Dots1Config reads it. Its model is GLM-4.5's (`model/glm4_moe.py`) with the
per-head q/k RMSNorms always on and the whole head rotating: Llama's attention (optional q/k/v
biases, `attention_bias`), dense MLPs in the first `first_k_dense_replace` layers, then
DeepSeek-V3's router (`moe_routing.GroupedRouter`: float32 sigmoid scores, the correction bias
for the choice, `n_group` / `topk_group`, `norm_topk_prob`, `routed_scaling_factor`) beside an
ungated shared MLP of `moe_intermediate_size x n_shared_experts`. A sliding window is on the
`layer_types` layers that say so (by default those from `max_window_layers` on, where
`sliding_window` is set: transformers reads no `use_sliding_window`)."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model import glm4_moe_config

ARCHITECTURES = {"Dots1ForCausalLM": "dots1"}
MODEL_CLASSES = {"dots1": ("glm4_moe", "Glm4MoeModel")}
# transformers' Dots1Config defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "dots1": {"vocab_size": 152_064, "hidden_size": 4608, "intermediate_size": 10_944,
              "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_attention_heads": 32,
              "num_key_value_heads": 32, "n_group": 1, "topk_group": 1,
              "first_k_dense_replace": 0, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "sliding_window": 4096,
              "max_window_layers": 62},
}  # fmt: skip
NULLABLE = {"dots1": ("sliding_window",)}  # null: no window (not the default 4096)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a dots.llm1 config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    for key in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok"):
        if cfg.get(key) is None:  # Dots1Config's None: its model cannot be built without them
            raise ValueError(f"config.json lacks {key!r}, which a dots1 model needs")
    fields = glm4_moe_config.family_fields({**cfg, "use_qk_norm": True}, n)
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types") or [
        "sliding_attention" if window is not None and i >= int(cfg["max_window_layers"])
        else "full_attention" for i in range(n)
    ]  # fmt: skip
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    sliding = tuple(t == "sliding_attention" for t in types)
    if any(sliding) and window is None:
        raise ValueError("dots1 layer_types names sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    on = any(sliding)
    return {**fields, "sliding_window": int(window) if on else None,
            "window_layers": sliding if on else ()}  # fmt: skip
