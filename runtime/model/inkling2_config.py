"""Inkling 2's text model config (`Inkling2ForCausalLM`; `Inkling2ForConditionalGeneration`'s
`text_config`, its vision tower not read) as transformers' Inkling2TextConfig reads it, for
`model/inkling2.py`; reached through `mamba_config` (every layer keeps its four short convs'
inputs in the hybrids' state slots beside its KV cache: `MambaConfig.inkling2`,
`parallel_attention`). Kept apart from the model so that reading a config imports no layer code.

- `layer_types` ("hybrid": full attention, "hybrid_sliding": a window of `sliding_window_size`;
  by default every sixth layer full); the window layers' `swa_num_key_value_heads` (their own
  KV cache shape); `swa_num_attention_heads` or `swa_head_dim` other than the full layers'
  refused;
- relative-position logits (`d_rel`, `rel_extent`; the window on window layers), L2 clips of q, k
  (`qk_l2_clip_threshold`) and the relative states (`rel_l2_clip_threshold`), the full layers'
  logarithmic scaling from `log_scaling_n_floor`; per-token attention sinks (`sink_proj`);
- block attention residuals every `n_layers_per_attn_res_block` layers;
- experts in every layer (`n_routed_experts`, `moe_intermediate_size`, also read from
  `intermediate_size`), SwiGLU softcapped (`mlp_gate_softcap`, `mlp_up_softcap`), routed by
  sigmoid scores (`scoring_func` "sigmoid" only) times `route_scale` (`routed_scaling_factor`);
- the head `unpadded_vocab_size` rows (the logits' width: `ModelConfig.vocab_size`), the
  embedding `vocab_size`; `final_logit_softcapping`;
- Inkling2Loop (`Inkling2LoopForCausalLM`, `Inkling2LoopForConditionalGeneration`, model_type
  "inkling2_loop_text": its own defaults, `LOOP_DEFAULTS`): the looped layers and passes
  (`loop_fields`: `Inkling2Layers.loop`; a KV cache and conv state per layer and further pass,
  `Inkling2Layers.cache_layers`), the message gates (`controllers.*`) and queries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.conv_attention_configs import Inkling2Layers
from pagoda.runtime.model.inkling_config import expert_rows, kv_conv_share
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"Inkling2ForCausalLM": "inkling2", "Inkling2ForConditionalGeneration": "inkling2",
                 # Inkling2Loop: Inkling 2's layers, a span of them looped (`loop_fields`)
                 "Inkling2LoopForCausalLM": "inkling2",
                 "Inkling2LoopForConditionalGeneration": "inkling2"}  # fmt: skip
TEXT_MODEL_TYPES = {
    "Inkling2ForConditionalGeneration": {"inkling2_text": "inkling2"},
    "Inkling2LoopForConditionalGeneration": {"inkling2_loop_text": "inkling2"},
}
# Inkling2LoopTextConfig's loop defaults (its `loop_config` keys in parentheses)
LOOP_KEYS = (
    ("loop_layer_index_start", "core_start", 6),
    ("loop_layer_index_end", "core_end", 18),
    ("loop_num_passes", "num_passes", 3),
    ("loop_gate_rank", "gate_rank", 64),
)
WRAPPER_TIES = {"inkling2": False, "inkling2_loop": False}
# Inkling2TextConfig's attribute_map
ALIASES = {"sconv_kernel_size": "conv_kernel_size", "model_max_length": "max_position_embeddings",
           "sliding_window": "sliding_window_size", "num_local_experts": "n_routed_experts",
           "intermediate_size": "moe_intermediate_size",
           "routed_scaling_factor": "route_scale"}  # fmt: skip
DEFAULTS = {
    "inkling2": {"vocab_size": 201_024, "unpadded_vocab_size": 200_058, "hidden_size": 4608,
                 "num_hidden_layers": 48, "num_attention_heads": 48, "num_key_value_heads": 8,
                 "head_dim": 128, "swa_num_key_value_heads": 8, "sliding_window_size": 1024,
                 "d_rel": 16, "rel_extent": 1024, "log_scaling_n_floor": 128_000,
                 "log_scaling_alpha": 0.1, "max_position_embeddings": 1_048_576,
                 "rms_norm_eps": 1e-6, "conv_kernel_size": 4, "moe_intermediate_size": 2304,
                 "n_routed_experts": 384, "num_experts_per_tok": 8, "route_scale": 8.0,
                 "qk_l2_clip_threshold": 22.627416997969522, "rel_l2_clip_threshold": 8.0,
                 "n_layers_per_attn_res_block": 6, "mlp_gate_softcap": 4.0,
                 "mlp_up_softcap": 25.0, "final_logit_softcapping": 30.0,
                 "scoring_func": "sigmoid", "tie_word_embeddings": False,
                 "eos_token_id": 200_006},
}  # fmt: skip
# Inkling2LoopTextConfig's defaults where they differ from Inkling2TextConfig's (read before
# those: `config_keys.renamed`, by its `model_type`)
LOOP_DEFAULTS = {"hidden_size": 2304, "num_hidden_layers": 24, "num_attention_heads": 24,
                 "swa_num_attention_heads": 24, "log_scaling_n_floor": 8192,
                 "moe_intermediate_size": 1152, "n_routed_experts": 128}  # fmt: skip
NULLABLE: dict[str, tuple[str, ...]] = {}
# the published names (as transformers saves them too) -> transformers' (its conversion
# mapping "inkling2_text"); the stacked experts' gate/up rows stay interleaved (the model
# splits them), the head padded (the model keeps its `unpadded_vocab_size` rows)
_RENAMES = tuple((re.compile(a), b) for a, b in (
    # Inkling2Loop's message gates (its q gate stored as `attn`'s: before `.attn.`)
    (r"controllers\.attn\.", "q_message_gate."), (r"controllers\.(k|v|mlp)\.", r"\1_message_gate."),
    (r"_message_gate\.down_weight$", "_message_gate.down_proj.weight"),
    (r"_message_gate\.gain_weight$", "_message_gate.message_gate_proj.weight"),
    (r"_message_gate\.forget_weight$", "_message_gate.forget_gate_proj.weight"),
    (r"^model\.llm\.unembed\.", "lm_head."), (r"^model\.llm\.", "model."),
    (r"embed\.weight$", "embed_tokens.weight"), (r"embed_norm\.", "embed_tokens.embed_norm."),
    (r"mlp\.experts\.w13_weight$", "mlp.experts.gate_up_proj"),
    (r"mlp\.experts\.w2_weight$", "mlp.experts.down_proj"),
    (r"mlp\.gate\.bias$", "mlp.gate.e_score_correction_bias"), (r"\.attn\.", ".self_attn."),
    (r"self_attn\.wq_du", "self_attn.q_proj.linear"), (r"self_attn\.wk_dv", "self_attn.k_proj.linear"),
    (r"self_attn\.wv_dv", "self_attn.v_proj.linear"),
    (r"self_attn\.k_sconv\.", "self_attn.k_proj.sconv."),
    (r"self_attn\.v_sconv\.", "self_attn.v_proj.sconv."),
    (r"self_attn\.rel_logits_proj\.", "self_attn.relative_position_bias."),
    (r"self_attn\.wr_du", "self_attn.relative_position_bias.linear"),
    (r"self_attn\.q_l2_clip\.", "self_attn.q_proj.norm."),
    (r"self_attn\.rel_l2_clip\.", "self_attn.relative_position_bias.norm."),
    (r"self_attn\.wo_ud", "self_attn.o_proj.linear"),
    (r"self_attn\.gate_attn", "self_attn.o_proj.gate_proj"),
    (r"self_attn\.attn_sink_proj", "self_attn.sink_proj"),
    (r"attn_sconv\.", "post_attention_convolution."), (r"mlp_sconv\.", "post_mlp_convolution."),
    (r"(convolution|sconv)\.weight(?!_)", r"\1.conv1d.weight"),
    (r"(convolution|sconv)\.static_w$", r"\1.static_weight"),
    (r"(convolution|sconv)\.weight_proj$", r"\1.weight_proj.weight"),
    (r"mlp_norm", "post_attention_layernorm"), (r"attn_norm", "input_layernorm"),
    (r"(q|k|v)_input_norm", r"\1_input_layernorm"),
    (r"attn_res\.mlp_queries\.(\d+)$", r"layers.\1.mlp_input.query"),
    (r"attn_res\.output_query$", "final_input.query"),
))  # fmt: skip
# Inkling2Loop's message queries, stored as two [2 x looped layers, H] tensors: each looped
# layer's (q, mlp) queries and its (k, v) ones (read by the model as [layers, 4, H])
MESSAGE_QUERIES = ("model.middle_cycle_cross_pass_queries",
                   "model.middle_cycle_cross_pass_kv_queries")  # fmt: skip
_ATTN_QUERY = re.compile(r"attn_res\.attn_queries\.(\d+)$")


def rename(weights) -> None:
    """The published names under transformers' (`_RENAMES`; the attention queries numbered
    from the second layer)."""
    for name in list(weights):
        new = name
        for pattern, to in _RENAMES:
            new = pattern.sub(to, new)
        new = _ATTN_QUERY.sub(lambda m: f"layers.{int(m.group(1)) + 1}.attention_input.query", new)
        if new != name:
            weights.rename(name, new)


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The experts' width as `intermediate_size` (no dense MLP); the logits' width."""
    return {"intermediate_size": cfg["moe_intermediate_size"],
            "vocab_size": cfg["unpadded_vocab_size"], "padded_vocab": cfg["vocab_size"]}  # fmt: skip


