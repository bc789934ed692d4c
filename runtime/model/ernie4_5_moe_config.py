"""ERNIE 4.5 MoE's config.json (`Ernie4_5_MoeForCausalLM`: baidu/ERNIE-4.5-21B-A3B-PT,
ERNIE-4.5-300B-A47B-PT) as transformers' Ernie4_5_MoeConfig reads it: the `FamilyConfig` fields
`model/ernie4_5.py`'s `Ernie4_5MoeModel` runs (the module docstring there says what they do).
Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"Ernie4_5_MoeForCausalLM": "ernie4_5_moe"}
MODEL_CLASSES = {"ernie4_5_moe": ("ernie4_5", "Ernie4_5MoeModel")}
# transformers' Ernie4_5_MoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "ernie4_5_moe": {"vocab_size": 103_424, "hidden_size": 2560, "intermediate_size": 12_288,
                     "num_hidden_layers": 28, "num_attention_heads": 20,
                     "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "rope_theta": 500_000.0,
                     "max_position_embeddings": 131_072, "tie_word_embeddings": True,
                     "moe_intermediate_size": 1536, "moe_k": 6, "moe_num_experts": 64,
                     "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                     "moe_layer_end_index": -1, "moe_layer_interval": 1,
                     "bos_token_id": 1, "eos_token_id": 2},
}  # fmt: skip


def _int(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int):  # ERNIE-4.5-VL's per-modality lists
        raise ValueError(f"{key} {value!r} is not supported for ERNIE 4.5 MoE (an integer: "
                         "the text model's)")  # fmt: skip
    return value


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of an ERNIE 4.5 MoE config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    if cfg.get("use_bias"):  # no released MoE checkpoint has them
        raise ValueError("use_bias on ERNIE 4.5 MoE is not supported (biases on attention "
                         "and the shared experts)")  # fmt: skip
    start, end = _int(cfg, "moe_layer_start_index"), _int(cfg, "moe_layer_end_index")
    end = n - 1 if end == -1 else end
    interval = _int(cfg, "moe_layer_interval")
    if interval < 1:
        raise ValueError(f"moe_layer_interval must be positive, got {interval}")
    width = _int(cfg, "moe_intermediate_size")
    return {
        "rope_interleaved": True,
        "routing": ExpertRouting(correction_bias=True),  # softmax, greedy, biased choice
        "num_experts": _int(cfg, "moe_num_experts"),
        "num_experts_per_tok": _int(cfg, "moe_k"),
        "moe_intermediate_size": width,
        "norm_topk_prob": True,
        "round_topk_to_model_dtype": True,
        "moe_layers": tuple((i + 1) % interval == 0 and start <= i <= end for i in range(n)),
        "shared_expert_intermediate_size": width * _int(cfg, "moe_num_shared_experts"),
    }
