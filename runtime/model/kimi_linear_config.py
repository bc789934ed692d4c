"""Kimi Linear's config as transformers 5 reads it (`KimiLinearForCausalLM`, model_type
kimi_linear), for `model/kimi_linear.py`; reached through `mamba_config` (the KDA layers' state
slots) and `deepseek_config` (the latent attention and the experts, DeepSeek-V3's):

- layer kinds from ``linear_attn_config`` (``full_attn_layers`` and ``kda_layers``, 1-indexed,
  as the published checkpoints give them), else ``layer_types``, else transformers' default
  (full attention where ``i and i % 4 == 0``); the KDA layers' heads, head size and conv width
  from ``linear_attn_config`` (``num_heads``, ``head_dim``, ``short_conv_kernel_size``) or
  transformers' flat keys (`MambaConfig.mixer` "kda": H heads of K, state [H, K, K], a conv
  over q, k and v, chunks of 64);
- MLP kinds from ``mlp_layer_types`` (by default the first ``first_k_dense_replace``, 1, dense);
- the published names of DeepSeek-V3's keys (`config_keys.ALIASES`: ``num_experts``,
  ``num_experts_per_token``, ``num_shared_experts``, ``moe_renormalize``,
  ``num_expert_group``, ``model_max_length``);
- no rotary anywhere (the latent attention's rotary part is used unrotated: NoPE).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import deepseek_config
from pagoda.runtime.model.delta_rule_config import check_conv as check_conv_parts
from pagoda.runtime.model.delta_rule_config import delta_rule_mamba
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"KimiLinearForCausalLM": "kimi_linear"}
# transformers' KimiLinearConfig defaults (DeepseekV3Config's where it keeps them)
DEFAULTS = {
    "kimi_linear": {"vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
                    "moe_intermediate_size": 1024, "num_hidden_layers": 27,
                    "n_routed_experts": 256, "num_attention_heads": 32,
                    "num_key_value_heads": 32, "routed_scaling_factor": 2.446,
                    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
                    "num_experts_per_tok": 8, "n_shared_experts": 1, "norm_topk_prob": True,
                    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5,
                    "tie_word_embeddings": False, "hidden_act": "silu",
                    "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4,
                    "first_k_dense_replace": 1},
}  # fmt: skip
_LINEAR, _FULL = "linear_attention", "full_attention"
_EXPERT = re.compile(r"(\.experts\.\d+\.)(w[123])\.")
_W = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    lin = cfg.get("linear_attn_config") or {}
    types = cfg.get("layer_types")
    if "full_attn_layers" in lin and "kda_layers" in lin:  # (1-indexed)
        types = [None] * n
        for kind, key in ((_FULL, "full_attn_layers"), (_LINEAR, "kda_layers")):
            for i in lin[key]:
                if not 1 <= int(i) <= n:
                    raise ValueError(f"linear_attn_config {key} names layer {i} of {n} "
                                     "(1-indexed)")  # fmt: skip
                types[int(i) - 1] = kind
    elif types is None:
        types = [_FULL if i and i % 4 == 0 else _LINEAR for i in range(n)]
    if len(types) != n or set(types) - {_LINEAR, _FULL}:
        raise ValueError(f"kimi_linear layer kinds must name {_FULL!r} or {_LINEAR!r} for each "
                         f"of the {n} layers, got {types}")  # fmt: skip
    return list(types)


def _linear(cfg: Mapping[str, Any], key: str, flat: str) -> int:
    lin = cfg.get("linear_attn_config") or {}
    return int(lin.get(key) or cfg[flat])


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Only SiLU (the MLPs' and the KDA conv's activation) and the sigmoid router."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a kimi_linear "
                         "model (silu)")  # fmt: skip
    act = cfg.get("moe_router_activation_func", "sigmoid")
    if act != "sigmoid":  # (transformers' router: DeepSeek-V3's sigmoid, whatever this says)
        raise ValueError(f"moe_router_activation_func {act!r} is not supported in a kimi_linear "
                         "model (sigmoid)")  # fmt: skip
    return {}


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """The KDA layers as recurrent layers: H heads of K, one key head per value head."""
    heads, dim = _linear(cfg, "num_heads", "linear_num_heads"), _linear(cfg, "head_dim",
                                                                        "linear_head_dim")  # fmt: skip
    return delta_rule_mamba(
        (t == _LINEAR for t in layer_types(cfg, n)),
        v_heads=heads,
        v_dim=dim,
        k_heads=heads,
        k_dim=dim,
        d_conv=_linear(cfg, "short_conv_kernel_size", "linear_conv_kernel_dim"),
        mixer="kda",
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """DeepSeek-V3's latent attention (no rotary) and experts, the KDA layers, the MLP kinds."""
    fields = deepseek_config.family_fields(cfg, "deepseek_v3", n, None)
    kinds = cfg.get("mlp_layer_types")
    if kinds is None:
        dense = int(cfg.get("first_k_dense_replace") or 0)
        kinds = ["dense" if i < dense else "sparse" for i in range(n)]
    if len(kinds) != n or set(kinds) - {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types must name 'dense' or 'sparse' for each of the {n} "
                         f"layers, got {kinds}")  # fmt: skip
    if "moe_layers" in fields:
        fields["moe_layers"] = tuple(k == "sparse" for k in kinds)
    return {**fields, "mamba": mamba(cfg, n), "rope_layers": (False,) * n}


def rename_mlps(weights) -> None:
    """The published MLP names listed as transformers' conversion mapping reads them:
    ``block_sparse_moe.`` as ``mlp.``, each expert's w1, w2, w3 as gate_proj, down_proj,
    up_proj."""
    for name in list(weights):
        new = name.replace(".block_sparse_moe.", ".mlp.")
        new = _EXPERT.sub(lambda x: x[1] + _W[x[2]] + ".", new)
        if new != name:
            weights.rename(name, new)


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s KDA tensors (its conv: `check_conv`); nothing for a latent attention layer
    (`checkpoint_shapes`' DeepSeek shapes)."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}.self_attn."
    if not m.layers[i]:
        return {}
    d, k = m.d_inner, m.head_dim
    return {p + "q_proj.weight": (d, h), p + "k_proj.weight": (d, h), p + "v_proj.weight": (d, h),
            p + "b_proj.weight": (m.n_heads, h), p + "f_a_proj.weight": (k, h),
            p + "f_b_proj.weight": (d, k), p + "g_a_proj.weight": (k, h),
            p + "g_b_proj.weight": (d, k), p + "A_log": (1, 1, m.n_heads, 1),
            p + "dt_bias": (d,), p + "o_norm.weight": (k,), p + "o_proj.weight": (h, d)}  # fmt: skip


def check_conv(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """Every KDA layer's conv, [3 H K, 1, kernel] in all, whole or in parts
    (`delta_rule_config.check_conv`)."""
    check_conv_parts(c, headers, "self_attn.", "short_conv_kernel_size")
