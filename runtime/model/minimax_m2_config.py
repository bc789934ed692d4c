"""MiniMax-M2's config.json (`MiniMaxM2ForCausalLM`: MiniMaxAI/MiniMax-M2, MiniMax-M2.1) as
transformers' MiniMaxM2Config reads it: the `FamilyConfig` fields `model/minimax_m2.py` runs,
and the partial rotary the released configs give as `rotary_dim` (the dims of each head that
rotate; transformers' `partial_rotary_factor` = rotary_dim / head_dim where the rotary
parameters name none). The multi-token-prediction modules (`use_mtp`) are not read, as
transformers builds none. Kept apart from the model so that reading a config imports no layer
code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"MiniMaxM2ForCausalLM": "minimax_m2"}
MODEL_CLASSES = {"minimax_m2": ("minimax_m2", "MiniMaxM2Model")}
PARTIAL_ROTARY = ("minimax_m2",)
# transformers' MiniMaxM2Config defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "minimax_m2": {"vocab_size": 200_064, "hidden_size": 3072, "intermediate_size": 1536,
                   "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
                   "head_dim": 128, "max_position_embeddings": 196_608, "rms_norm_eps": 1e-6,
                   "rope_theta": 5_000_000.0, "num_experts_per_tok": 8,
                   "num_local_experts": 256, "bos_token_id": 200_034, "eos_token_id": 200_020},
}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a MiniMax-M2 config.json, as transformers reads them."""
    return {
        "qk_norm_whole": True,
        "routing": ExpertRouting(scoring="sigmoid", correction_bias=True),  # greedy
        "num_experts": int(cfg["num_local_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["intermediate_size"]),
        "norm_topk_prob": True,
    }


def rope(cfg: Mapping[str, Any], theta: float, scaling: Mapping[str, Any] | None, head_dim: int):
    """(theta, rope_scaling) with the released configs' `rotary_dim` as transformers reads it:
    the partial_rotary_factor where `rope_parameters` and config.json name none."""
    has = scaling is not None and "partial_rotary_factor" in scaling
    if cfg.get("rotary_dim") is None or has:
        return theta, scaling
    return theta, {**(scaling or {}), "partial_rotary_factor": int(cfg["rotary_dim"]) / head_dim}
