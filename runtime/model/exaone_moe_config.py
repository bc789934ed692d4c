"""EXAONE MoE's config.json (`ExaoneMoeForCausalLM`: LGAI-EXAONE/K-EXAONE-236B-A23B) as
transformers' ExaoneMoeConfig reads it. Its model is GLM-4.5's (`model/glm4_moe.py`): Llama's
pre-norm layer with per-head q/k RMSNorms before rotary, dense MLPs where `mlp_layer_types`
says "dense" (by default the first `first_k_dense_replace` layers), elsewhere DeepSeek-V3's
router (`moe_routing.GroupedRouter`: sigmoid scores, the choice-only correction bias
`mlp.e_score_correction_bias`, `n_group` / `topk_group`, `norm_topk_prob`,
`routed_scaling_factor`) beside ungated shared experts of `moe_intermediate_size x
num_shared_experts`; EXAONE 4's hybrid attention: the `layer_types` sliding layers (by default
all but every `sliding_window_pattern`-th) rotate in their window, the global ones attend
without rotary (NoPE). The MTP layers (`mtp.*`) are not read, as transformers skips
them. Kept apart from the model so that reading a config imports no layer code."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model import glm4_moe_config

ARCHITECTURES = {"ExaoneMoeForCausalLM": "exaone_moe", "ExaoneMoEForCausalLM": "exaone_moe"}
MODEL_CLASSES = {"exaone_moe": ("glm4_moe", "Glm4MoeModel")}
# transformers' ExaoneMoeConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "exaone_moe": {"vocab_size": 102_400, "hidden_size": 4096, "intermediate_size": 16_384,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 1,
                   "eos_token_id": 53, "sliding_window": 4096, "sliding_window_pattern": 4,
                   "first_k_dense_replace": 1, "moe_intermediate_size": 1024,
                   "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1,
                   "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
                   "topk_group": 1},
}  # fmt: skip


def _per_layer(cfg, key: str, n: int, default: list[str], kinds: tuple[str, str]) -> list[str]:
    types = cfg.get(key) or default
    if len(types) != n or not set(types) <= set(kinds):
        raise ValueError(f"{key} {types!r} must name {n} layers, each one of {', '.join(kinds)}")
    return list(types)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of an EXAONE MoE config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    fields = glm4_moe_config.family_fields({
        **cfg, "use_qk_norm": True, "n_routed_experts": cfg["num_experts"],
        "n_shared_experts": cfg["num_shared_experts"]}, n)  # fmt: skip
    dense = int(cfg["first_k_dense_replace"])
    mlp = _per_layer(cfg, "mlp_layer_types", n, ["dense" if i < dense else "sparse"
                                                 for i in range(n)], ("dense", "sparse"))  # fmt: skip
    fields["moe_layers"] = tuple(t == "sparse" for t in mlp)
    window = int(cfg["sliding_window"])  # (transformers refuses a null one)
    pattern = cfg.get("sliding_window_pattern")
    if not cfg.get("layer_types") and (isinstance(pattern, bool) or not isinstance(pattern, int)
                                       or pattern < 1):  # fmt: skip
        raise ValueError(f"EXAONE MoE's sliding_window_pattern {pattern!r} without layer_types "
                         "is not supported (transformers reads a positive integer)")  # fmt: skip
    # (a pattern beside layer_types is not read: EXAONE's own configs name it "LLLG")
    default = [] if cfg.get("layer_types") else [
        "full_attention" if not (i + 1) % pattern else "sliding_attention" for i in range(n)]  # fmt: skip
    kinds = ("sliding_attention", "full_attention")
    sliding = tuple(t == kinds[0] for t in _per_layer(cfg, "layer_types", n, default, kinds))
    # the window layers rotate; the global ones attend without rotary (NoPE)
    return {**fields, "sliding_window": window, "window_layers": sliding,
            "rope_layers": sliding}  # fmt: skip
