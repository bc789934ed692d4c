"""Kolibri 1's config.json (`Kolibri1ForCausalLM`: Aleph-Alpha/Kolibri-1) as transformers'
Kolibri1Config reads it. Its model (`model/kolibri1.py`) is GLM-4.5's (`model/glm4_moe.py`:
DeepSeek's experts beside an ungated shared MLP) with

- EXAONE 4's attention: Qwen3's RMSNorm over each head of q and of k before rotary; the
  `layer_types` sliding layers (by default all but every fifth) rotate in their window of
  `sliding_window` keys, the full ones attend without rotary (NoPE);
- GLM-4's layer: RMSNorms on attention's and the MLP's outputs too (published as
  `post_attn_norm` / `post_ffn_norm`, read as GLM-4's names), before their residual adds;
- experts in every layer (`mlp.experts.{e}`, `mlp.gate`), picked by the top-k of the router's
  float32 logits plus a choice-only bias (published as `moe.router.expert_bias`, read as
  `mlp.gate.e_score_correction_bias`), weighted by the picks' sigmoid scores (renormalised with
  `norm_topk_prob`, by default not), beside `mlp.shared_experts` of
  `shared_expert_intermediate_size`.

Tensor parallelism and `--quantization fp8` are refused in one line (`family_options`). Kept
apart from the model so that reading a config imports no layer code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"Kolibri1ForCausalLM": "kolibri1"}
MODEL_CLASSES = {"kolibri1": ("kolibri1", "Kolibri1Model")}
SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' Kolibri1Config defaults, where config.json leaves one out; it has no dense MLP
# (`intermediate_size` here is the experts' width, read by no layer)
DEFAULTS: dict[str, dict[str, Any]] = {
    "kolibri1": {"vocab_size": 128_000, "hidden_size": 2560, "intermediate_size": 512,
                 "num_hidden_layers": 50, "num_attention_heads": 48, "num_key_value_heads": 4,
                 "head_dim": 128, "max_position_embeddings": 262_144, "rms_norm_eps": 1e-6,
                 "sliding_window": 513, "moe_intermediate_size": 512,
                 "shared_expert_intermediate_size": 512, "num_experts_per_tok": 6,
                 "num_local_experts": 384, "norm_topk_prob": False},
}  # fmt: skip
# the published tensor names -> the ones the model reads (transformers' conversion mapping)
_RENAMES = (
    (".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias"),
    (".post_attn_norm.weight", ".post_self_attn_layernorm.weight"),
    (".post_ffn_norm.weight", ".post_mlp_layernorm.weight"),
)


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(n)]
    if len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ValueError(f"layer_types {types!r} must name {n} layers, each {SLIDING} or {FULL}")
    return list(types)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Kolibri 1 config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    types = layer_types(cfg, n)
    window = cfg.get("sliding_window")
    if SLIDING in types and (window is None or int(window) < 1):
        raise ValueError(f"Kolibri 1's sliding-attention layers need a positive sliding_window, "
                         f"got {window}")  # fmt: skip
    sliding = tuple(t == SLIDING for t in types)
    return {
        "qk_norm": True,
        "glm4_norms": True,
        "sliding_window": None if window is None else int(window),
        "window_layers": sliding,
        # the window layers rotate, the full ones attend without rotary (with no window: all)
        "rope_layers": sliding if window is not None else (),
        "routing": ExpertRouting(scoring="sigmoid", correction_bias=True, bias_on_logits=True),
        # (transformers' attribute_map: the published num_experts is its num_local_experts)
        "num_experts": int(cfg.get("num_experts") or cfg["num_local_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": bool(cfg["norm_topk_prob"]),
        "shared_expert_intermediate_size": int(cfg["shared_expert_intermediate_size"]),
    }


def rename_tensors(weights) -> None:
    """The published norms and router bias listed under the names the model reads."""
    for name in list(weights):
        for old, new in _RENAMES:
            if name.endswith(old):
                weights.rename(name, name[: -len(old)] + new)
