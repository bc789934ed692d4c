"""Nemotron-H's config as transformers reads it (`NemotronHForCausalLM`), for
`model/nemotron_h.py`; reached through `mamba_config`. Kept apart from the model so that
reading a config imports no layer code.

Each layer one block, norm -> mixer -> residual add, the mixer a Mamba2 one, attention (no
rotary) or an ungated ReLU² MLP (`layers_block_type`, or the older `hybrid_override_pattern`
"M" / "*" / "-"); the SSM state in float32 (`mamba_ssm_cache_dtype`); or a MoE block ("moe",
"E": Nemotron 3): ungated ReLU² experts routed by DeepSeek-V3's sigmoid router beside a shared
expert (`recurrent_configs.NemotronHExperts`). The checkpoint's `backbone.` names are read as
Llama's (`nemotron_name`; the MoE block's under `mlp.`, as DeepSeek's), Mamba2ForCausalLM's
too (`mamba2_config.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.mamba2_config import mixer_shapes, time_step_limits
from pagoda.runtime.model_configs import ExpertRouting
from pagoda.runtime.recurrent_configs import MambaConfig, NemotronHExperts

ARCHITECTURES = {"NemotronHForCausalLM": "nemotron_h"}
# transformers' config defaults, where config.json leaves one out
DEFAULTS = {
    "nemotron_h": {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 4096, "intermediate_size": 21504,
                   "mlp_hidden_act": "relu2", "mamba_num_heads": 128, "mamba_head_dim": 64,
                   "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
                   "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
                   "layer_norm_epsilon": 1e-5, "mamba_hidden_act": "silu",
                   "mamba_ssm_cache_dtype": "float32", "n_routed_experts": 8,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 7688,
                   "moe_shared_expert_intermediate_size": 7688, "n_group": 1, "topk_group": 1,
                   "routed_scaling_factor": 1.0, "norm_topk_prob": True},
}  # fmt: skip
# Nemotron-H's older config keys (transformers' NemotronHConfig reads them so)
_ALIASES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
            "mamba_chunk_size": "chunk_size", "mamba_conv_bias": "use_conv_bias",
            "mamba_dt_limit": "time_step_limit"}  # fmt: skip
_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def nemotron_types(cfg: Mapping[str, Any]) -> list[str]:
    """Nemotron-H's per-layer block types: `layers_block_type`, or `hybrid_override_pattern`."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("hybrid_override_pattern")
        if not pattern:
            raise ValueError("a nemotron_h config.json needs layers_block_type or "
                             "hybrid_override_pattern")  # fmt: skip
        unknown = sorted(set(pattern) - set(_PATTERN))
        if unknown:
            raise ValueError(f"hybrid_override_pattern has unknown block types {unknown}")
        types = [_PATTERN[c] for c in pattern]
    types = [{"linear_attention": "mamba", "full_attention": "attention"}.get(t, t) for t in types]
    unknown = sorted({t for t in types if t not in ("mamba", "attention", "mlp", "moe")})
    if unknown:
        raise ValueError(f"layers_block_type {unknown} are not supported in a nemotron_h model")
    return types


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """The Mamba2 blocks (and the MLP and MoE blocks' layers) as recurrent layers."""
    cfg = {**cfg, **{new: cfg[old] for old, new in _ALIASES.items() if old in cfg}}
    if cfg["mamba_hidden_act"] != "silu":
        raise ValueError(f"mamba_hidden_act {cfg['mamba_hidden_act']!r} is not supported (silu)")
    types = nemotron_types(cfg)
    return MambaConfig(
        layers=tuple(t == "mamba" for t in types),
        n_heads=int(cfg["mamba_num_heads"]),
        head_dim=int(cfg["mamba_head_dim"]),
        d_state=int(cfg["ssm_state_size"]),
        n_groups=int(cfg["n_groups"]),
        d_conv=int(cfg["conv_kernel"]),
        chunk_size=int(cfg["chunk_size"]),
        conv_bias=bool(cfg["use_conv_bias"]),
        proj_bias=bool(cfg["use_bias"]),
        **time_step_limits(cfg),
        mlp_layers=tuple(t == "mlp" for t in types),
        ssm_float32=cfg.get("mamba_ssm_cache_dtype") == "float32",
        moe=_experts(cfg),
    )


