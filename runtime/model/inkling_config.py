"""Inkling's text model config (`InklingForCausalLM`; `InklingForConditionalGeneration`'s
`text_config`, its towers not read) as transformers' InklingTextConfig reads it, for
`model/inkling.py`; reached through `mamba_config` (every layer keeps its four short convs'
inputs in the hybrids' state slots beside its KV cache: `MambaConfig.inkling`,
`parallel_attention`). Kept apart from the model so that reading a config imports no layer code.

- `layer_types` ("hybrid": full attention, "hybrid_sliding": a window of `sliding_window_size`
  keys; else from `local_layer_ids`, by default every layer but each sixth); the window layers'
  `swa_num_key_value_heads` / `swa_head_dim` (their own KV cache shape), their query heads
  those of the full layers (`swa_num_attention_heads` otherwise is refused);
- relative-position logits (`d_rel`, `rel_extent`: the window's on the window layers), the
  full layers' logarithmic logit scaling from `log_scaling_n_floor` (`log_scaling_alpha`);
- `conv_kernel_size` (`sconv_kernel_size`) taps on k, v, attention's and the MLP's outputs;
- `mlp_layer_types` ("dense" / "sparse"; else `dense_mlp_idx` dense layers first): a SwiGLU MLP
  `intermediate_size` wide, or `n_routed_experts` experts `moe_intermediate_size` wide (a
  `dense_intermediate_size` key makes `intermediate_size` the experts' width, as transformers
  reads it) with `n_shared_experts` shared ones;
- `logits_mup_width_multiplier` divides the final hidden states before the head;
  `unpadded_vocab_size` below `vocab_size` is refused, as are MTP layers' extra tensors (not run:
  skipped, as transformers skips them) and `shared_expert_sink` false (transformers always
  scores the shared experts with the routed ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.conv_attention_configs import InklingLayers
from pagoda.runtime.distributed.tp_families import stacked_expert_rows
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"InklingForCausalLM": "inkling", "InklingForConditionalGeneration": "inkling"}
# the multimodal wrapper's text model (`hf_tables.TEXT_MODEL_TYPES`); its tie default: false
TEXT_MODEL_TYPES = {"InklingForConditionalGeneration": {"inkling_text": "inkling"}}
WRAPPER_TIES = {"inkling_mm_model": False}
# InklingTextConfig's attribute_map (the keys its checkpoints carry)
ALIASES = {"sconv_kernel_size": "conv_kernel_size", "model_max_length": "max_position_embeddings",
           "sliding_window": "sliding_window_size", "num_local_experts": "n_routed_experts",
           "embedding_multiplier": "logits_mup_width_multiplier"}  # fmt: skip
# transformers' InklingTextConfig defaults, where config.json leaves one out
DEFAULTS = {
    "inkling": {"vocab_size": 201_024, "hidden_size": 6144, "num_hidden_layers": 66,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                "swa_num_key_value_heads": 16, "sliding_window_size": 512,
                "d_rel": 16, "rel_extent": 1024, "log_scaling_alpha": 0.1,
                "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
                "intermediate_size": 24_576, "moe_intermediate_size": 3072,
                "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 2,
                "route_scale": 8.0, "logits_mup_width_multiplier": 24.0,
                "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2},
}  # fmt: skip
NULLABLE = {"inkling": ("log_scaling_n_floor", "unpadded_vocab_size")}


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A `dense_intermediate_size` key: the dense MLP's width, `intermediate_size` the
    experts' (transformers' InklingTextConfig)."""
    if cfg.get("dense_intermediate_size") is None:
        return {}
    return {"moe_intermediate_size": cfg["intermediate_size"],
            "intermediate_size": cfg["dense_intermediate_size"]}  # fmt: skip


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        ids = cfg.get("local_layer_ids")
        local = set(ids) if ids is not None else {i for i in range(n) if (i + 1) % 6}
        types = ["hybrid_sliding" if i in local else "hybrid" for i in range(n)]
    if len(types) != n:
        raise ValueError(f"inkling layer_types names {len(types)} layers, the model has {n}")
    if set(types) - {"hybrid", "hybrid_sliding"}:
        raise ValueError(f"inkling layer_types {sorted(set(types) - {'hybrid', 'hybrid_sliding'})} "
                         "are not supported (hybrid, hybrid_sliding)")  # fmt: skip
    return list(types)


