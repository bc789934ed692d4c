"""GLM-5-Next's config as transformers 5 reads it (`Glm5NextForConditionalGeneration`,
model_type glm5_next: GLM-5.3-Flash; its text model, `text_config` of model_type
glm5_next_text, or the text fields at the top level), for `model/glm5_next.py`; reached through
`mamba_config` (the KDA layers' state slots). Kept apart from the model so that reading a
config imports no layer code.

- layer kinds from ``layer_types`` ("linear_attention": KDA; "indexed_attention", or
  "full_attention" read as it: NoPE latent attention with the k-pool DSA indexer), by default
  every fourth layer indexed (``i % 4 == 3``); MLP kinds from ``mlp_layer_types`` (by default
  the first three dense);
- the indexed layers' k-pool indexer (`model_configs.IndexerConfig`, ``kpool``): GLM-5's
  ``indexer_types`` ("full" / "shared", by default from ``index_topk_pattern`` or
  ``index_topk_freq`` / ``index_skip_topk_offset``, as transformers), ``index_topk``,
  ``index_kpool``, ``index_n_heads``, ``index_head_dim`` (`indexer`); a "shared" layer that
  does not follow a full one, and ``index_kpool_always_select_tail`` false (a token would not
  see its own unfinished pool), refused in one line;
- the KDA layers' heads, head size, conv width and forget-gate bound from ``linear_num_heads``,
  ``linear_head_dim``, ``linear_conv_kernel_dim``, ``linear_lower_bound`` (or the published
  ``linear_attn_config``: ``num_heads``, ``head_dim``, ``short_conv_kernel_size``,
  ``gate_lower_bound``, ``safe_gate``); a null bound (the unbounded gate) is refused;
- DeepSeek-V3's experts and router (`deepseek_config`), every SwiGLU clamped by
  ``swiglu_limit``; mHC hyper-connections (``hc_mult``, ``hc_eps``, ``hc_sinkhorn_iters``).

The checkpoint's names: transformers' conversion mapping ("glm5_next") renames the stored ones
at load (a KDA layer's ``f_a_proj``, ``f_b_proj``, ``dt_bias`` and ``A_log`` under
``forget_gate.``; ``hc_{attn,ffn}_{fn,base,scale}`` as ``{attn,ffn}_hc.*``; the experts one
by one and the conv in q, k, v parts stacked) and reverses them when it saves:
`rename_weights` applies the renames, the experts and the conv are read as stored (per
expert as DeepSeek's; the conv whole or in parts, `delta_rule_config.conv_names`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import deepseek_config, kimi_linear_config
from pagoda.runtime.model.delta_rule_config import check_conv as check_conv_parts
from pagoda.runtime.model.delta_rule_config import delta_rule_mamba
from pagoda.runtime.model_configs import HyperConfig, IndexerConfig
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"Glm5NextForConditionalGeneration": "glm5_next"}  # its text model
TEXT_MODEL_TYPES = {"Glm5NextForConditionalGeneration": {"glm5_next_text": "glm5_next"}}
WRAPPER_TIES = {"glm5_next": False}  # Glm5NextConfig's
# transformers' Glm5NextTextConfig defaults (GlmMoeDsaConfig's where it keeps them)
DEFAULTS = {
    "glm5_next": {"vocab_size": 154880, "hidden_size": 4096, "intermediate_size": 12288,
                  "moe_intermediate_size": 2048, "num_hidden_layers": 45,
                  "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 288,
                  "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1,
                  "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 256,
                  "qk_rope_head_dim": 0, "v_head_dim": 256, "max_position_embeddings": 1048576,
                  "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
                  "pad_token_id": 154820, "index_topk": 2048, "index_head_dim": 128,
                  "index_n_heads": 32, "index_kpool": 16, "index_kpool_always_select_tail": True,
                  "linear_head_dim": 128, "linear_num_heads": 64, "linear_conv_kernel_dim": 4,
                  "linear_lower_bound": -5.0, "hc_mult": 4, "hc_eps": 1e-6,
                  "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0},
}  # fmt: skip
NULLABLE = ("linear_lower_bound", "q_lora_rank")  # (null: refused in `overrides`)
_LINEAR, _INDEXED = "linear_attention", "indexed_attention"
# transformers' conversion_mapping "glm5_next" renames (stored name -> its module's)
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"\.self_attn\.(f_a_proj|f_b_proj|dt_bias|A_log)\b", r".self_attn.forget_gate.\1"),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"),
))  # fmt: skip
HC = ("fn", "base", "scale")


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [_INDEXED if i % 4 == 3 else _LINEAR for i in range(n)]
    types = [_INDEXED if t == "full_attention" else t for t in types]
    if len(types) != n or set(types) - {_LINEAR, _INDEXED}:
        raise ValueError(f"glm5_next layer_types must name {_LINEAR!r} or {_INDEXED!r} for "
                         f"each of the {n} layers, got {types}")  # fmt: skip
    return types


def mlp_kinds(cfg: Mapping[str, Any], n: int) -> list[str]:
    kinds = cfg.get("mlp_layer_types")
    return list(kinds) if kinds is not None else ["dense"] * min(3, n) + ["sparse"] * (n - 3)


def _flat(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``linear_attn_config``'s keys read as transformers' flat ones (`__post_init__`'s)."""
    lin, out = cfg.get("linear_attn_config"), dict(cfg)
    if lin is not None:
        for key, flat in (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
                          ("short_conv_kernel_size", "linear_conv_kernel_dim"),
                          ("gate_lower_bound", "linear_lower_bound")):  # fmt: skip
            out[flat] = lin.get(key, out.get(flat))
        if lin.get("safe_gate", True) and out.get("linear_lower_bound") is None:
            out["linear_lower_bound"] = -5.0
    return out


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """SiLU only; the unfinished pool always kept; a bounded forget gate (module docstring)."""
    cfg = _flat(cfg)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a glm5_next "
                         "model (silu)")  # fmt: skip
    if not cfg.get("index_kpool_always_select_tail", True):
        raise ValueError("index_kpool_always_select_tail false is not supported in a glm5_next "
                         "model (a token would not see its own unfinished k-pool)")  # fmt: skip
    if int(cfg.get("qk_rope_head_dim") or 0):
        raise ValueError(f"qk_rope_head_dim {cfg['qk_rope_head_dim']} is not supported in a "
                         "glm5_next model (its indexed attention is NoPE: 0)")  # fmt: skip
    if cfg.get("q_lora_rank") is None:
        raise ValueError("glm5_next needs q_lora_rank (its indexer reads the q bottleneck)")
    if cfg.get("linear_lower_bound") is None:
        raise ValueError("linear_lower_bound null is not supported in a glm5_next model (the "
                         "bounded KDA forget gate only)")  # fmt: skip
    return cfg


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """The KDA layers as recurrent layers: H heads of K, one key head per value head."""
    heads, dim = int(cfg["linear_num_heads"]), int(cfg["linear_head_dim"])
    return delta_rule_mamba(
        (t == _LINEAR for t in layer_types(cfg, n)),
        v_heads=heads,
        v_dim=dim,
        k_heads=heads,
        k_dim=dim,
        d_conv=int(cfg["linear_conv_kernel_dim"]),
        mixer="kda",
    )


