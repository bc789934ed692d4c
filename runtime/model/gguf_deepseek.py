"""llama.cpp's ``deepseek2`` GGUFs (DeepSeek-V2(-Lite), V3, R1, Kimi K2, Moonlight as its
converter writes them) read into the Hugging Face names and config `model/deepseek.py` runs.

The converter writes the latent attention as llama.cpp runs it (an MQA over the latent:
``key_length`` = kv_lora_rank + rope dims, one KV head) and keeps the model's own sizes in
``key_length_mla`` / ``value_length_mla`` (older files: ``key_length`` / ``value_length`` are
the qk and v head sizes); ``kv_b_proj`` is split per head into ``attn_k_b`` (transposed:
[heads, kv_lora_rank, qk_nope]) and ``attn_v_b`` ([heads, v, kv_lora_rank]) by newer converters
(`deepseek.kv_b_weight` joins them back), whole as ``attn_kv_b`` by older ones. Its rotary pairs
dims (0, 1), (2, 3), ... as DeepSeek's (no permutation). The router: ``expert_gating_func``
1 (softmax, V2; the default of files without it) or 2 (sigmoid with ``exp_probs_b``, V3),
``expert_group_count`` / ``expert_group_used_count`` (a V2 softmax router limited to groups is
group_limited_greedy), ``expert_weights_norm``, ``expert_weights_scale``; the shared experts
``expert_shared_count`` x ``expert_feed_forward_length`` wide; ``leading_dense_block_count``
dense layers first. Yarn's ``mscale_all_dim`` comes back from ``rope.scaling.yarn_log_multiplier``
(the converter writes 0.1 x it; DeepSeek's mscale is the same value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagoda.runtime.config import FamilyConfig
from pagoda.runtime.model_configs import ExpertRouting, MlaConfig

GGUF_ARCH = "deepseek2"
ARCHITECTURES = ("deepseek_v2", "deepseek_v3")  # the engine's, by the router's scores
# llama.cpp's per-layer names -> the Hugging Face names under model.layers.{i}.
TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.k_b_proj",  # the converter's split of kv_b_proj
    "attn_v_b": "self_attn.v_b_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",  # stacked [E, N, K] (`moe._ExpertTensors`)
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func


def hf_name(layer: str, part: str, kind: str) -> str | None:
    """The Hugging Face name of ``blk.{layer}.{part}.{kind}``, or None (not read)."""
    if part == "exp_probs_b":  # V3's correction bias, stored as a bias
        return f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
    if part in TENSORS:
        return f"model.layers.{layer}.{TENSORS[part]}.{kind}"
    return None


def config_fields(field: Callable[..., Any], names: set[str], hidden: int, heads: int,
                  layers: int) -> dict[str, Any]:  # fmt: skip
    """`ModelConfig` fields of a deepseek2 file beyond the common ones (`field(key, default)`
    reads ``deepseek2.<key>``; `names`: its tensors'): architecture, head size, KV heads,
    rotary scaling and the family."""
    qk = field("attention.key_length_mla") or field("attention.key_length")
    v = field("attention.value_length_mla") or field("attention.value_length")
    rope = int(field("rope.dimension_count"))
    q_lora = int(field("attention.q_lora_rank", 0) or 0)
    mla = MlaConfig(kv_lora_rank=int(field("attention.kv_lora_rank")),
                    qk_nope_head_dim=int(qk) - rope, qk_rope_head_dim=rope, v_head_dim=int(v),
                    q_lora_rank=q_lora or None, rope_interleave=True)  # fmt: skip
    scaling, scale = _yarn(field), mla.qk_head_dim**-0.5
    if scaling is not None and scaling.get("mscale_all_dim"):
        from pagoda.runtime.model.deepseek_config import yarn_mscale

        scale *= yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    gating = int(field("expert_gating_func", SOFTMAX) or SOFTMAX)
    if gating not in (SOFTMAX, SIGMOID):
        raise ValueError(f"GGUF deepseek2 expert_gating_func {gating} is not supported "
                         "(1 softmax, 2 sigmoid)")  # fmt: skip
    family: dict[str, Any] = {"mla": mla, "attention_multiplier": scale}
    experts = int(field("expert_count", 0) or 0)
    if experts:
        groups = int(field("expert_group_count", 1) or 1)
        sigmoid = gating == SIGMOID
        if sigmoid and not any(n.endswith(".exp_probs_b.bias") for n in names):
            raise ValueError("GGUF deepseek2 with sigmoid routing needs exp_probs_b (V3's "
                             "e_score_correction_bias)")  # fmt: skip
        method = "noaux_tc" if sigmoid else "group_limited_greedy" if groups > 1 else "greedy"
        width = int(field("expert_feed_forward_length"))
        dense = int(field("leading_dense_block_count", 0) or 0)
        family.update(
            routing=ExpertRouting(
                scoring="sigmoid" if sigmoid else "softmax", topk_method=method, n_group=groups,
                topk_group=int(field("expert_group_used_count", 1) or 1) if groups > 1 else 1,
                routed_scaling_factor=float(field("expert_weights_scale", 1.0) or 1.0),
            ),
            num_experts=experts,
            num_experts_per_tok=int(field("expert_used_count")),
            moe_intermediate_size=width,
            norm_topk_prob=bool(field("expert_weights_norm", False)),
            moe_layers=tuple(i >= dense for i in range(layers)),
            shared_expert_intermediate_size=width * int(field("expert_shared_count", 0) or 0),
        )  # fmt: skip
    return {
        "architecture": ARCHITECTURES[gating == SIGMOID],
        "head_dim": mla.cache_width,
        "num_kv_heads": 1,  # one latent row per token (model/deepseek.py)
        "rope_scaling": scaling,
        "family": FamilyConfig(**family),
    }


def yarn_betas(field: Callable[..., Any]) -> dict[str, float]:
    """Yarn's `beta_fast` and `beta_slow` where the file has them (`rope.scaling.yarn_beta_*`;
    Kimi K2's 1 and 1); missing: yarn's 32 and 1. Every family with yarn reads them so."""
    out = {}
    for key in ("beta_fast", "beta_slow"):
        value = field(f"rope.scaling.yarn_{key}")
        if value is not None:
            out[key] = float(value)
    return out


def _yarn(field: Callable[..., Any]) -> dict[str, Any] | None:
    kind = field("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "yarn":
        raise ValueError(f"GGUF deepseek2 rope.scaling.type {kind!r} is not supported (yarn)")
    out: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": float(field("rope.scaling.factor", 1.0)),
        "original_max_position_embeddings": int(
            field("rope.scaling.original_context_length", 0) or 0
        ),
    }
    out.update(yarn_betas(field))
    log_mul = float(field("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    if log_mul:  # 0.1 x mscale_all_dim, DeepSeek's mscale the same
        out["mscale"] = out["mscale_all_dim"] = log_mul / 0.1
    return out