def mlp_layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("mlp_layer_types")
    if types is None:
        dense = int(cfg.get("dense_mlp_idx") or 0)
        types = ["dense" if i < dense else "sparse" for i in range(n)]
    if len(types) != n or set(types) - {"dense", "sparse"}:
        raise ValueError(f"inkling mlp_layer_types must name each of the {n} layers dense or "
                         "sparse")  # fmt: skip
    return list(types)


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """ValueError, one line, for what transformers' Inkling runs that this does not."""
    types = layer_types(cfg, n)
    heads = int(cfg["num_attention_heads"])
    if int(cfg.get("swa_num_attention_heads") or heads) != heads:
        raise ValueError(f"inkling swa_num_attention_heads {cfg['swa_num_attention_heads']} "
                         f"differing from num_attention_heads {heads} is not supported")  # fmt: skip
    u = cfg.get("unpadded_vocab_size")
    if u is not None and int(u) < int(cfg["vocab_size"]):
        raise ValueError(f"inkling unpadded_vocab_size {u} below vocab_size {cfg['vocab_size']} "
                         "(a padded head) is not supported")  # fmt: skip
    if cfg.get("shared_expert_sink") is False:
        raise ValueError("inkling shared_expert_sink false is not supported (transformers "
                         "always scores the shared experts with the routed ones)")  # fmt: skip
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"inkling hidden_act {cfg['hidden_act']!r} is not supported (silu)")
    d, kv = int(cfg["head_dim"]), int(cfg["num_key_value_heads"])
    swa_d = int(cfg.get("swa_head_dim") or d)
    swa_kv = int(cfg["swa_num_key_value_heads"])
    window = int(cfg["sliding_window_size"])
    floor = cfg.get("log_scaling_n_floor")
    layers = InklingLayers(
        sliding=tuple(t == "hybrid_sliding" for t in types), swa_kv_heads=swa_kv,
        swa_head_dim=swa_d, d_rel=int(cfg["d_rel"]), rel_extent=int(cfg["rel_extent"]),
        log_floor=None if floor is None else int(floor),
        log_alpha=float(cfg["log_scaling_alpha"]), shared_experts=int(cfg["n_shared_experts"]),
        route_scale=float(cfg["route_scale"]),
        logits_divisor=float(cfg["logits_mup_width_multiplier"]))  # fmt: skip
    hidden = int(cfg["hidden_size"])
    width = max(kv * d, swa_kv * swa_d) if any(layers.sliding) else kv * d
    mlp = mlp_layer_types(cfg, n)
    sparse = tuple(t == "sparse" for t in mlp)
    experts = int(cfg["n_routed_experts"]) if any(sparse) else 0
    return {
        "mamba": MambaConfig(
            layers=(True,) * n, n_heads=1, head_dim=2 * width + 2 * hidden, d_state=1,
            d_conv=int(cfg["conv_kernel_size"]), conv_bias=False, mixer="short_conv",
            parallel_attention=True, inkling=layers,
            kv_convs=((kv, d), (swa_kv, swa_d)) if any(layers.sliding) else ((kv, d),)),
        "sliding_window": window if any(layers.sliding) else None,
        "window_layers": layers.sliding if any(layers.sliding) else (),
        "relative_logits": True,
        "qk_norm": True,
        "attention_multiplier": 1.0 / d,  # q and k RMS-normalised: 1/d, not d ** -0.5
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]) if experts else 0,
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]) if experts else 0,
        "moe_layers": sparse if experts else (),
        "norm_topk_prob": False,
    }  # fmt: skip


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors, all of them (`checkpoint_shapes._hybrid_layer`)."""
    ink, f, h = c.family.mamba.inkling, c.family, c.hidden_size
    hkv, d = ink.kv_shape(c, i)
    q, kv, k = c.num_heads * d, hkv * d, c.family.mamba.d_conv
    p = f"model.layers.{i}."
    a = p + "self_attn."
    extent = c.family.sliding_window if ink.sliding[i] else ink.rel_extent
    out = {
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h), a + "v_proj.weight": (kv, h),
        a + "r_proj.weight": (c.num_heads * ink.d_rel, h), a + "o_proj.weight": (h, q),
        a + "k_sconv.conv1d.weight": (kv, 1, k), a + "v_sconv.conv1d.weight": (kv, 1, k),
        a + "q_norm.weight": (d,), a + "k_norm.weight": (d,),
        a + "rel_logits_proj.proj": (ink.d_rel, extent),
        p + "attn_sconv.conv1d.weight": (h, 1, k), p + "mlp_sconv.conv1d.weight": (h, 1, k),
    }  # fmt: skip
    m = p + "mlp."
    if not f.has_experts(i):
        s = c.intermediate_size
        out.update({m + "gate_proj.weight": (s, h), m + "up_proj.weight": (s, h),
                    m + "down_proj.weight": (h, s), m + "global_scale": (1,)})  # fmt: skip
        return out
    e, n, sh = f.num_experts, f.moe_intermediate_size, ink.shared_experts
    out.update({
        m + "gate.weight": (e + sh, h), m + "gate.global_scale": (1,),
        m + "gate.e_score_correction_bias": (e,),
        m + "experts.gate_up_proj": (e, 2 * n, h), m + "experts.down_proj": (e, h, n),
        m + "shared_experts.gate_proj": (sh, n, h), m + "shared_experts.up_proj": (sh, n, h),
        m + "shared_experts.down_proj": (sh, h, n),
    })  # fmt: skip
    return out


def checkpoint_shapes(c: ModelConfig, out: dict[str, tuple[int, ...]]) -> None:
    """The embeddings' norm in `checkpoint_shapes.expected_shapes`' tensors."""
    out["model.embed_tokens.embed_norm.weight"] = (c.hidden_size,)


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split Inkling's (or Inkling 2's) window layers (one line), or
    None (`distributed/tp_families.py`): their KV heads must divide by `size` or it by them
    (the full layers' are the shared check's)."""
    if c.family.mamba is None:  # (a config built by hand)
        return None
    for kv, _ in c.family.mamba.kv_convs[1:]:
        if kv % size and size % kv:
            return (f"--tensor-parallel-size {size}: the window layers' {kv} KV heads can "
                    f"neither be split over {size} ranks nor replicated evenly")  # fmt: skip
    return None


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of Inkling's own splits (`model/inkling.py`): q and r_proj by
    its query heads, k and v by the layer's KV heads (split or replicated), the stacked routed
    and shared experts by width (gate and up rows, down's columns); None for the others
    (`distributed/tp_families.py`)."""
    if c.family.mamba is None or c.family.mamba.inkling is None:  # (a config built by hand)
        return None
    hkv, d = c.family.mamba.inkling.kv_shape(c, layer)
    (q0, q1), (k0, k1) = lay.heads(c.num_heads), lay.kv_heads(hkv)
    if part == "self_attn.q_proj.weight":
        return (q1 - q0) * d, cols
    if part == "self_attn.r_proj.weight":
        return (q1 - q0) * c.family.mamba.inkling.d_rel, cols
    if part in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        return (k1 - k0) * d, cols
    return expert_rows(part, rows, cols, lay)


def expert_rows(part: str, rows: int, cols: int, lay) -> tuple[int, int] | None:
    """A rank's (rows, columns) per expert of Inkling's stacked routed and shared experts: gate
    and up by rows, down by columns; None for other tensors."""
    if part in ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"):
        return rows // lay.size, cols
    if part == "mlp.shared_experts.down_proj":
        return rows, cols // lay.size
    return stacked_expert_rows(part, rows, cols, lay.size)


def kv_conv_share(name: str, c: ModelConfig, lay) -> float:
    """The part of a k or v conv (`*_sconv.conv1d.weight`, [KV heads x head size, 1, K]) one
    rank holds: its layer's KV heads (split, or one replicated)."""
    layer = int(name.split("model.layers.", 1)[1].split(".", 1)[0])
    m = c.family.mamba
    hkv = (m.inkling or m.inkling2).kv_shape(c, layer)[0]
    k0, k1 = lay.kv_heads(hkv)
    return (k1 - k0) / hkv
