"""DeepSeek-V2/V3's config.json as transformers reads it: `ModelConfig`'s head size and the
`FamilyConfig` fields of latent attention and DeepSeek's experts (model/deepseek.py runs them).
Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model.ops import rope_kind
from pagoda.runtime.model_configs import ExpertRouting, MlaConfig

ARCHITECTURES = {"DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
                 "YoutuForCausalLM": "youtu"}  # fmt: skip
# transformers' DeepseekV2Config / DeepseekV3Config defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
                    "n_shared_experts": 2, "moe_intermediate_size": 1407,
                    "routed_scaling_factor": 1.0, "topk_method": "greedy"},
    "deepseek_v3": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
                    "n_shared_experts": 1, "moe_intermediate_size": 2048, "n_group": 8,
                    "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5},
    # Youtu-LLM: V3's latent attention over a dense SwiGLU MLP in every layer (YoutuConfig
    # has no experts), tied embeddings
    "youtu": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 128_256,
              "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
              "num_attention_heads": 16, "num_key_value_heads": 16,
              "max_position_embeddings": 131_072, "bos_token_id": 128_000,
              "eos_token_id": 128_001, "tie_word_embeddings": True, "rope_interleave": True},
}  # fmt: skip
NULLABLE = ("q_lora_rank",)  # null: q_proj (V2-Lite), not the default bottleneck


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_config(cfg: Mapping[str, Any], arch: str) -> MlaConfig:
    q_lora = cfg.get("q_lora_rank")
    return MlaConfig(
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        q_lora_rank=None if q_lora is None else int(q_lora),
        rope_interleave=arch == "deepseek_v2" or bool(cfg.get("rope_interleave", True)),
    )


def head_dim(cfg: Mapping[str, Any], arch: str) -> int:
    """The cache's head size: one latent row (`MlaConfig.cache_width`), in one KV head."""
    return mla_config(cfg, arch).cache_width


def family_fields(
    cfg: Mapping[str, Any], arch: str, n: int, scaling: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`FamilyConfig` fields of a DeepSeek config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    m = mla_config(cfg, arch)
    scale = m.qk_head_dim**-0.5  # transformers' yarn_apply_mscale
    if scaling and rope_kind(dict(scaling)) != "default" and scaling.get("mscale_all_dim"):
        mscale = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale *= mscale * mscale
    fields: dict[str, Any] = {"mla": m, "attention_multiplier": scale}
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias on a DeepSeek model is not supported")
    # (YoutuConfig has no experts: an n_routed_experts config.json may carry is not read)
    experts = 0 if arch == "youtu" else int(cfg.get("n_routed_experts") or 0)
    if not experts:
        return fields
    if int(cfg.get("moe_layer_freq") or 1) != 1:  # transformers ignores it; no checkpoint sets it
        raise ValueError(f"moe_layer_freq {cfg['moe_layer_freq']} is not supported (experts "
                         "in every layer from first_k_dense_replace on: 1)")  # fmt: skip
    v3 = arch == "deepseek_v3"
    method = "noaux_tc" if v3 else str(cfg.get("topk_method") or "greedy")
    scoring = "sigmoid" if v3 else "softmax"
    for key, want in (("topk_method", method), ("scoring_func", scoring)):
        if cfg.get(key) not in (None, want):  # transformers' V3 router is noaux_tc, sigmoid
            raise ValueError(f"{key} {cfg[key]!r} is not supported for {arch} ({want!r})")
    if not v3 and method == "noaux_tc":  # transformers' V2 router has no such branch
        raise ValueError("topk_method 'noaux_tc' is not supported for deepseek_v2 (greedy or "
                         "group_limited_greedy; noaux_tc is DeepseekV3's)")  # fmt: skip
    groups = int(cfg.get("n_group") or 1) if method != "greedy" else 1
    routing = ExpertRouting(
        scoring=scoring,
        topk_method=method,
        n_group=groups,
        topk_group=int(cfg.get("topk_group") or 1) if method != "greedy" else 1,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
    )
    if method == "noaux_tc" and experts // groups < 2:
        raise ValueError(f"noaux_tc scores a group by its best two experts: n_group {groups} "
                         f"leaves {experts // groups} of {experts} per group")  # fmt: skip
    dense = int(cfg.get("first_k_dense_replace") or 0)
    moe_width = int(cfg["moe_intermediate_size"])
    return {
        **fields,
        "routing": routing,
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": moe_width,
        # transformers' V2 router never renormalises (DeepSeek's own code did, with the flag)
        "norm_topk_prob": v3 and bool(cfg.get("norm_topk_prob", True)),
        "moe_layers": tuple(i >= dense for i in range(n)),
        "shared_expert_intermediate_size": moe_width * int(cfg.get("n_shared_experts") or 0),
    }
