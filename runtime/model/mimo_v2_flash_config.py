"""MiMo-V2-Flash's config.json (`MiMoV2FlashForCausalLM`: XiaomiMiMo/MiMo-V2-Flash) as
transformers' MiMoV2FlashConfig reads it. Its model (`model/mimo_v2_flash.py`) is GLM-4.5's
(`model/glm4_moe.py`: DeepSeek-V3's router and experts, no shared expert) with its own
attention (`model_configs.MiMoAttention`):

- `layer_types` (by default the first layer and every sixth full attention, the rest sliding);
  a sliding layer sees `sliding_window` keys, its own included (the published config's
  `sliding_window_size` + 1, as transformers reads it), has twice `num_key_value_heads` and
  attention sinks;
- q/k heads `head_dim` wide (192), values `v_head_dim` (128) scaled by `attention_value_scale`;
- a partial rotary (`partial_rotary_factor` of the head, rotate-half over its first dims), its
  base by layer kind (`rope_parameters.full_attention` / `.sliding_attention`);
- dense MLPs where `mlp_layer_types` says (by default the first layer), elsewhere
  `n_routed_experts` experts picked by DeepSeek-V3's grouped sigmoid router with its
  correction bias; the MTP layers (`model.mtp.`) are not read, as transformers skips them.

Tensor parallelism and `--quantization fp8` are refused in one line. Kept apart from the model
so that reading a config imports no layer code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.model_configs import ExpertRouting, MiMoAttention

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"MiMoV2FlashForCausalLM": "mimo_v2_flash"}
MODEL_CLASSES = {"mimo_v2_flash": ("mimo_v2_flash", "MiMoV2FlashModel")}
PARTIAL_ROTARY = ("mimo_v2_flash",)
SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' MiMoV2FlashConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "mimo_v2_flash": {"vocab_size": 152_576, "hidden_size": 4096, "intermediate_size": 16_384,
                      "num_hidden_layers": 48, "num_attention_heads": 64,
                      "num_key_value_heads": 4, "max_position_embeddings": 131_072,
                      "rms_norm_eps": 1e-5, "moe_intermediate_size": 2048,
                      "num_experts_per_tok": 8, "n_routed_experts": 256, "n_group": 1,
                      "topk_group": 1, "norm_topk_prob": True, "head_dim": 192,
                      "v_head_dim": 128, "sliding_window": 129, "bos_token_id": 1,
                      "attention_value_scale": 0.707},
}  # fmt: skip
DEFAULT_ROPE = {
    FULL: {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334},
}


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [FULL if i == 0 or not (i + 1) % 6 else SLIDING for i in range(n)]
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    unknown = sorted({t for t in types if t not in (SLIDING, FULL)})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported in a mimo_v2_flash model")
    return list(types)


def rope_params(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each layer kind's rotary (transformers' per-kind `rope_parameters`); ValueError, one
    line, for a scaled one."""
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    out = {}
    for kind in (SLIDING, FULL):
        p = params.get(kind) if isinstance(params.get(kind), dict) else None
        if p is None:
            raise ValueError(f"mimo_v2_flash rope_parameters lacks {kind!r}")
        if p.get("rope_type", "default") != "default":
            raise ValueError(f"mimo_v2_flash {kind} rope_type {p.get('rope_type')!r} is not "
                             "supported (default only)")  # fmt: skip
        out[kind] = {"rope_theta": float(p["rope_theta"]),
                     "partial_rotary_factor": float(p.get("partial_rotary_factor", 0.334))}  # fmt: skip
    if out[SLIDING]["partial_rotary_factor"] != out[FULL]["partial_rotary_factor"]:
        raise ValueError("mimo_v2_flash layer kinds of different partial_rotary_factor are not "
                         "supported")  # fmt: skip
    return out


