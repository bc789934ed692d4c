"""PhiMoE's config.json (`PhimoeForCausalLM`; the hub's Phi-3.5-MoE-instruct names it
`PhiMoEForCausalLM`) as transformers' PhimoeConfig reads it: the `FamilyConfig` fields
`model/phimoe.py` runs. Kept apart from the model so that reading a config imports no layer
code.

Its LongRoPE (`rope_scaling` longrope, with `short_mscale` / `long_mscale` for the attention
factor) is Phi-3's (`model/longrope.py`): a sequence past `original_max_position_embeddings`
rotates with the long factors and `long_mscale`, as Phi-3.5-MoE's own code and vLLM run it.
transformers 5.25's PhiMoE keeps the short factors there (its rotary recomputes the frequencies
without the sequence's length) while taking `long_mscale`: within the original context (4,096
tokens for Phi-3.5-MoE) the two agree.
"""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"PhimoeForCausalLM": "phimoe", "PhiMoEForCausalLM": "phimoe"}
MODEL_CLASSES = {"phimoe": ("phimoe", "PhimoeModel")}
# transformers' PhimoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "phimoe": {"vocab_size": 32_064, "hidden_size": 4096, "intermediate_size": 6400,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
               "rope_theta": 1_000_000.0, "num_experts_per_tok": 2, "num_local_experts": 16,
               "router_jitter_noise": 0.01, "bos_token_id": 1, "eos_token_id": 2},
}  # fmt: skip
NULLABLE = {"phimoe": ("sliding_window",)}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a PhiMoE config.json, as transformers reads them; ValueError,
    one line, for what it does not run."""
    if int(cfg["num_experts_per_tok"]) != 2:  # sparsemixer picks two, whatever it says
        raise ValueError(f"PhiMoE's num_experts_per_tok {cfg['num_experts_per_tok']} is not "
                         "supported (its sparsemixer router picks 2 experts)")  # fmt: skip
    window = cfg.get("sliding_window")
    return {
        "layer_norm_bias": True,
        "o_proj_bias": bool(cfg.get("attention_bias")),  # q/k/v's: ModelConfig's
        "lm_head_bias": bool(cfg.get("lm_head_bias")),
        "sliding_window": None if window is None else int(window),  # every layer
        "routing": ExpertRouting(
            topk_method="sparsemixer", jitter_eps=float(cfg["router_jitter_noise"])
        ),
        "num_experts": int(cfg["num_local_experts"]),
        "num_experts_per_tok": 2,
        "moe_intermediate_size": int(cfg["intermediate_size"]),
        "norm_topk_prob": False,
    }
