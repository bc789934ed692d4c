"""Zaya's config.json (`ZayaForCausalLM`: Zyphra's ZAYA1) as transformers' ZayaConfig reads
it, for `model/zaya.py`; reached through `mamba_config` (every layer keeps a short conv state
beside its KV cache in the hybrids' state slots: `MambaConfig.zaya`, `parallel_attention`).
Kept apart from the model so that reading a config imports no layer code.

- `layer_types` all "hybrid" (a "hybrid_sliding" window layer is refused); rotary from
  `rope_parameters["hybrid"]` (base 5e6, half of each head rotating by default);
- `cca_time0` / `cca_time1`: the taps of the two convs over q and k; the conv state keeps the
  last ``cca_time0 + cca_time1 - 2`` q/k projections and the delayed value projection;
- top-1 experts (`num_experts_per_tok` 1, as transformers insists) of `moe_intermediate_size`
  over `num_experts` plus a skip choice, picked by the router MLP (`router_hidden_size`);
- `lm_head_bias`; `attention_bias` is refused (the delayed value's bias on the first token
  would need its own path: the published model has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.conv_attention_configs import ZayaCCA
from pagoda.runtime.distributed.tp_families import stacked_expert_rows
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"ZayaForCausalLM": "zaya"}
# transformers' ZayaConfig defaults, where config.json leaves one out
DEFAULTS = {
    "zaya": {"vocab_size": 262_272, "hidden_size": 2048, "num_hidden_layers": 40,
             "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
             "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": True, "moe_intermediate_size": 2048, "num_experts": 16,
             "num_experts_per_tok": 1, "router_hidden_size": 256, "cca_time0": 2,
             "cca_time1": 2, "attention_bias": False, "lm_head_bias": False,
             "bos_token_id": 2, "eos_token_id": 106},
}  # fmt: skip
NULLABLE = {"zaya": ("sliding_window",)}
DEFAULT_ROPE = {
    "hybrid": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
    "hybrid_sliding": {"rope_type": "default", "rope_theta": 10_000.0,
                       "partial_rotary_factor": 0.5},
}  # fmt: skip


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`: no dense MLP (its width, unread,
    the experts')."""
    return {"intermediate_size": cfg["moe_intermediate_size"]}