def rope(cfg, theta, scaling, head_dim) -> tuple[float, dict[str, Any]]:
    """(the full-attention layers' base, the partial rotary) (`moe_families.ROPE`)."""
    full = rope_params(cfg)[FULL]
    return full["rope_theta"], {"rope_type": "default",
                                "partial_rotary_factor": full["partial_rotary_factor"]}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a MiMo-V2-Flash config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    types = layer_types(cfg, n)
    mlp = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    if len(mlp) != n or set(mlp) - {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types {mlp} must name each of the {n} layers dense or sparse")
    if cfg.get("attention_bias"):
        raise ValueError("mimo_v2_flash with attention_bias is not supported")
    experts, groups = int(cfg["n_routed_experts"]), int(cfg["n_group"])
    if experts % groups or experts // groups < 2:
        raise ValueError(f"n_group {groups} must divide the {experts} routed experts into "
                         "groups of two or more (a group is scored by its best two)")  # fmt: skip
    size = cfg.get("sliding_window_size")
    window = int(size) + 1 if size is not None else int(cfg["sliding_window"])
    scale = cfg.get("attention_value_scale")
    routing = ExpertRouting(
        scoring="sigmoid",
        topk_method="noaux_tc",
        n_group=groups,
        topk_group=int(cfg["topk_group"]),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
    )
    return {
        "sliding_window": window,
        "window_layers": tuple(t == SLIDING for t in types),
        "local_rope_theta": rope_params(cfg)[SLIDING]["rope_theta"],
        "mimo": MiMoAttention(
            swa_kv_heads=2 * int(cfg["num_key_value_heads"]),
            v_head_dim=int(cfg["v_head_dim"]),
            v_scale=1.0 if scale is None else float(scale),
        ),
        "routing": routing,
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "moe_layers": tuple(t == "sparse" for t in mlp),
    }


def attention_shapes(c, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s attention tensors with their shapes (`checkpoint_shapes.expected_shapes`)."""
    m, h, d = c.family.mimo, c.hidden_size, c.head_dim
    kv = m.swa_kv_heads if c.family.window(i) else c.num_kv_heads
    a = f"model.layers.{i}.self_attn."
    out = {a + "q_proj.weight": (c.num_heads * d, h), a + "k_proj.weight": (kv * d, h),
           a + "v_proj.weight": (kv * m.v_head_dim, h),
           a + "o_proj.weight": (h, c.num_heads * m.v_head_dim)}  # fmt: skip
    if c.family.window(i):
        out[a + "attention_sink_bias"] = (c.num_heads,)
    return out


def attention_bytes(c, item: int, tp: int = 1) -> int:
    """All layers' attention weights on one of `tp` ranks, in bytes of `item` (the sinks in
    float32): what `server/weights.from_shapes` counts for them. A rank holds its query heads
    (and their sinks) and each layer's own KV heads, split or replicated
    (`model/mimo_v2_flash.py`)."""
    m, heads, h, d = c.family.mimo, c.num_heads // tp, c.hidden_size, c.head_dim
    total = 0
    for i in range(c.num_layers):
        kv = m.swa_kv_heads if c.family.window(i) else c.num_kv_heads
        kv = kv // tp if kv >= tp else 1  # (fewer than ranks: the one a rank's heads read)
        total += item * h * (heads * d + kv * (d + m.v_head_dim) + heads * m.v_head_dim)
        total += 4 * heads if c.family.window(i) else 0
    return total


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split MiMo-V2-Flash's sliding layers (one line), or None
    (`distributed/tp_families.py`): their KV heads must divide by `size` or it by them."""
    if c.family.mimo is None:
        return None
    kv = c.family.mimo.swa_kv_heads
    if kv % size and size % kv:
        return (f"--tensor-parallel-size {size}: the sliding layers' {kv} KV heads can neither "
                f"be split over {size} ranks nor replicated evenly")  # fmt: skip
    return None


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of MiMo-V2-Flash's k and v (the layer's own KV heads, split or
    replicated; values `v_head_dim` wide: `model/mimo_v2_flash.py`), or None for the other
    tensors (`distributed/tp_families.py`)."""
    if c.family.mimo is None or part not in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        return None
    k0, k1 = lay.kv_heads(c.kv_layer_shapes[layer][0])
    width = c.head_dim if part.startswith("self_attn.k") else c.family.mimo.v_head_dim
    return (k1 - k0) * width, cols
