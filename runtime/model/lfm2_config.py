"""LFM2's config as transformers 5 reads it (`Lfm2ForCausalLM`: LiquidAI LFM2-350M to 2.6B),
for `model/lfm2.py`; reached through `mamba_config` (its layers keep a per-sequence conv state
in the hybrids' state slots). Kept apart from the model so that reading a config imports no
layer code.

- `layer_types` ("conv" / "full_attention"; else `full_attn_idxs`, transformers' default every
  layer attention) picks each layer's operator: a gated short convolution
  (`MambaConfig.mixer` "short_conv", `conv_L_cache` wide) or Qwen3-style attention (q/k norms
  per head, rotary);
- the MLP is SwiGLU (`w1`, `w3`, `w2`), its width `intermediate_size` (or `block_ff_dim`)
  adjusted as `Lfm2MLP` does where `block_auto_adjust_ff_dim`: 2/3 of it, times
  `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`;
- LFM2-MoE (`Lfm2MoeForCausalLM`: LFM2-8B-A1B): dense MLPs (`intermediate_size` as it is) in
  the first `num_dense_layers` layers, then SwiGLU experts (`feed_forward.experts.{e}.w1/w3/w2`)
  picked by the sigmoid of the router's logits plus a choice-only `expert_bias` (where
  `use_expert_bias`), weighted by the uncorrected scores renormalised (`norm_topk_prob`) times
  `routed_scaling_factor` (`moe_routing.GroupedRouter`, 1e-6 added to the renormalising sum as
  transformers adds it);
- LFM3 (`Lfm3ForCausalLM`: LFM3-1.7B): LFM2's conv layers beside "full_attention" and
  "sliding_attention" ones (`sliding_window` keys; its default `layer_types`: attention at
  4k + 2, sliding at 4k + 4, conv elsewhere), rotary by layer kind (`rope_parameters`: the
  sliding layers' default one as `local_rope_theta`, the full layers' "proportional": their
  base, `partial_rotary_factor` of the angles over the whole head), each head's attention
  output times sigmoid(`gate_proj`(x)) where `use_attention_gate` (transformers' `g_proj`;
  `MambaConfig.attn_head_gate`),
  RMSNorms on the operator's and the MLP's outputs before their residual adds where
  `use_sandwich_norm` (`post_operator_norm`, `post_ffn_norm`: read as GLM-4's,
  `FamilyConfig.glm4_norms`), the MLP `intermediate_size` wide as it is;
- `norm_eps`; tied by default (`tie_embedding`, the older key, wins where set); `conv_bias`
  puts biases on the conv and both of its projections.

The checkpoint's names (`operator_norm`, `ffn_norm`, `self_attn.out_proj`, `q_layernorm`,
`embedding_norm`: the final norm) are read as Llama's (`safetensors_weights._PHI_RENAMES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model_configs import ExpertRouting
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"Lfm2ForCausalLM": "lfm2", "Lfm2MoeForCausalLM": "lfm2_moe",
                 "Lfm3ForCausalLM": "lfm3"}  # fmt: skip
# transformers' Lfm2Config defaults, where config.json leaves one out
DEFAULTS = {
    "lfm2": {"vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288,
             "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 128_000, "norm_eps": 1e-5, "tie_word_embeddings": True,
             "rope_theta": 1_000_000.0, "conv_bias": False, "conv_L_cache": 3,
             "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
             "block_auto_adjust_ff_dim": True},
    "lfm2_moe": {"vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168,
                 "moe_intermediate_size": 1792, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "max_position_embeddings": 128_000, "norm_eps": 1e-5,
                 "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "conv_bias": False,
                 "conv_L_cache": 3, "num_dense_layers": 2, "num_experts_per_tok": 4,
                 "num_experts": 32, "use_expert_bias": True, "routed_scaling_factor": 1.0,
                 "norm_topk_prob": True},
    "lfm3": {"vocab_size": 128_000, "hidden_size": 2048, "intermediate_size": 7680,
             "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4,
             "head_dim": 128, "max_position_embeddings": 128_000, "norm_eps": 1e-5,
             "tie_word_embeddings": True, "conv_bias": False, "conv_L_cache": 7,
             "sliding_window": 256, "use_sandwich_norm": True, "use_attention_gate": True,
             "bos_token_id": 124_894, "eos_token_id": 124_900},
}  # fmt: skip
_CONV, _ATTENTION, _SLIDING = "conv", "full_attention", "sliding_attention"
_LFM3 = "use_sandwich_norm"  # a key every lfm3 config has (its DEFAULTS), no lfm2 one
# transformers' Lfm3Config rotary by layer kind, where config.json has no rope_parameters
DEFAULT_ROPE = {
    _SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    _ATTENTION: {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                 "partial_rotary_factor": 0.5},
}  # fmt: skip


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    lfm3 = _LFM3 in cfg
    if types is None and lfm3:  # transformers' Lfm3Config default
        types = [_ATTENTION if i % 4 == 2 else _SLIDING if i % 4 == 0 and i > 0 else _CONV
                 for i in range(n)]  # fmt: skip
    if types is None:
        attn = cfg.get("full_attn_idxs")
        attn = set(range(n) if attn is None else attn)
        types = [_ATTENTION if i in attn else _CONV for i in range(n)]
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    kinds = (_CONV, _ATTENTION, _SLIDING) if lfm3 else (_CONV, _ATTENTION)
    unknown = sorted({t for t in types if t not in kinds})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported in an "
                         f"{'lfm3' if lfm3 else 'lfm2'} model ({', '.join(kinds)})")  # fmt: skip
    return list(types)


def _mlp_width(cfg: Mapping[str, Any]) -> int:
    """`Lfm2MLP`'s width (LFM2-MoE's dense MLPs and LFM3's: `intermediate_size` as it is)."""
    if "moe_intermediate_size" in cfg or _LFM3 in cfg:
        return int(cfg["intermediate_size"])
    width = int(cfg.get("block_ff_dim") or cfg["intermediate_size"])
    if not cfg.get("block_auto_adjust_ff_dim"):
        return width
    width = int(2 * width / 3)
    multiplier = cfg.get("block_ffn_dim_multiplier")
    if multiplier is not None:
        step = int(cfg["block_multiple_of"])
        width = step * ((int(multiplier * width) + step - 1) // step)
    return width


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`."""
    tied = cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))
    return {"intermediate_size": _mlp_width(cfg), "rms_norm_eps": cfg["norm_eps"],
            "tie_word_embeddings": tied, "attention_bias": False}  # fmt: skip


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """The conv layers as recurrent layers keeping a conv state of `conv_L_cache - 1` inputs."""
    hidden = int(cfg["hidden_size"])
    return MambaConfig(
        layers=tuple(t == _CONV for t in layer_types(cfg, n)),
        n_heads=1,
        head_dim=hidden,
        d_state=1,
        d_conv=int(cfg["conv_L_cache"]),
        conv_bias=bool(cfg["conv_bias"]),
        mixer="short_conv",
        attn_head_gate=bool(cfg.get("use_attention_gate")),  # (LFM3's)
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"mamba": mamba(cfg, n)}
    if _LFM3 in cfg:
        fields.update(_lfm3_fields(cfg, n))
    if "moe_intermediate_size" in cfg:  # LFM2-MoE: experts after the first dense layers
        dense = int(cfg["num_dense_layers"])
        routing = ExpertRouting(scoring="sigmoid", correction_bias=bool(cfg["use_expert_bias"]),
                                routed_scaling_factor=float(cfg["routed_scaling_factor"]),
                                renorm_eps=1e-6)  # fmt: skip
        fields.update(routing=routing, num_experts=int(cfg["num_experts"]),
                      num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                      norm_topk_prob=bool(cfg["norm_topk_prob"]),
                      moe_layers=tuple(i >= dense for i in range(n)))  # fmt: skip
    return fields


def _lfm3_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """LFM3's sliding layers (their window, their default rotary's base) and sandwich norms."""
    sliding = tuple(t == _SLIDING for t in layer_types(cfg, n))
    local = (cfg.get("rope_parameters") or DEFAULT_ROPE).get(_SLIDING) or DEFAULT_ROPE[_SLIDING]
    if any(sliding) and local.get("rope_type", "default") != "default":
        raise ValueError(f"lfm3 sliding_attention rope_type {local['rope_type']!r} is not "
                         "supported (default)")  # fmt: skip
    if any(sliding) and cfg.get("sliding_window") is None:
        raise ValueError("lfm3's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    out: dict[str, Any] = {"glm4_norms": bool(cfg["use_sandwich_norm"])}
    if any(sliding):
        out.update(sliding_window=int(cfg["sliding_window"]), window_layers=sliding,
                   local_rope_theta=float(local.get("rope_theta") or 10_000.0))  # fmt: skip
    return out


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides attention's projections and the two norms (checked as the
    hybrids'): its short conv or attention's q/k norms, and its MLP."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out: dict[str, tuple[int, ...]] = {}
    if m.layers[i]:
        x = p + "conv."
        out.update({x + "in_proj.weight": (3 * h, h), x + "conv.weight": (h, 1, m.d_conv),
                    x + "out_proj.weight": (h, h)})  # fmt: skip
        if m.conv_bias:
            out.update({x + "in_proj.bias": (3 * h,), x + "conv.bias": (h,),
                        x + "out_proj.bias": (h,)})  # fmt: skip
    else:
        a = p + "self_attn."
        out[a + "q_norm.weight"] = out[a + "k_norm.weight"] = (c.head_dim,)
        if m.attn_head_gate:  # LFM3's gate, one a head
            out[a + "gate_proj.weight"] = (c.num_heads, h)  # (transformers: g_proj)
    if c.family.glm4_norms:  # LFM3's sandwich norms (read as GLM-4's)
        for norm in ("post_self_attn_layernorm", "post_mlp_layernorm"):
            out[f"{p}{norm}.weight"] = (h,)
    s, f = c.intermediate_size, p + "feed_forward."
    if c.family.has_experts(i):  # LFM2-MoE's router, its choice-only bias, each expert
        e, s, f = c.family.num_experts, c.family.moe_intermediate_size, f + "experts."
        out[p + "feed_forward.gate.weight"] = (e, h)
        if c.family.routing.bias:
            out[p + "feed_forward.expert_bias"] = (e,)
        for x in range(e):
            g = f"{f}{x}."
            out.update({g + "w1.weight": (s, h), g + "w3.weight": (s, h), g + "w2.weight": (h, s)})
        return out
    out.update({f + "w1.weight": (s, h), f + "w3.weight": (s, h), f + "w2.weight": (h, s)})
    return out


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of a short conv's projections (`model/lfm2.py`: in_proj's rows
    of B, C and x and their biases by channels, out_proj by input columns) and of the dense
    MLP's w2 (input columns), or None for the other tensors (`distributed/tp_families.py`)."""
    if part in ("conv.in_proj.weight", "conv.in_proj.bias"):
        return rows // lay.size, cols
    if part in ("conv.out_proj.weight", "feed_forward.w2.weight"):
        return rows, cols // lay.size
    return None