def indexer(cfg: Mapping[str, Any], types: list[str]) -> IndexerConfig:
    """GLM-5's indexer as `deepseek_config` reads it (``indexer_types``, by default from
    ``index_topk_pattern`` or ``index_topk_freq`` / ``index_skip_topk_offset``) with its
    k-pools, "full" on the indexed layers that run one; a "shared" layer must follow a full one
    (transformers' reuses the layer before's choice), else refused in one line."""
    ix = deepseek_config.indexer_config(cfg, "glm5_next")
    full = tuple(f and t == _INDEXED for f, t in zip(ix.full_layers, types))
    for i, t in enumerate(types):
        if t == _INDEXED and not full[i] and (i == 0 or not full[i - 1]):
            raise ValueError(f"glm5_next layer {i}'s indexer is 'shared' but layer {i - 1} runs "
                             "no indexer of its own (a shared layer reuses the previous "
                             "layer's choice)")  # fmt: skip
    return replace(ix, full_layers=full)


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Kimi Linear's (DeepSeek-V3's experts, the KDA layers) with GLM-5's NoPE latent attention
    and its k-pool indexer, the hyper-connections and the clamp."""
    cfg = _flat(cfg)
    types = layer_types(cfg, n)
    kimi = {**cfg, "layer_types": ["full_attention" if t == _INDEXED else t for t in types],
            "mlp_layer_types": mlp_kinds(cfg, n), "linear_attn_config": None}  # fmt: skip
    fields = kimi_linear_config.family_fields(kimi, n)
    mla = deepseek_config.mla_config(cfg, "glm5_next")
    hyper = HyperConfig(mult=int(cfg["hc_mult"]), sinkhorn_iters=int(cfg["hc_sinkhorn_iters"]),
                        eps=float(cfg["hc_eps"]), norm_eps=mla.norm_eps)  # fmt: skip
    limit = float(cfg["swiglu_limit"])
    return {**fields, "mamba": mamba(cfg, n), "mla": replace(mla, indexer=indexer(cfg, types)),
            "hyper": hyper, "swiglu_limit": limit if limit > 0 else None,
            "kda_lower_bound": float(cfg["linear_lower_bound"])}  # fmt: skip


def rename_weights(weights) -> None:
    """The stored names listed as transformers' modules name them (module docstring)."""
    weights.rename_by(_RENAMES)


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors beside its norms, its latent attention and its experts
    (`checkpoint_shapes`'): its KDA tensors (the conv: `check_conv`), the hyper-connections."""
    f, h, p = c.family, c.hidden_size, f"model.layers.{i}."
    m, a, n = f.mamba, p + "self_attn.", f.hyper.mult
    out: dict[str, tuple[int, ...]] = {}
    if m.layers[i]:
        d, k, g = m.d_inner, m.head_dim, a + "forget_gate."
        out.update({a + "q_proj.weight": (d, h), a + "k_proj.weight": (d, h),
                    a + "v_proj.weight": (d, h), a + "b_proj.weight": (m.n_heads, h),
                    g + "f_a_proj.weight": (k, h), g + "f_b_proj.weight": (d, k),
                    g + "A_log": (m.n_heads,), g + "dt_bias": (d,),
                    a + "g_a_proj.weight": (k, h), a + "g_b_proj.weight": (d, k),
                    a + "o_norm.weight": (k,), a + "o_proj.weight": (h, d)})  # fmt: skip
    for block in ("attn_hc.", "ffn_hc."):
        out.update({p + block + "fn": ((2 + n) * n, n * h), p + block + "base": ((2 + n) * n,),
                    p + block + "scale": (3,)})  # fmt: skip
    return out


def check_conv(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """Every KDA layer's conv, [3 H K, 1, kernel]."""
    check_conv_parts(c, headers, "self_attn.", "linear_conv_kernel_dim")