def conv_channels(cfg: Mapping[str, Any]) -> int:
    """The conv state's channels: q and k, then the delayed half of the values."""
    d, kv = int(cfg["head_dim"]), int(cfg["num_key_value_heads"])
    return (int(cfg["num_attention_heads"]) + kv) * d + kv * d // 2


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """ValueError, one line, for what transformers' Zaya runs that this does not."""
    types = list(cfg.get("layer_types") or ["hybrid"] * n)
    if len(types) != n:
        raise ValueError(f"zaya layer_types names {len(types)} layers, the model has {n}")
    if any(t != "hybrid" for t in types):
        raise ValueError(f"zaya layer_types {sorted(set(types) - {'hybrid'})} are not "
                         "supported (hybrid only: no window layers)")  # fmt: skip
    if int(cfg["num_experts_per_tok"]) != 1:
        raise ValueError("zaya num_experts_per_tok must be 1 (transformers' ZAYA routes one)")
    if cfg.get("attention_bias"):
        raise ValueError("zaya attention_bias is not supported")
    if int(cfg["num_key_value_heads"]) * int(cfg["head_dim"]) % 2:
        raise ValueError("zaya's values must split in two halves (num_key_value_heads x head_dim)")
    t0, t1 = int(cfg["cca_time0"]), int(cfg["cca_time1"])
    if t0 + t1 < 3:  # (the delayed values need a token of state)
        raise ValueError(f"zaya cca_time0 + cca_time1 must be at least 3, got {t0 + t1}")
    return {
        "mamba": MambaConfig(
            layers=(True,) * n, n_heads=1, head_dim=conv_channels(cfg), d_state=1,
            d_conv=t0 + t1 - 1, mixer="short_conv", parallel_attention=True,
            zaya=ZayaCCA(time0=t0, time1=t1, router_hidden=int(cfg["router_hidden_size"]),
                         delayed=int(cfg["num_key_value_heads"]) * int(cfg["head_dim"]) // 2)),
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": 1,
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": False,
        "lm_head_bias": bool(cfg.get("lm_head_bias")),
    }  # fmt: skip


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors, all of them (`checkpoint_shapes._hybrid_layer`)."""
    z, h, d = c.family.mamba.zaya, c.hidden_size, c.head_dim
    q, kv, e, r = c.num_heads * d, c.num_kv_heads * d, c.family.num_experts, z.router_hidden
    p = f"model.layers.{i}."
    a, g = p + "self_attn.", p + "mlp.gate."
    qk = q + kv
    out = {
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        a + "o_proj.weight": (h, q), a + "qk_norm.temp": (c.num_kv_heads,),
        a + "qkv_proj.q_proj.weight": (q, h), a + "qkv_proj.k_proj.weight": (kv, h),
        a + "qkv_proj.v_proj_current.weight": (kv // 2, h),
        a + "qkv_proj.v_proj_delayed.weight": (kv // 2, h),
        a + "qkv_proj.conv_qk_depthwise.weight": (qk, 1, z.time0),
        a + "qkv_proj.conv_qk_depthwise.bias": (qk,),
        a + "qkv_proj.conv_qk_grouped.weight": (qk, d, z.time1),
        a + "qkv_proj.conv_qk_grouped.bias": (qk,),
        g + "down_proj.weight": (r, h), g + "down_proj.bias": (r,),
        g + "router_mlp.norm.weight": (r,), g + "router_mlp.fc1.weight": (r, r),
        g + "router_mlp.fc1.bias": (r,), g + "router_mlp.fc2.weight": (r, r),
        g + "router_mlp.fc2.bias": (r,), g + "router_mlp.out_proj.weight": (e + 1, r),
        g + "balancing_biases": (e + 1,),
        p + "mlp.experts.gate_up_proj": (e, 2 * c.family.moe_intermediate_size, h),
        p + "mlp.experts.down_proj": (e, h, c.family.moe_intermediate_size),
    }  # fmt: skip
    if i:  # the previous layer's router state's scale
        out[g + "router_states_scale"] = (r,)
    for s in ("post_attention_residual_scale.", "post_mlp_residual_scale."):
        for x in ("hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"):
            out[p + s + x] = (h,)
    return out


def checkpoint_shapes(c: ModelConfig, out: dict[str, tuple[int, ...]]) -> None:
    """The embeddings' scale and bias and the head's bias in `checkpoint_shapes.expected_shapes`'
    tensors."""
    for name in ("model.input_hidden_states_scale", "model.input_hidden_states_bias"):
        out[name] = (c.hidden_size,)
    if c.family.lm_head_bias:
        out["lm_head.bias"] = (c.vocab_size,)


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split Zaya (one line), or None: each rank its KV heads with the
    query heads they serve (a key's residual averages its group's queries), so N divides the
    KV heads (`distributed/tp_families.py`)."""
    if c.num_kv_heads % size:
        return (f"--tensor-parallel-size {size} does not divide zaya's KV heads "
                f"(num_key_value_heads {c.num_kv_heads}): each key's residual averages the "
                "query heads it serves")  # fmt: skip
    return None


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of Zaya's own tensors (`model/zaya.py`): the key scales by KV
    heads, the router's down_proj whole (not a row-parallel down), the stacked experts (per
    expert: gate_up by rows, down by columns); None for the others (the values' halves whole
    by the shared rules; `distributed/tp_families.py`)."""
    if part == "self_attn.qk_norm.temp":
        k0, k1 = lay.kv_heads(c.num_kv_heads)
        return k1 - k0, cols
    if part.startswith("mlp.gate."):
        return rows, cols
    return stacked_expert_rows(part, rows, cols, lay.size)
