"""Llama 4's text config (`Llama4ForCausalLM`, and `Llama4ForConditionalGeneration`'s
`text_config`: Scout, Maverick) as transformers' Llama4TextConfig reads it: the `ModelConfig`
overrides and `FamilyConfig` fields `model/llama4.py` runs. Kept apart from the model so that
reading a config imports no layer code.

- rotary (interleaved, complex pairs) on the layers `no_rope_layers` marks 1 (by default all
  but every `no_rope_layer_interval`-th), NoPE on the others;
- experts (`num_local_experts` of `intermediate_size`, top-`num_experts_per_tok`: 1 in
  the released checkpoints) where `moe_layers` says (by
  default every `interleave_moe_layer_step`-th layer), beside a shared expert of the same width;
  dense MLPs of `intermediate_size_mlp` elsewhere (`ModelConfig.intermediate_size`);
- the rotary layers attend in chunks of `attention_chunk_size` (a token at position p sees
  the keys p - p % C .. p; `layer_types` names them where given): `FamilyConfig`'s
  `attention_chunk_size` and `chunk_layers`, masked by every attention backend; the context is
  `max_position_embeddings` (10M for Scout, as transformers reads it: lower `--max-model-len`
  to what the memory holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model_configs import Llama4Attention

ARCHITECTURES = {"Llama4ForCausalLM": "llama4", "Llama4ForConditionalGeneration": "llama4"}
# transformers' Llama4TextConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama4": {"vocab_size": 202_048, "hidden_size": 5120, "intermediate_size": 8192,
               "intermediate_size_mlp": 16_384, "num_hidden_layers": 48,
               "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
               "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
               "rope_theta": 500_000.0, "num_experts_per_tok": 1, "num_local_experts": 16,
               "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4,
               "attention_chunk_size": 8192, "attn_temperature_tuning": True,
               "floor_scale": 8192, "attn_scale": 0.1, "use_qk_norm": True,
               "bos_token_id": 1, "eos_token_id": 2},
}  # fmt: skip
NULLABLE = ("attention_chunk_size",)


def _layers(cfg: Mapping[str, Any], n: int) -> tuple[list[bool], list[bool]]:
    """(rotary, experts) per layer, as Llama4TextConfig derives them."""
    rope = cfg.get("no_rope_layers") or [
        int((i + 1) % int(cfg["no_rope_layer_interval"]) != 0) for i in range(n)
    ]
    moe = cfg.get("moe_layers")
    if moe is None:
        step = int(cfg["interleave_moe_layer_step"])
        moe = list(range(step - 1, n, step))
    if len(rope) != n:
        raise ValueError(f"no_rope_layers names {len(rope)} layers, the model has {n}")
    return [bool(x) for x in rope], [i in set(moe) for i in range(n)]


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json fields read otherwise for `ModelConfig` (module docstring): the dense
    MLP's width."""
    return {"intermediate_size": cfg["intermediate_size_mlp"],
            "llama4_expert_width": cfg["intermediate_size"]}  # fmt: skip


def _chunked(cfg: Mapping[str, Any], n: int, rope: list[bool]) -> dict[str, Any]:
    """`attention_chunk_size` and `chunk_layers` as Llama4TextConfig's `layer_types` says
    (by default: the rotary layers, where there is a chunk size); ValueError for chunked layers
    without a chunk size."""
    chunk = cfg.get("attention_chunk_size")
    types = cfg.get("layer_types") or [
        "chunked_attention" if r and chunk is not None else "full_attention" for r in rope
    ]
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    chunked = tuple(t == "chunked_attention" for t in types)
    if not any(chunked):
        return {}
    if not chunk or int(chunk) < 1:
        raise ValueError("layer_types names chunked_attention layers without a positive "
                         "attention_chunk_size")  # fmt: skip
    return {"attention_chunk_size": int(chunk), "chunk_layers": chunked}


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """`FamilyConfig` fields of a Llama 4 text config (its layers: `n`); ValueError, one line,
    for what it does not run."""
    rope, moe = _layers(cfg, n)
    k = int(cfg["num_experts_per_tok"])
    if not 1 <= k <= int(cfg["num_local_experts"]):
        raise ValueError(f"num_experts_per_tok {k} is not between 1 and num_local_experts")
    width = int(cfg["llama4_expert_width"])
    return {
        "rope_layers": tuple(rope),
        "rope_interleaved": True,
        "num_experts": int(cfg["num_local_experts"]),
        "num_experts_per_tok": k,
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width,
        "moe_layers": tuple(moe),
        "norm_topk_prob": False,
        **_chunked(cfg, n, rope),
        "llama4": Llama4Attention(
            qk_norm=bool(cfg["use_qk_norm"]),
            temperature_tuning=bool(cfg["attn_temperature_tuning"]),
            floor_scale=float(cfg["floor_scale"]),
            attn_scale=float(cfg["attn_scale"]),
        ),
    }
