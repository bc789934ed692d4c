"""BailingHybrid's config as transformers 5 reads it (`BailingHybridForCausalLM`, model_type
bailing_hybrid: Ling 3), for `model/bailing_hybrid.py`; Kimi Linear's reading
(`kimi_linear_config.py`) with its own keys:

- layer kinds from ``layer_types``, else transformers' default (full latent attention on the
  last layer of every ``layer_group_size``, KDA elsewhere); the KDA layers' heads and head size
  are the attention's (``num_attention_heads``, ``head_dim``), the conv's width
  ``short_conv_kernel_size``; the forget gate bounded (``kda_safe_gate``: ``kda_lower_bound *
  sigmoid(...)``; an unbounded gate, ``kda_safe_gate`` false, is refused in one line);
- MLP kinds from ``mlp_layer_types`` (by default the first ``first_k_dense_replace`` dense);
- the published names (`config_keys.ALIASES`, as Kimi Linear's) and tensors (`rename`:
  ``word_embeddings``, ``attention.``, ``dense``, ``expert_bias``);
- rotary on the latent attention layers (DeepSeek-V3's interleaved dims).

The SwiGLU clipping of ``expert_swiglu_limit_list`` / ``share_expert_swiglu_limit_list`` is
refused where a limit is set (not zero), in one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import kimi_linear_config
from pagoda.runtime.model.delta_rule_config import check_conv as check_conv_parts
from pagoda.runtime.model.delta_rule_config import delta_rule_mamba
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"BailingHybridForCausalLM": "bailing_hybrid"}
# transformers' BailingHybridConfig defaults
DEFAULTS = {
    "bailing_hybrid": {"vocab_size": 157184, "hidden_size": 2560, "intermediate_size": 6144,
                       "moe_intermediate_size": 768, "num_hidden_layers": 42,
                       "num_attention_heads": 32, "num_key_value_heads": 32,
                       "n_routed_experts": 512, "num_experts_per_tok": 8, "n_shared_experts": 1,
                       "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
                       "norm_topk_prob": True, "first_k_dense_replace": 2, "hidden_act": "silu",
                       "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                       "tie_word_embeddings": False, "kv_lora_rank": 512, "q_lora_rank": None,
                       "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                       "rope_theta": 6_000_000.0, "head_dim": 128, "short_conv_kernel_size": 4,
                       "layer_group_size": 6, "kda_safe_gate": True, "kda_lower_bound": -5.0},
}  # fmt: skip
_LINEAR, _FULL = "linear_attention", "full_attention"
_RENAMES = ((re.compile(r"^model\.word_embeddings\."), "model.embed_tokens."),
            (re.compile(r"\.attention\."), ".self_attn."),
            (re.compile(r"\.self_attn\.dense\."), ".self_attn.o_proj."),
            (re.compile(r"\.mlp\.gate\.expert_bias$"), ".mlp.gate.e_score_correction_bias"))  # fmt: skip


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        group = int(cfg.get("layer_group_size") or 6)
        types = [_FULL if (i + 1) % group == 0 else _LINEAR for i in range(n)]
    if len(types) != n or set(types) - {_LINEAR, _FULL}:
        raise ValueError(f"bailing_hybrid layer_types must name {_FULL!r} or {_LINEAR!r} for "
                         f"each of the {n} layers, got {types}")  # fmt: skip
    return list(types)


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Only SiLU and no SwiGLU clipping (module docstring)."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a "
                         "bailing_hybrid model (silu)")  # fmt: skip
    if not cfg.get("kda_safe_gate", True):
        raise ValueError("kda_safe_gate false is not supported in a bailing_hybrid model (the "
                         "bounded KDA forget gate only)")  # fmt: skip
    for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        if any(float(x) for x in cfg.get(key) or ()):
            raise ValueError(f"{key} {cfg[key]} is not supported in a bailing_hybrid model "
                             "(SwiGLU clipping; zeros only)")  # fmt: skip
    return {}


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """The KDA layers as recurrent layers: the attention's heads and head size."""
    heads, dim = int(cfg["num_attention_heads"]), int(cfg["head_dim"])
    return delta_rule_mamba(
        (t == _LINEAR for t in layer_types(cfg, n)),
        v_heads=heads,
        v_dim=dim,
        k_heads=heads,
        k_dim=dim,
        d_conv=int(cfg["short_conv_kernel_size"]),
        mixer="kda",
        kda_full_gates=True,
        attn_head_gate=True,  # (the latent attention's g_proj, one gate a head)
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Kimi Linear's (MLP kinds, DeepSeek-V3's experts) with rotary on the latent layers."""
    m = mamba(cfg, n)
    kimi = {**cfg, "layer_types": layer_types(cfg, n), "linear_num_heads": m.n_heads,
            "linear_head_dim": m.head_dim, "linear_conv_kernel_dim": m.d_conv}  # fmt: skip
    fields = kimi_linear_config.family_fields(kimi, n)
    bound = float(cfg.get("kda_lower_bound", -5.0))
    return {**fields, "mamba": m, "rope_layers": tuple(not x for x in m.layers),
            "kda_lower_bound": bound}  # fmt: skip


def rename(weights) -> None:
    """The published names under transformers' (its conversion mapping's renames)."""
    weights.rename_by(_RENAMES)


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s KDA tensors (its conv: `check_conv`); nothing for a latent attention layer."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}.self_attn."
    if not m.layers[i]:
        return {p + "g_proj.weight": (c.num_heads, h)}
    d = m.d_inner
    return {p + "q_proj.weight": (d, h), p + "k_proj.weight": (d, h), p + "v_proj.weight": (d, h),
            p + "b_proj.weight": (m.n_heads, h), p + "f_proj.weight": (d, h),
            p + "g_proj.weight": (d, h), p + "A_log": (m.n_heads,), p + "dt_bias": (d,),
            p + "o_norm.weight": (m.head_dim,), p + "o_proj.weight": (h, d)}  # fmt: skip


def check_conv(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    check_conv_parts(c, headers, "self_attn.", "short_conv_kernel_size")