def loop_fields(cfg: Mapping[str, Any], n: int, block: int) -> tuple[int, int, int, int]:
    """Inkling2Loop's (start, end, passes, gate rank) as Inkling2LoopTextConfig reads them
    (`loop_config` over the flat keys over its defaults); (0, 0, 1, 0) for Inkling 2."""
    looped = cfg.get("model_type") == "inkling2_loop_text" or any(k in cfg for k, _, _ in LOOP_KEYS)
    if not looped and cfg.get("loop_config") is None:
        return (0, 0, 1, 0)
    nested = cfg.get("loop_config") or {}
    start, end, passes, rank = (int(nested.get(k2, cfg.get(k, d))) for k, k2, d in LOOP_KEYS)
    if passes < 1 or not 0 < start <= end <= n or start % block or end % block or rank < 1:
        raise ValueError(f"inkling2_loop needs 0 < loop_layer_index_start <= loop_layer_index_end "
                         f"<= {n}, both multiples of n_layers_per_attn_res_block {block}, "
                         f"loop_num_passes >= 1 and loop_gate_rank >= 1; got {start}, {end}, "
                         f"{passes}, {rank}")  # fmt: skip
    return start, end, passes, rank


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """ValueError, one line, for what transformers' Inkling 2 runs that this does not."""
    types = cfg.get("layer_types")
    if types is None:
        types = ["hybrid" if (i + 1) % 6 == 0 else "hybrid_sliding" for i in range(n)]
    if len(types) != n or set(types) - {"hybrid", "hybrid_sliding"}:
        raise ValueError(f"inkling2 layer_types must name each of the {n} layers hybrid or "
                         "hybrid_sliding")  # fmt: skip
    heads, d = int(cfg["num_attention_heads"]), int(cfg["head_dim"])
    for key, want in (("swa_num_attention_heads", heads), ("swa_head_dim", d)):
        if int(cfg.get(key) or want) != want:
            raise ValueError(f"inkling2 {key} {cfg[key]} differing from the full layers' {want} "
                             "is not supported")  # fmt: skip
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError(
            f"inkling2 scoring_func {cfg['scoring_func']!r} is not supported (sigmoid)"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"inkling2 hidden_act {cfg['hidden_act']!r} is not supported (silu)")
    sliding = tuple(t == "hybrid_sliding" for t in types)
    kv, swa_kv = int(cfg["num_key_value_heads"]), int(cfg["swa_num_key_value_heads"])
    layers = Inkling2Layers(
        sliding=sliding, swa_kv_heads=swa_kv, d_rel=int(cfg["d_rel"]),
        rel_extent=int(cfg["rel_extent"]), log_floor=int(cfg["log_scaling_n_floor"]),
        log_alpha=float(cfg["log_scaling_alpha"]), qk_clip=float(cfg["qk_l2_clip_threshold"]),
        rel_clip=float(cfg["rel_l2_clip_threshold"]),
        block=int(cfg["n_layers_per_attn_res_block"]), gate_cap=float(cfg["mlp_gate_softcap"]),
        up_cap=float(cfg["mlp_up_softcap"]), route_scale=float(cfg["route_scale"]),
        padded_vocab=int(cfg["padded_vocab"]),
        loop=loop_fields(cfg, n, int(cfg["n_layers_per_attn_res_block"])))  # fmt: skip
    hidden = int(cfg["hidden_size"])
    width = max(kv, swa_kv if any(sliding) else kv) * d
    cap = cfg.get("final_logit_softcapping")
    return {
        "mamba": MambaConfig(
            layers=(True,) * len(layers.cache_layers()), n_heads=1,
            head_dim=2 * width + 2 * hidden, d_state=1,
            d_conv=int(cfg["conv_kernel_size"]), conv_bias=False, mixer="short_conv",
            parallel_attention=True, inkling2=layers,
            kv_convs=((kv, d), (swa_kv, d)) if any(sliding) else ((kv, d),)),
        "sliding_window": int(cfg["sliding_window_size"]) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "relative_logits": True,
        "attention_sinks": True,
        "final_logit_softcapping": None if cap is None else float(cap),
        "num_experts": int(cfg["n_routed_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": True,
    }  # fmt: skip


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors, all of them (`checkpoint_shapes._hybrid_layer`)."""
    ink, f, h = c.family.mamba.inkling2, c.family, c.hidden_size
    hkv, d, k = ink.kv_shape(c, i)[0], c.head_dim, c.family.mamba.d_conv
    q, kv, nh = c.num_heads * d, hkv * d, c.num_heads
    p = f"model.layers.{i}."
    a = p + "self_attn."
    r = a + "relative_position_bias."
    extent = f.sliding_window if ink.sliding[i] else ink.rel_extent
    e, n = f.num_experts, f.moe_intermediate_size
    out = {
        p + "mlp_input.query": (h,), p + "post_attention_layernorm.weight": (h,),
        a + "q_proj.linear.weight": (q, h), a + "q_proj.norm.scale": (nh, d),
        a + "k_proj.linear.weight": (kv, h), a + "v_proj.linear.weight": (kv, h),
        a + "o_proj.gate_proj.weight": (q, h), a + "o_proj.linear.weight": (h, q),
        a + "sink_proj.weight": (nh, h), r + "proj": (ink.d_rel, extent),
        r + "linear.weight": (nh * ink.d_rel, h), r + "norm.scale": (nh, ink.d_rel),
        p + "mlp.experts.gate_up_proj": (e, 2 * n, h), p + "mlp.experts.down_proj": (e, h, n),
        p + "mlp.gate.weight": (e, h), p + "mlp.gate.e_score_correction_bias": (e,),
        p + "post_attention_convolution.conv1d.weight": (h, 1, k),
        p + "post_mlp_convolution.conv1d.weight": (h, 1, k),
    }  # fmt: skip
    if ink.sliding[i]:
        out[p + "input_layernorm.weight"] = (h,)
        for x in "kv":
            out[f"{a}{x}_proj.sconv.conv1d.weight"] = (kv, 1, k)
    else:
        for x in "qkv":
            out[f"{p}{x}_input_layernorm.weight"] = (h,)
        for x in "kv":
            out[f"{a}{x}_proj.sconv.static_weight"] = (k, kv)
            out[f"{a}{x}_proj.sconv.weight_proj.weight"] = (hkv * k, h)
    if i:
        out[p + "attention_input.query"] = (h,) if ink.sliding[i] else (3, h)
    start, end, _, rank = ink.loop
    if start <= i < end:  # a looped layer's message gates
        for x in ("q", "k", "v", "mlp"):
            g = f"{p}{x}_message_gate."
            out[g + "down_proj.weight"] = (rank, 2 * h)
            out[g + "forget_gate_proj.weight"] = (h, rank)
            out[g + "message_gate_proj.weight"] = (h, rank)
    return out


def checkpoint_shapes(c: ModelConfig, out: dict[str, tuple[int, ...]]) -> None:
    """In `checkpoint_shapes.expected_shapes`' tensors: the embeddings' norm, the final block
    residual's query, the embedding (and head) stored padded (their rows cut at load), the
    loop's message queries (`MESSAGE_QUERIES`)."""
    h, ink = c.hidden_size, c.family.mamba.inkling2
    out["model.embed_tokens.embed_norm.weight"] = out["model.final_input.query"] = (h,)
    out["model.embed_tokens.weight"] = (ink.padded_vocab, h)
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    start, end, _, _ = ink.loop
    if end > start:
        for name in ("queries", "kv_queries"):
            out[f"model.middle_cycle_cross_pass_{name}"] = (2 * (end - start), h)


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of Inkling 2's own splits (`model/inkling2.py`): q, the output
    gate, the sinks and the relative states by its query heads, k, v and the dynamic taps by
    the layer's KV heads (split or replicated), o_proj.linear by input columns, the stacked
    experts by width; None for the others (`distributed/tp_families.py`)."""
    if c.family.mamba is None or c.family.mamba.inkling2 is None:  # (a config built by hand)
        return None
    a = "self_attn."
    hkv = c.family.mamba.inkling2.kv_shape(c, layer)[0]
    (q0, q1), (k0, k1) = lay.heads(c.num_heads), lay.kv_heads(hkv)
    by_heads = {a + "q_proj.linear.weight": c.head_dim, a + "o_proj.gate_proj.weight": c.head_dim,
                a + "sink_proj.weight": 1, a + "relative_position_bias.linear.weight":
                c.family.mamba.inkling2.d_rel}  # fmt: skip
    if part in by_heads:
        return (q1 - q0) * by_heads[part], cols
    if part in (a + "k_proj.linear.weight", a + "v_proj.linear.weight"):
        return (k1 - k0) * c.head_dim, cols
    if part.endswith("_proj.sconv.weight_proj.weight"):  # (K taps a KV head)
        return rows // hkv * (k1 - k0), cols
    if part == a + "o_proj.linear.weight":
        return rows, cols // lay.size
    return expert_rows(part, rows, cols, lay)


def held_share(name: str, c: ModelConfig, lay) -> float | None:
    """The part one rank holds of Inkling 2's float32 tensors split by heads (the q and
    relative-state clip scales: its query heads'; the k/v taps: its KV heads'), or None for
    the others."""
    if name.endswith(("q_proj.norm.scale", "relative_position_bias.norm.scale")):
        q0, q1 = lay.heads(c.num_heads)
        return (q1 - q0) / c.num_heads
    if name.endswith(("_proj.sconv.static_weight", "_proj.sconv.conv1d.weight")):
        return kv_conv_share(name, c, lay)
    return None
