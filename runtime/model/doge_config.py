"""Doge's config.json (`DogeForCausalLM`: SmallDoge's Doge) as transformers' DogeConfig reads
it: the `FamilyConfig` fields `model/doge.py` runs (its docstring says what they do). Kept
apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model_configs import DogeAttention

ARCHITECTURES = {"DogeForCausalLM": "doge"}
MODEL_CLASSES = {"doge": ("doge", "DogeModel")}
# transformers' DogeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "doge": {"vocab_size": 32_768, "hidden_size": 1024, "intermediate_size": 2048,
             "num_hidden_layers": 32, "num_attention_heads": 8, "max_position_embeddings": 2048,
             "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
             "keep_window_size": 2048, "is_moe": False, "num_experts": 16_384,
             "num_experts_per_tok": 64, "norm_topk_prob": False},
}  # fmt: skip
NULLABLE = {"doge": ("sliding_window",)}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Doge config.json, as transformers reads them; ValueError, one
    line, for what it does not run."""
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"doge {key} is not supported (the published models have none)")
    if cfg.get("sliding_window") is not None:
        raise ValueError("doge sliding_window is not supported (the published models attend "
                         "over the whole context)")  # fmt: skip
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"doge hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
    keep = int(cfg["keep_window_size"])
    if keep < 1:
        raise ValueError(f"doge keep_window_size must be positive, got {keep}")
    doge = DogeAttention(keep_window=keep)
    if cfg.get("is_moe"):
        experts, k = int(cfg["num_experts"]), int(cfg["num_experts_per_tok"])
        keys = DogeAttention(keep, experts).num_keys
        if not 1 <= k <= keys * keys:
            raise ValueError(f"doge num_experts_per_tok {k} must be within 1..{keys * keys} (the "
                             f"product keys' pairs of num_experts {experts})")  # fmt: skip
        doge = DogeAttention(keep, experts, k, bool(cfg.get("norm_topk_prob")))
    return {"qk_norm": True, "doge": doge}


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its dynamic mask's A and dt_proj, its residual scales and, with experts, their router
    and tables, in `checkpoint_shapes.expected_shapes`' tensors."""
    g, h, kv = c.family.doge, c.hidden_size, c.num_kv_heads
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.A": (kv,), p + "self_attn.dt_proj.weight": (kv, kv * c.head_dim),
                    p + "input_residual": (h,), p + "post_attention_residual": (h,)})  # fmt: skip
        if g.num_experts:
            out.update({p + "mlp.router_gate.weight": (2 * g.num_keys, h),
                        p + "mlp.down_embed.weight": (g.num_experts, h),
                        p + "mlp.up_embed.weight": (g.num_experts, h)})  # fmt: skip


def rank_rows(layer: int, part: str, rows: int, cols: int, c, lay):
    """A rank's (rows, columns) of the dynamic mask's tensors (`model/doge.py`: dt_proj's input
    columns of its KV heads, their A), or None for the others (`distributed/tp_families.py`)."""
    if part not in ("self_attn.dt_proj.weight", "self_attn.A"):
        return None
    k0, k1 = lay.kv_heads(c.num_kv_heads)
    if part == "self_attn.A":
        return k1 - k0, cols
    return rows, cols // c.num_kv_heads * (k1 - k0)
