"""MiniMax-Text-01's config.json (`MiniMaxForCausalLM`: MiniMaxAI/MiniMax-Text-01-hf) as
transformers' MiniMaxConfig reads it, for `model/minimax.py`; reached through `mamba_config`
(the lightning-attention layers' state slots):

- layer kinds from ``layer_types`` (by default softmax attention on the even layers, lightning
  attention on the odd ones, as transformers derives them);
- the lightning layers as recurrent layers (`MambaConfig.mixer` "lightning"): heads and head
  size the attention's (``head_dim``, else hidden / heads), a state [heads, head_dim,
  head_dim] per sequence, the chunked scan in chunks of ``block_size``;
- Mixtral's experts (``block_sparse_moe``, ``num_local_experts`` of ``intermediate_size``,
  softmax top-``num_experts_per_tok`` renormalised) in every layer;
- the residual weights ``{full_attn,linear_attn,mlp}_{alpha,beta}_factor``
  (`recurrent_configs.MiniMaxScales`).

Kept apart from the model so that reading a config imports no layer code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.recurrent_configs import MambaConfig, MiniMaxScales

ARCHITECTURES = {"MiniMaxForCausalLM": "minimax"}
# transformers' MiniMaxConfig defaults
DEFAULTS = {
    "minimax": {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 14_336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5, "bos_token_id": 1,
                "eos_token_id": 2, "tie_word_embeddings": False, "num_experts_per_tok": 2,
                "num_local_experts": 8, "rope_theta": 1_000_000.0, "block_size": 256},
}  # fmt: skip
_LINEAR, _FULL = "linear_attention", "full_attention"


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types") or [_FULL if (i + 1) % 2 else _LINEAR for i in range(n)]
    if len(types) != n or set(types) - {_LINEAR, _FULL}:
        raise ValueError(f"minimax layer_types must name {_FULL!r} or {_LINEAR!r} for each of "
                         f"the {n} layers, got {types}")  # fmt: skip
    return list(types)


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """SiLU only (the experts' and the lightning q/k/v activation)."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a minimax "
                         "model (silu)")  # fmt: skip
    return {}


def _pair(cfg: Mapping[str, Any], kind: str) -> tuple[float, float]:
    return float(cfg.get(f"{kind}_alpha_factor", 1)), float(cfg.get(f"{kind}_beta_factor", 1))


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    heads = int(cfg["num_attention_heads"])
    dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return MambaConfig(
        layers=tuple(t == _LINEAR for t in layer_types(cfg, n)),
        n_heads=heads,
        head_dim=dim,
        d_state=dim,
        n_groups=heads,
        chunk_size=int(cfg["block_size"]),
        conv_bias=False,
        ssm_float32=True,
        mixer="lightning",
        minimax=MiniMaxScales(
            full_attn=_pair(cfg, "full_attn"),
            linear_attn=_pair(cfg, "linear_attn"),
            mlp=_pair(cfg, "mlp"),
        ),
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """The lightning layers, Mixtral's experts in every layer."""
    return {
        "mamba": mamba(cfg, n),
        "num_experts": int(cfg["num_local_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["intermediate_size"]),
    }


def expected_shapes(c, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s lightning attention (nothing for a softmax attention layer, checked as
    Llama's) and its router (the experts: `checkpoint_shapes.mlp_triples`)."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out = {p + "block_sparse_moe.gate.weight": (c.family.num_experts, h)}
    if m.layers[i]:
        d, a = m.d_inner, p + "self_attn."
        out.update({a + "qkv_proj.weight": (3 * d, h), a + "output_gate.weight": (d, h),
                    a + "o_proj.weight": (h, d), a + "norm.weight": (d,)})  # (out_proj: listed so)  # fmt: skip
    return out
