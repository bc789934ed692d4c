"""Mellum's config.json (`MellumForCausalLM`: JetBrains/Mellum2-12B-A2.5B) as transformers'
MellumConfig (Qwen3-MoE's config) reads it. Its model is Qwen3-MoE's (`moe.Qwen3MoeModel`: per-head
q/k norms, experts by the softmax of the router's logits, top-k renormalised where
`norm_topk_prob`, rounded to the model's dtype) with Laguna's decoder layer (no gate, no shared
expert): attention by layer kind (`layer_types`, by default all "full_attention"), the sliding
layers seeing `sliding_window` keys and rotating by their own base (`rope_parameters`'
"sliding_attention": `FamilyConfig.local_rope_theta`), the full layers by theirs, over the
whole head (transformers' Qwen3-MoE attention cannot run a `partial_rotary_factor`: refused,
one line); a dense MLP of `intermediate_size` where
`mlp_layer_types` says "dense" (by default none). The multi-token-prediction layer (`mtp.`) is
not read, as transformers skips it. Kept apart from the model so that reading a config imports
no layer code."""

from __future__ import annotations

from typing import Any

ARCHITECTURES = {"MellumForCausalLM": "mellum"}
MODEL_CLASSES = {"mellum": ("moe", "Qwen3MoeModel")}
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' MellumConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "mellum": {"vocab_size": 98_304, "hidden_size": 2304, "intermediate_size": 7168,
               "num_hidden_layers": 28, "num_attention_heads": 32, "num_key_value_heads": 4,
               "head_dim": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
               "sliding_window": 1024, "num_local_experts": 64, "num_experts_per_tok": 8,
               "moe_intermediate_size": 896, "norm_topk_prob": True},
}  # fmt: skip
NULLABLE = {"mellum": ("sliding_window",)}
DEFAULT_ROPE = {
    FULL: {"rope_type": "default", "rope_theta": 500_000.0},
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Mellum config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    types = cfg.get("layer_types") or [FULL] * n
    mlp = cfg.get("mlp_layer_types") or ["sparse"] * n
    for name, v in (("layer_types", types), ("mlp_layer_types", mlp)):
        if len(v) != n:
            raise ValueError(f"mellum {name} names {len(v)} layers, the model has {n}")
    sliding = tuple(t == SLIDING for t in types)
    local = (cfg.get("rope_parameters") or DEFAULT_ROPE).get(SLIDING) or DEFAULT_ROPE[SLIDING]
    if any(sliding) and (local.get("rope_type", "default") != "default"
                         or float(local.get("partial_rotary_factor") or 1.0) != 1.0):  # fmt: skip
        raise ValueError(f"mellum's sliding_attention rotary {local} is not supported (the "
                         "default one over the whole head)")  # fmt: skip
    if any(sliding) and cfg.get("sliding_window") is None:
        raise ValueError("mellum's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    experts = cfg.get("num_experts") or cfg["num_local_experts"]  # (the hub's key, or ours)
    fields: dict[str, Any] = {
        "qk_norm": True,
        "num_experts": int(experts),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "round_topk_to_model_dtype": True,
        "moe_layers": tuple(t == "sparse" for t in mlp),
        "sliding_window": None,
        "window_layers": (),
    }
    if any(sliding):
        fields.update(sliding_window=int(cfg["sliding_window"]), window_layers=sliding,
                      local_rope_theta=float(local.get("rope_theta") or 10_000.0))  # fmt: skip
    return fields
