"""Flint's config.json (`FlintForCausalLM`: RecursiveSI/flint) as transformers' FlintConfig
(Qwen2-MoE's config) reads it: the `FamilyConfig` fields `model/flint.py` runs (its docstring
says what they do). `layer_types` by default: full attention on the first two layers, every
fourth from the second and the last, a `sliding_window` elsewhere; dense MLPs of
`intermediate_size` on `mlp_only_layers` (by default 0 and 1) and off every
`decoder_sparse_step`-th layer. Kept apart from the model so that reading a config imports no
layer code."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"FlintForCausalLM": "flint"}
MODEL_CLASSES = {"flint": ("flint", "FlintModel")}
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' FlintConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "flint": {"vocab_size": 150_144, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 49, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 262_144, "rms_norm_eps": 1e-6,
              "sliding_window": 513, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 1024, "num_experts_per_tok": 6,
              "num_experts": 256, "norm_topk_prob": True, "decoder_sparse_step": 1,
              "mlp_only_layers": [0, 1], "rope_theta": 10_000.0},
}  # fmt: skip


def layer_types(cfg, n: int) -> list[str]:
    types = cfg.get("layer_types") or [
        FULL if i < 2 or i % 4 == 1 or i == n - 1 else SLIDING for i in range(n)
    ]
    if len(types) != n:
        raise ValueError(f"flint layer_types names {len(types)} layers, the model has {n}")
    return list(types)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Flint config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    if cfg.get("attention_bias"):
        raise ValueError("flint attention_bias (biases on q/k/v and o) is not supported")
    sliding = tuple(t == SLIDING for t in layer_types(cfg, n))
    if any(sliding) and cfg.get("sliding_window") is None:
        raise ValueError("flint's layer_types name sliding_attention layers without a "
                         "sliding_window")  # fmt: skip
    step = int(cfg["decoder_sparse_step"] or 1)
    dense = set(cfg["mlp_only_layers"] or ())
    return {
        "qk_norm": True,
        "attention_sinks": True,
        "sliding_window": int(cfg["sliding_window"]) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "rope_layers": sliding,  # (the full-attention layers: no positions)
        "routing": ExpertRouting(scoring="sigmoid", renorm_eps=0.0),
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "moe_layers": tuple(i not in dense and (i + 1) % step == 0 for i in range(n)),
        "shared_expert_intermediate_size": int(cfg["shared_expert_intermediate_size"]),
    }


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its attention sinks (stored as `softmax_offset`, listed as `sinks`) in
    `checkpoint_shapes.expected_shapes`' tensors."""
    for i in range(c.num_layers):
        out[f"model.layers.{i}.self_attn.sinks"] = (c.num_heads,)
