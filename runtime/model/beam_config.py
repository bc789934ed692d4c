"""Beam's config.json (`BeamForCausalLM`: Reflection AI's Beam) as transformers' BeamConfig reads
it: the `FamilyConfig` fields `model/beam.py` runs (its docstring says what they do). Kept apart
from the model so that reading a config imports no layer code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.model.ops import rope_kind
from pagoda.runtime.model_configs import ExpertRouting

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"BeamForCausalLM": "beam"}
MODEL_CLASSES = {"beam": ("beam", "BeamModel")}
# transformers' BeamConfig defaults (Qwen3MoeConfig's where Beam keeps them), where config.json
# leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "beam": {"vocab_size": 151_936, "hidden_size": 5120, "intermediate_size": 20_480,
             "num_hidden_layers": 52, "num_attention_heads": 48, "num_key_value_heads": 8,
             "head_dim": 128, "max_position_embeddings": 8192, "sliding_window": 512,
             "moe_intermediate_size": 2560, "num_experts": 256, "num_experts_per_tok": 8,
             "norm_topk_prob": True, "n_group": 8, "topk_group": 4,
             "routed_scaling_factor": 2.5, "final_logit_softcapping": 30.0,
             "rms_norm_eps": 1e-6},
}  # fmt: skip
NULLABLE = {"beam": ("final_logit_softcapping",)}  # null: no cap


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    """BeamConfig's: every sixth layer and the last full attention, the rest sliding."""
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
        types[-1] = "full_attention"
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"layer_types must name 'sliding_attention' or 'full_attention' for "
                         f"each of the {n} layers, got {types}")  # fmt: skip
    return list(types)


def rope(cfg: Mapping[str, Any], theta: float, scaling, head_dim: int):
    """The sliding layers' rotary (`rope_parameters.sliding_attention`; the full-attention
    layers' must be null: they attend without positions)."""
    params = cfg.get("rope_parameters") or {}
    if "sliding_attention" not in params and "full_attention" not in params:
        return theta, scaling  # a flat rope_theta / rope_parameters: the sliding layers'
    if params.get("full_attention") is not None:
        raise ValueError("rotary on Beam's full-attention layers is not supported (BeamConfig "
                         "leaves them without positions: rope_parameters.full_attention null)")  # fmt: skip
    sliding = params.get("sliding_attention") or {}
    if rope_kind(sliding) != "default":
        raise ValueError(f"rope_type {rope_kind(sliding)!r} on Beam's sliding layers is not "
                         "supported")  # fmt: skip
    return float(sliding.get("rope_theta") or 10000.0), None


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Beam config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    sliding = tuple(t == "sliding_attention" for t in layer_types(cfg, n))
    if any(sliding) and cfg.get("sliding_window") is None:
        raise ValueError("Beam's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    kinds = cfg.get("mlp_layer_types") or ["dense"] * min(3, n) + ["sparse"] * (n - 3)
    if len(kinds) != n or set(kinds) - {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types must name 'dense' or 'sparse' for each of the {n} "
                         f"layers, got {kinds}")  # fmt: skip
    experts, groups = int(cfg["num_experts"]), int(cfg["n_group"])
    if experts % groups or experts // groups < 2:
        raise ValueError(f"n_group {groups} must divide num_experts {experts} into groups of "
                         "two or more (a group scores its best two)")  # fmt: skip
    cap = cfg.get("final_logit_softcapping")
    return {
        "qk_norm": True,
        "sliding_window": int(cfg["sliding_window"]) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "rope_layers": sliding,  # the full-attention layers: NoPE, q scaled by position
        "final_logit_softcapping": None if cap is None else float(cap),
        # V3's noaux_tc (the correction bias, best two per group, -inf elsewhere); the scaling
        # after the experts' sum is the same product
        "routing": ExpertRouting(scoring="sigmoid", topk_method="noaux_tc", n_group=groups,
                                 topk_group=int(cfg["topk_group"]),
                                 routed_scaling_factor=float(cfg["routed_scaling_factor"])),
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "moe_layers": tuple(k == "sparse" for k in kinds),
    }  # fmt: skip


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its norms around the MLP and attention's output gate (with a bias a head) in
    `checkpoint_shapes.expected_shapes`' tensors."""
    h, q = c.hidden_size, c.num_heads * c.head_dim
    for i in range(c.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out.update({p + "pre_feedforward_layernorm.weight": (h,),
                    p + "post_feedforward_layernorm.weight": (h,),
                    a + "gate_proj.weight": (q, h), a + "gate_bias": (c.num_heads,)})  # fmt: skip


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (elements, 1) of the output gate's bias, one per head: its heads'
    (`model/beam.py`); None for the other tensors (`distributed/tp_families.py`)."""
    if part != "self_attn.gate_bias":
        return None
    q0, q1 = lay.heads(c.num_heads)
    return q1 - q0, 1
