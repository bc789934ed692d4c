"""Ergo's config.json (`ErgoForCausalLM`: Amazon's Ergo) as transformers' ErgoConfig reads it,
and its checkpoint's names (the training framework's serving layout, which transformers
renames at load): the `FamilyConfig` fields `model/ergo.py` runs. Kept apart from the model so
that reading a config imports no layer code.

- `layer_types` (by default every `global_attention_every_n_layers`-th layer full attention,
  the rest sliding): the sliding layers see `sliding_window` keys (`local_attention_window` in
  the published configs) and rotate (interleaved pairs, `rope_parameters` flat or under
  "sliding_attention"); the full ones have no rotary, their scores × `global_attention_scale`
  where set;
- `mlp_layer_types` (by default dense for the first `num_dense_blocks`): a dense ReLU² MLP of
  `first_dense_intermediate_size`, else ReLU² experts picked by the sigmoid of the router's
  logits plus a choice-only correction bias, renormalised, × `moe_routed_scaling_factor`, each
  expert's output RMS-normalised by its own weight, beside an RMS-normalised shared expert of
  `shared_intermediate_size`.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"ErgoForCausalLM": "ergo"}
MODEL_CLASSES = {"ergo": ("ergo", "ErgoModel")}
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' ErgoConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "ergo": {"vocab_size": 262_144, "hidden_size": 8192, "num_hidden_layers": 64,
             "num_attention_heads": 64, "num_key_value_heads": 8,
             "first_dense_intermediate_size": 32_768, "num_dense_blocks": 1,
             "moe_intermediate_size": 4096, "shared_intermediate_size": 8192,
             "num_experts": 256, "num_experts_per_tok": 8, "moe_routed_scaling_factor": 8**0.5,
             "max_position_embeddings": 524_288, "rms_norm_eps": 1e-12, "sliding_window": 512,
             "global_attention_every_n_layers": 4, "rope_theta": 1_000_000.0,
             "tie_word_embeddings": False, "pad_token_id": 0, "eos_token_id": 1,
             "bos_token_id": 2},
}  # fmt: skip
NULLABLE = {"ergo": ("global_attention_scale",)}


def overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`: the dense MLP's width, the
    published configs' name for the window, no head_dim key (hidden / heads)."""
    out = {"intermediate_size": cfg["first_dense_intermediate_size"]}
    if cfg.get("local_attention_window") is not None:
        out["sliding_window"] = cfg["local_attention_window"]
    out["head_dim"] = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get(SLIDING), dict):
        out["rope_parameters"] = params[SLIDING]  # (the full layers': none)
    return out


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of an Ergo config.json (its layers: `n`); ValueError, one line,
    for what it does not run."""
    every = int(cfg["global_attention_every_n_layers"])
    types = cfg.get("layer_types") or [SLIDING if (i + 1) % every else FULL for i in range(n)]
    dense = int(cfg["num_dense_blocks"])
    mlp = cfg.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(n)]
    for name, v in (("layer_types", types), ("mlp_layer_types", mlp)):
        if len(v) != n:
            raise ValueError(f"ergo {name} names {len(v)} layers, the model has {n}")
    sliding = tuple(t == SLIDING for t in types)
    scale = cfg.get("global_attention_scale")
    return {
        "sliding_window": int(cfg["sliding_window"]) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "rope_layers": sliding,  # the full-attention layers: no rotary
        "rope_interleaved": True,
        "hidden_act": "relu2",
        "gated_mlp": False,
        "global_attention_scale": None if scale is None else float(scale),
        "routing": ExpertRouting(scoring="sigmoid", correction_bias=True,
                                 routed_scaling_factor=float(cfg["moe_routed_scaling_factor"])),
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": True,
        "moe_layers": tuple(t == "sparse" for t in mlp),
        "shared_expert_intermediate_size": int(cfg["shared_intermediate_size"]),
    }  # fmt: skip


# the checkpoint's names -> those `model/ergo.py` reads (transformers' conversion mapping)
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^tok_embeddings\.", "model.embed_tokens."), (r"^output\.", "lm_head."),
    (r"\.attention_norm\.", ".input_layernorm."),
    (r"\.post_attention_norm\.", ".post_attention_layernorm."),
    (r"\.ffn_norm\.", ".pre_feedforward_layernorm."),
    (r"\.post_ffn_norm\.", ".post_feedforward_layernorm."),
    (r"\.post_attention_residual\.scale$", ".attention_residual_gate.weight"),
    (r"\.post_ffn_residual\.scale$", ".feedforward_residual_gate.weight"),
    (r"\.attention\.wqkv\.", ".self_attn.qkv_proj."), (r"\.attention\.wo\.", ".self_attn.o_proj."),
    (r"\.attention\.([qk])_norm\.", r".self_attn.\1_norm."),
    (r"\.feed_forward\.up\.", ".mlp.up_proj."), (r"\.feed_forward\.down\.", ".mlp.down_proj."),
    (r"\.feed_forward\.gate_kernel$", ".mlp.gate.weight"),
    (r"\.feed_forward\.router_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.feed_forward\.(up|down)_proj$", r".mlp.experts.\1_proj"),
    (r"\.feed_forward\.expert_output_norm\.scale$", ".mlp.experts.norm"),
    (r"\.feed_forward\.shared_(up|down)_proj$", r".mlp.shared_experts.\1_proj.weight"),
    (r"\.feed_forward\.shared_expert_output_norm\.scale$", ".mlp.shared_experts.norm.weight"),
))  # fmt: skip
# stored [in, out]: read transposed
_TRANSPOSED = re.compile(r"\.mlp\.(gate\.weight|shared_experts\.(up|down)_proj\.weight)$")


def read_checkpoint_names(weights, c) -> None:
    """List the checkpoint's tensors under the names `model/ergo.py` reads: renamed, the
    router's and shared expert's matrices transposed, the fused q/k/v split by rows."""
    moves = {}
    for name in list(weights):  # from the files' names (the generic renames read LFM2's
        new = re.sub(r"^(layers|norm)\.", r"model.\1.", weights.stored_name(name))  # ffn_norm)
        for pattern, repl in _RENAMES:
            new = pattern.sub(repl, new)
        if new != name:
            moves[name] = new
    weights.rename_all(moves)
    weights.transpose([n for n in weights if _TRANSPOSED.search(n)])
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i in range(c.num_layers):
        a = f"model.layers.{i}.self_attn."
        if a + "qkv_proj.weight" in weights:
            weights.split_rows(a + "qkv_proj.weight", [(a + "q_proj.weight", 0, q),
                                                       (a + "k_proj.weight", q, q + kv),
                                                       (a + "v_proj.weight", q + kv, q + 2 * kv)])  # fmt: skip


def expected_shapes(c) -> dict[str, tuple[int, ...]]:
    """What every layer holds beyond Llama's attention, two norms and (dense layers) ungated
    MLP: two more norms, the residual gates, the q/k norms; the experts stacked with their
    norms, the shared expert and its norm."""
    h, d, f, out = c.hidden_size, c.head_dim, c.family, {}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm",
                     "attention_residual_gate", "feedforward_residual_gate"):  # fmt: skip
            out[f"{p}{name}.weight"] = (h,)
        out[p + "self_attn.q_norm.weight"] = out[p + "self_attn.k_norm.weight"] = (d,)
        if f.has_experts(i):
            e, n, s, x = (
                f.num_experts,
                f.moe_intermediate_size,
                f.shared_expert_intermediate_size,
                p + "mlp.",
            )
            out.update({x + "experts.up_proj": (e, h, n), x + "experts.down_proj": (e, n, h),
                        x + "experts.norm": (e, h), x + "shared_experts.up_proj.weight": (s, h),
                        x + "shared_experts.down_proj.weight": (h, s),
                        x + "shared_experts.norm.weight": (h,)})  # fmt: skip
    return out


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its norms, gates, q/k norms and experts (`expected_shapes`) in
    `checkpoint_shapes.expected_shapes`' tensors."""
    out.update(expected_shapes(c))


def tp_problem(c, size: int) -> str | None:
    """Why `size` ranks cannot split Ergo's experts (one line), or None: each expert's output is
    normalised over the whole hidden width, so the routed experts split by expert
    (`model/ergo.py`): `size` must divide num_experts."""
    if not c.family.num_experts or c.family.num_experts % size == 0:
        return None
    return (f"--tensor-parallel-size {size} does not divide Ergo's experts (num_experts "
            f"{c.family.num_experts}: each expert, its output normalised whole, stays on one "
            "rank)")  # fmt: skip
