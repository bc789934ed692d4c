"""Cohere 2 MoE's config.json (`Cohere2MoeForCausalLM`) as transformers' Cohere2MoeConfig reads
it: Cohere 2's layer (`model/cohere.py`: one norm, attention and the MLP side by side, the
rotary interleaved, `logit_scale`, tied embeddings) with

- the norms Llama's RMSNorm where `rms_norm_eps` is set, else Cohere's LayerNorm
  (`layer_norm_eps`): `FamilyConfig.cohere_rms_norm`;
- window layers by `layer_types` (by default every `sliding_window_pattern`-th global, the
  first `first_k_dense_replace` layers by `prefix_dense_sliding_window_pattern`) rotating, the
  global ones without rotary unless they are dense with a prefix pattern of 1 (transformers'
  `force_rope`);
- dense MLPs of `prefix_dense_intermediate_size` (else `intermediate_size`) where
  `mlp_layer_types` says "dense" (by default the first `first_k_dense_replace`), elsewhere
  `num_experts` experts of `intermediate_size` picked by the top-k router logits, weighted by
  their softmax (`expert_selection_fn` softmax: the renormalised top-k of a full softmax) or
  sigmoid (renormalised with `norm_topk_prob`), beside an ungated shared MLP of
  `intermediate_size` x `num_shared_experts` added (`shared_expert_combination_strategy` sum)
  or averaged with them.

`cohere2_moe.Cohere2MoeModel` runs it. Kept apart from the model so that reading a config imports
no layer code.
"""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"Cohere2MoeForCausalLM": "cohere2_moe"}
MODEL_CLASSES = {"cohere2_moe": ("cohere", "Cohere2MoeModel")}
# transformers' Cohere2MoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "cohere2_moe": {"vocab_size": 256_000, "hidden_size": 8192, "intermediate_size": 22_528,
                    "logit_scale": 0.0625, "num_hidden_layers": 40, "num_attention_heads": 64,
                    "head_dim": 128, "max_position_embeddings": 8192, "layer_norm_eps": 1e-5,
                    "bos_token_id": 5, "eos_token_id": 255_001, "tie_word_embeddings": True,
                    "sliding_window": 4096, "num_experts_per_tok": 2, "num_experts": 8,
                    "num_shared_experts": 0, "shared_expert_combination_strategy": "average",
                    "expert_selection_fn": "softmax", "prefix_dense_sliding_window_pattern": 1,
                    "norm_topk_prob": True, "sliding_window_pattern": 4},
}  # fmt: skip
NULLABLE = {"cohere2_moe": ("sliding_window",)}
EPS = {"cohere2_moe": "norm_eps"}  # (`config_keys.derived`: rms_norm_eps, else layer_norm_eps)


def layer_kinds(cfg, n: int) -> tuple[list[str], list[str]]:
    """(layer_types, mlp_layer_types) as Cohere2MoeConfig derives the ones config.json leaves
    out (from `first_k_dense_replace` and the two window patterns)."""
    dense = int(cfg.get("first_k_dense_replace") or 0)
    types = cfg.get("layer_types")
    if types is None:
        prefix, rest = int(cfg["prefix_dense_sliding_window_pattern"]), int(
            cfg["sliding_window_pattern"])  # fmt: skip
        types = [("sliding_attention" if (i + 1) % prefix else "full_attention")
                 for i in range(dense)] + [
                    ("sliding_attention" if (i + 1) % rest else "full_attention")
                    for i in range(n - dense)]  # fmt: skip
    mlp = cfg.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(n)]
    for name, kinds in (("layer_types", types), ("mlp_layer_types", mlp)):
        if len(kinds) != n:
            raise ValueError(f"{name} names {len(kinds)} layers, the model has {n}")
    return list(types), list(mlp)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Cohere 2 MoE config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    types, mlp = layer_kinds(cfg, n)
    sliding = tuple(t == "sliding_attention" for t in types)
    window = cfg.get("sliding_window")
    if any(sliding) and window is None:
        raise ValueError("Cohere 2 MoE's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    force = int(cfg["prefix_dense_sliding_window_pattern"]) == 1
    select, combine = cfg["expert_selection_fn"], cfg["shared_expert_combination_strategy"]
    if select not in ("softmax", "sigmoid"):
        raise ValueError(f"expert_selection_fn must be softmax or sigmoid, got {select!r}")
    if combine not in ("sum", "average"):
        raise ValueError(f"shared_expert_combination_strategy must be sum or average, got "
                         f"{combine!r}")  # fmt: skip
    width, shared = int(cfg["moe_intermediate_size"]), int(cfg["num_shared_experts"])
    on = any(sliding)
    return {
        "cohere_layer": True,
        "cohere_rms_norm": cfg.get("rms_norm_eps") is not None,
        "rope_interleaved": True,
        "logit_scale": float(cfg["logit_scale"]),
        "sliding_window": int(window) if on else None,
        "window_layers": sliding if on else (),
        "rope_layers": tuple(s or (force and m == "dense") for s, m in zip(sliding, mlp)),
        # the top-k logits' softmax is a full softmax's top-k renormalised (same picks)
        "routing": ExpertRouting(scoring=select),
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": width,
        "norm_topk_prob": select == "softmax" or bool(cfg["norm_topk_prob"]),
        "round_topk_to_model_dtype": True,
        "moe_layers": tuple(m != "dense" for m in mlp),
        "shared_expert_intermediate_size": width * shared,
        "shared_expert_average": combine == "average" and shared > 0,
    }
