"""AfMoE's config.json (`AfmoeForCausalLM`: arcee-ai/Trinity-Mini, Trinity-Nano) as transformers'
AfmoeConfig reads it: the `FamilyConfig` fields `model/afmoe.py` runs (its docstring says what
they do). Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

import math
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"AfmoeForCausalLM": "afmoe"}
MODEL_CLASSES = {"afmoe": ("afmoe", "AfmoeModel")}
# transformers' AfmoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "afmoe": {"vocab_size": 200_192, "hidden_size": 2048, "intermediate_size": 6144,
              "moe_intermediate_size": 1408, "num_hidden_layers": 32, "num_dense_layers": 1,
              "num_attention_heads": 16, "head_dim": 128, "max_position_embeddings": 16_384,
              "rms_norm_eps": 1e-5, "num_experts": 64, "num_experts_per_tok": 6,
              "num_shared_experts": 2, "route_scale": 1.0, "global_attn_every_n_layers": 4,
              "sliding_window": 1024},
}  # fmt: skip
NULLABLE = {"afmoe": ("sliding_window",)}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of an AfMoE config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    every = int(cfg["global_attn_every_n_layers"])
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]  # fmt: skip
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    sliding = tuple(t == "sliding_attention" for t in types)
    window = cfg.get("sliding_window")
    if any(sliding) and window is None:
        raise ValueError("AfMoE's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    dense = int(cfg["num_dense_layers"])
    width = int(cfg["moe_intermediate_size"])
    return {
        "qk_norm": True,
        "sliding_window": int(window) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "rope_layers": sliding,  # the global layers attend without rotary
        "embedding_multiplier": math.sqrt(int(cfg["hidden_size"])) if cfg.get("mup_enabled")
        else 1.0,
        "routing": ExpertRouting(scoring="sigmoid", correction_bias=True,
                                 routed_scaling_factor=float(cfg["route_scale"])),
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": width,
        "norm_topk_prob": True,
        "moe_layers": tuple(i >= dense for i in range(n)),
        "shared_expert_intermediate_size": width * int(cfg["num_shared_experts"]),
    }  # fmt: skip


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its norms around the MLP and attention's output gate in
    `checkpoint_shapes.expected_shapes`' tensors."""
    h, q = c.hidden_size, c.num_heads * c.head_dim
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        out.update({p + "pre_mlp_layernorm.weight": (h,), p + "post_mlp_layernorm.weight": (h,),
                    p + "self_attn.gate_proj.weight": (q, h)})  # fmt: skip
