"""OLMo Hybrid's config as transformers 5 reads it (`OlmoHybridForCausalLM`, model_type
olmo_hybrid), for `model/olmo_hybrid.py`; reached through `mamba_config` (the Gated DeltaNet
layers keep a per-sequence state in the hybrids' state slots). Kept apart from the model so
that reading a config imports no layer code.

- `layer_types` ("linear_attention" / "full_attention"; transformers' default: every fourth
  layer attends, the last one where that leaves none);
- the DeltaNet layers (`MambaConfig.mixer` "gated_deltanet", chunks of 64): the
  `linear_num_*_heads` default to `num_attention_heads`, `linear_key_head_dim` to
  0.75 hidden_size / key heads, `linear_value_head_dim` to twice that; beta doubled where
  `linear_allow_neg_eigval` (the default);
- attention: OLMo 3's without windows (q/k norms over the whole projections, the norms after
  the sublayers: `FamilyConfig.olmo2_norms`), rotating unless `rope_parameters` names no
  `rope_theta` (NoPE, as transformers' `OlmoHybridModel` reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.delta_rule_config import check_conv as check_conv_parts
from pagoda.runtime.model.delta_rule_config import delta_rule_mamba
from pagoda.runtime.model.qwen3_next_config import layer_types as _checked_types
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"OlmoHybridForCausalLM": "olmo_hybrid"}
# transformers' config defaults, where config.json leaves one out (OlmoHybridConfig's)
DEFAULTS = {
    "olmo_hybrid": {"vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008,
                    "num_hidden_layers": 32, "num_attention_heads": 30,
                    "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
                    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True,
                    "tie_word_embeddings": False, "hidden_act": "silu",
                    "attention_bias": False, "rope_theta": 10000.0},
}  # fmt: skip
_LINEAR_ATTN, _ATTENTION = "linear_attention", "full_attention"
# the published checkpoints' names (OLMo-core's), read as transformers' conversion mapping
# reads them: the DeltaNet layers' norms (their conv in three parts: `delta_rule_config`)
_NORMS = {".attention_layer_norm.": ".input_layernorm.",
          ".feedforward_layer_norm.": ".post_attention_layernorm."}  # fmt: skip


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [_ATTENTION if i % 4 == 3 else _LINEAR_ATTN for i in range(n)]
        if _ATTENTION not in types:
            types[-1] = _ATTENTION
    return _checked_types({"layer_types": types}, n)


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`: the key/value heads' default (the
    query heads'); only SiLU."""
    out: dict[str, Any] = {}
    if cfg.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = cfg["num_attention_heads"]
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in an olmo_hybrid "
                         "model (silu)")  # fmt: skip
    return out


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """The Gated DeltaNet layers as recurrent layers (module docstring)."""
    heads = int(cfg["num_attention_heads"])
    k_heads = int(cfg.get("linear_num_key_heads") or heads)
    k_dim = int(cfg.get("linear_key_head_dim") or int(0.75 * int(cfg["hidden_size"]) / k_heads))
    return delta_rule_mamba(
        (t == _LINEAR_ATTN for t in layer_types(cfg, n)),
        v_heads=int(cfg.get("linear_num_value_heads") or heads),
        v_dim=int(cfg.get("linear_value_head_dim") or 2 * k_dim),
        k_heads=k_heads,
        k_dim=k_dim,
        d_conv=int(cfg["linear_conv_kernel_dim"]),
        allow_neg_eigval=bool(cfg["linear_allow_neg_eigval"]),
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"mamba": mamba(cfg, n), "olmo2_norms": True, "qk_norm_whole": True}
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_theta", 0) is None:  # NoPE
        fields["rope_layers"] = (False,) * n
    return fields


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its MLP: its DeltaNet layer (separate q, k, v, g, a, b
    projections, o_norm, o_proj; the conv: `check_conv`), or its attention's q/k norms (whole rows) and the norm after
    its MLP."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    if not m.layers[i]:
        a = p + "self_attn."
        return {a + "q_norm.weight": (c.num_heads * c.head_dim,),
                a + "k_norm.weight": (c.num_kv_heads * c.head_dim,),
                p + "post_feedforward_layernorm.weight": (h,)}  # fmt: skip
    x, kd = p + "linear_attn.", m.n_groups * m.d_state
    return {x + "q_proj.weight": (kd, h), x + "k_proj.weight": (kd, h),
            x + "v_proj.weight": (m.d_inner, h), x + "g_proj.weight": (m.d_inner, h),
            x + "a_proj.weight": (m.n_heads, h), x + "b_proj.weight": (m.n_heads, h),
            x + "A_log": (m.n_heads,),
            x + "dt_bias": (m.n_heads,), x + "o_norm.weight": (m.head_dim,),
            x + "o_proj.weight": (h, m.d_inner)}  # fmt: skip


def rename_norms(weights) -> None:
    """The published norms' names listed as Llama's (`_NORMS`, both kinds of layer)."""
    for name in list(weights):
        for old, new in _NORMS.items():
            if old in name:
                weights.rename(name, name.replace(old, new))


def check_conv(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """Every DeltaNet layer's conv, whole or in parts (`delta_rule_config.check_conv`)."""
    check_conv_parts(c, headers, "linear_attn.", "linear_conv_kernel_dim")
