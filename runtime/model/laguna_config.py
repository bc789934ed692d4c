"""Laguna's config.json (`LagunaForCausalLM`: poolside's Laguna) as transformers' LagunaConfig
reads it: the `FamilyConfig` fields `model/laguna.py` runs (its docstring says what they do).
Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagoda.runtime.model_configs import ExpertRouting, LagunaAttention

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"LagunaForCausalLM": "laguna"}
MODEL_CLASSES = {"laguna": ("laguna", "LagunaModel")}
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' LagunaConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "laguna": {"vocab_size": 100_352, "hidden_size": 2048, "intermediate_size": 8192,
               "num_hidden_layers": 40, "num_attention_heads": 48, "num_key_value_heads": 8,
               "head_dim": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
               "sliding_window": 512, "num_experts": 256, "num_experts_per_tok": 8,
               "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
}  # fmt: skip
NULLABLE = {"laguna": ("sliding_window",)}
PARTIAL_ROTARY = ("laguna",)  # the full-attention layers' (`rope_parameters` by layer kind)
DEFAULT_ROPE = {
    FULL: {"rope_type": "default", "rope_theta": 500_000.0, "partial_rotary_factor": 0.5},
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 1.0},
}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Laguna config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    types = cfg.get("layer_types") or [FULL] * n
    mlp = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    heads = cfg.get("num_attention_heads_per_layer") or [cfg["num_attention_heads"]] * n
    for name, v in (("layer_types", types), ("mlp_layer_types", mlp),
                    ("num_attention_heads_per_layer", heads)):  # fmt: skip
        if len(v) != n:
            raise ValueError(f"laguna {name} names {len(v)} layers, the model has {n}")
    kv = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    if any(int(h) % kv for h in heads):
        raise ValueError(f"laguna num_attention_heads_per_layer {list(heads)} must be multiples "
                         f"of num_key_value_heads {kv}")  # fmt: skip
    if cfg.get("moe_apply_router_weight_on_input"):
        raise ValueError("laguna moe_apply_router_weight_on_input is not supported")
    if cfg.get("moe_router_logit_softcapping"):
        raise ValueError("laguna moe_router_logit_softcapping is not supported")
    gating = cfg.get("gating", True)
    if gating not in (True, "per-head", "per-element"):
        raise ValueError(f"laguna gating {gating!r} is not supported")
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    local = params.get(SLIDING) or DEFAULT_ROPE[SLIDING]
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"laguna sliding_attention rope_type {local['rope_type']!r} is not "
                         "supported")  # fmt: skip
    sliding = tuple(t == SLIDING for t in types)
    window = cfg.get("sliding_window")
    if any(sliding) and window is None:
        raise ValueError("laguna's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    return {
        "qk_norm": True,
        "sliding_window": int(window) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "laguna": LagunaAttention(
            heads=tuple(int(h) for h in heads), gate_per_head=gating != "per-element",
            local_rope_theta=float(local.get("rope_theta") or 10_000.0),
            local_rotary=float(local.get("partial_rotary_factor") or 1.0)),
        "routing": ExpertRouting(scoring="sigmoid", correction_bias=True,
                                 routed_scaling_factor=float(
                                     cfg.get("moe_routed_scaling_factor") or 1.0)),
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": True,
        "moe_layers": tuple(t == "sparse" for t in mlp),
        "shared_expert_intermediate_size": int(cfg["shared_expert_intermediate_size"]),
    }  # fmt: skip


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split Laguna's layers (one line), or None
    (`distributed/tp_families.py`): each layer's query heads must divide by `size`."""
    for i, heads in enumerate(() if c.family.laguna is None else c.family.laguna.heads):
        if heads % size:
            return f"--tensor-parallel-size {size} does not divide layer {i}'s {heads} query heads"
    return None


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of a layer's q and output gate, by the layer's own query heads
    (`model/laguna.py`: a gate row per head, or per head element), or None for the other
    tensors (`distributed/tp_families.py`)."""
    g = c.family.laguna
    if g is None or part not in ("self_attn.q_proj.weight", "self_attn.g_proj.weight"):
        return None
    q0, q1 = lay.heads(g.heads[layer])
    per_head = part.startswith("self_attn.g") and g.gate_per_head
    return (q1 - q0) * (1 if per_head else c.head_dim), cols
