"""DBRX's config.json (`DbrxForCausalLM`: databricks/dbrx-base, dbrx-instruct) as transformers'
DbrxConfig reads it: MPT's names at the top (`d_model`, `n_heads`, `n_layers`, `max_seq_len`:
`config_keys.ALIASES`), the attention's and the experts' settings nested in `attn_config`
(`kv_n_heads`, `clip_qkv`, `rope_theta`) and `ffn_config` (`ffn_hidden_size`,
`moe_num_experts`, `moe_top_k`, `moe_normalize_expert_weights`, `ffn_act_fn`); the KV heads and
the experts' width are lifted to the top by `config_keys.derived`. `dbrx.DbrxModel` runs it.
Kept apart from the model so that reading a config imports no layer code.

The rotary base: DBRX's own code and vLLM read `attn_config.rope_theta` (500,000 in the
released configs); transformers 5.25's DbrxConfig ignores it and rotates with its default
10,000 unless `rope_parameters` says. The engine reads `attn_config.rope_theta` where config.json
has no top-level `rope_parameters` / `rope_theta` (the released configs), as the model was
trained; the tests set both to one value, so transformers is matched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ARCHITECTURES = {"DbrxForCausalLM": "dbrx"}
MODEL_CLASSES = {"dbrx": ("dbrx", "DbrxModel")}
# transformers' DbrxConfig defaults (under the names `config_keys` reads them as); nn.LayerNorm's
# eps, which DBRX never sets
DEFAULTS: dict[str, dict[str, Any]] = {
    "dbrx": {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 24,
             "max_position_embeddings": 2048, "vocab_size": 32_000, "rms_norm_eps": 1e-5},
}  # fmt: skip
_FFN = {"ffn_hidden_size": 3584, "moe_num_experts": 4, "moe_top_k": 1,
        "moe_normalize_expert_weights": 1.0}  # fmt: skip


def ffn(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`ffn_config` with DbrxFFNConfig's defaults where it leaves one out."""
    return {**_FFN, **{k: v for k, v in (cfg.get("ffn_config") or {}).items()}}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a DBRX config.json, as transformers reads them; ValueError, one
    line, for what it does not run."""
    a, f = cfg.get("attn_config") or {}, ffn(cfg)
    clip = a.get("clip_qkv")
    if clip is not None and not float(clip) > 0:
        raise ValueError(f"attn_config.clip_qkv must be positive, got {clip}")
    act = (f.get("ffn_act_fn") or {"name": "silu"}).get("name", "silu")
    if act != "silu":
        raise ValueError(f"DBRX with ffn_config.ffn_act_fn {act!r} is not supported (silu)")
    p = f["moe_normalize_expert_weights"]
    if p is not None and float(p) != 1.0:  # the top-k weights over their p-norm
        raise ValueError(f"DBRX with ffn_config.moe_normalize_expert_weights {p} is not "
                         "supported (1: renormalised to sum to 1, or null)")  # fmt: skip
    return {
        "falcon_qkv": "stacked",  # Wqkv: every q head, then every k head, then every v head
        "clip_qkv": None if clip is None else float(clip),
        "num_experts": int(f["moe_num_experts"]),
        "num_experts_per_tok": int(f["moe_top_k"]),
        "moe_intermediate_size": int(f["ffn_hidden_size"]),
        "norm_topk_prob": p is not None,
        "round_topk_to_model_dtype": True,  # (softmax in the logits' dtype, weights in it)
    }


def rope(cfg: Mapping[str, Any], theta: float, scaling: Mapping[str, Any] | None, head_dim: int):
    """`attn_config.rope_theta` where config.json names no other base (module docstring)."""
    top = cfg.get("rope_parameters") or {}
    nested = (cfg.get("attn_config") or {}).get("rope_theta")
    if nested is None or "rope_theta" in top or "rope_theta" in cfg:
        return theta, scaling
    return float(nested), scaling