def _experts(cfg: Mapping[str, Any]) -> NemotronHExperts | None:
    layers = tuple(t == "moe" for t in nemotron_types(cfg))
    if not any(layers):
        return None
    if cfg.get("mlp_hidden_act", "relu2") != "relu2":
        raise ValueError(f"mlp_hidden_act {cfg['mlp_hidden_act']!r} in Nemotron-H's experts is "
                         "not supported (relu2)")  # fmt: skip
    routing = ExpertRouting(scoring="sigmoid", topk_method="noaux_tc",
                            n_group=int(cfg["n_group"]), topk_group=int(cfg["topk_group"]),
                            routed_scaling_factor=float(cfg["routed_scaling_factor"]))  # fmt: skip
    latent = cfg.get("moe_latent_size")
    return NemotronHExperts(
        layers=layers,
        num_experts=int(cfg["n_routed_experts"]),
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate=int(cfg["moe_intermediate_size"]),
        shared_intermediate=int(cfg["moe_shared_expert_intermediate_size"]),
        routing=routing,
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        latent=int(latent) if latent else None,
    )


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The layers from their types; the MLPs' activation; the norms' eps."""
    return {"num_hidden_layers": len(nemotron_types(cfg)), "hidden_act": cfg["mlp_hidden_act"],
            "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """The blocks; ungated ReLU² MLPs; attention without rotary."""
    return {"mamba": mamba(cfg, n), "gated_mlp": False, "rope_layers": (False,) * n}


_LAYER = re.compile(r"backbone\.layers\.(\d+)\.(norm|mixer)\.(.*)")
_TOP = {"backbone.embeddings.weight": "model.embed_tokens.weight",
        "backbone.norm_f.weight": "model.norm.weight"}  # fmt: skip
_ATTENTION_PARTS = ("q_proj.", "k_proj.", "v_proj.", "o_proj.")
_MOE_PARTS = ("experts.", "gate.", "shared_experts.", "fc1_latent_proj.", "fc2_latent_proj.")


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split Nemotron-H's MoE blocks (one line), or None
    (`distributed/tp_families.py`; its Mamba2 mixers are `layout.mamba_problem`'s): the
    experts' and the shared expert's widths must divide by `size`."""
    moe = None if c.family.mamba is None else c.family.mamba.moe
    widths = {} if moe is None else {"moe_intermediate_size": moe.intermediate,
                                     "moe_shared_expert_intermediate_size": moe.shared_intermediate}  # fmt: skip
    for key, width in widths.items():
        if width % size:
            return (f"--tensor-parallel-size {size} does not divide the experts' width "
                    f"({key} {width})")  # fmt: skip
    return None


def nemotron_name(stored: str) -> str:
    """A Nemotron-H checkpoint's tensor under Llama's name: `backbone.` is `model.`, a layer's
    `norm` its `input_layernorm`, its `mixer.` `self_attn.`, `mlp.` or `mamba.` by what it
    holds (`safetensors_weights` reads the checkpoint so)."""
    if stored in _TOP:
        return _TOP[stored]
    m = _LAYER.fullmatch(stored)
    if m is None:
        return "model." + stored.removeprefix("backbone.")
    i, part, rest = m.groups()
    if part == "norm":
        return f"model.layers.{i}.input_layernorm.{rest}"
    if rest.startswith(_ATTENTION_PARTS):
        return f"model.layers.{i}.self_attn.{rest}"
    if rest.startswith(("up_proj.", "down_proj.", *_MOE_PARTS)):  # an MLP, or a MoE block
        return f"model.layers.{i}.mlp.{rest}"
    return f"model.layers.{i}.mamba.{rest}"


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norm: its Mamba2 mixer, MLP (up and down) or MoE block
    (nothing for an attention block, checked as Llama's)."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out = mixer_shapes(m, h, p) if m.layers[i] else {}
    if m.mlp_layers[i]:
        s = c.intermediate_size
        out.update({p + "mlp.up_proj.weight": (s, h), p + "mlp.down_proj.weight": (h, s)})
    if m.moe is not None and m.moe.layers[i]:
        out.update(_moe_shapes(m.moe, h, p + "mlp."))
    return out


def _moe_shapes(e: NemotronHExperts, h: int, p: str) -> dict[str, tuple[int, ...]]:
    """A MoE block's tensors (under Llama's `mlp.`: `nemotron_name`)."""
    width, n, s = e.latent or h, e.intermediate, e.shared_intermediate
    out = {p + "gate.weight": (e.num_experts, h), p + "gate.e_score_correction_bias": (e.num_experts,),
           p + "shared_experts.up_proj.weight": (s, h), p + "shared_experts.down_proj.weight": (h, s)}  # fmt: skip
    for x in range(e.num_experts):
        out[f"{p}experts.{x}.up_proj.weight"] = (n, width)
        out[f"{p}experts.{x}.down_proj.weight"] = (width, n)
    if e.latent:
        out[p + "fc1_latent_proj.weight"] = (e.latent, h)
        out[p + "fc2_latent_proj.weight"] = (h, e.latent)
    return out
