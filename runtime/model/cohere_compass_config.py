"""Cohere Compass's text model's config.json (`CohereCompassForCausalLM`: the language model of
CohereLabs' North vision models, read text-only) as transformers' CohereCompassTextConfig reads
it. Its model is Cohere 2's (`model/cohere.py`: one LayerNorm, attention and the MLP side by
side, `logit_scale`, tied embeddings) with

- the rotary of each layer kind from `rope_parameters` keyed by `layer_types` kind (by default
  every layer full attention), a kind's entry null: its layers attend without rotary (NoPE);
  the sliding layers' base `FamilyConfig.local_rope_theta` where it differs;
- the rotary in the rotate-half layout (Qwen3's `apply_rotary_pos_emb`), not Cohere's
  interleaved pairs: `FamilyConfig.rope_interleaved` false. Its M-RoPE (`mrope_section`) rotates
  a text token's three axes by the same position: the plain rotary;
- `logit_scale` null: 1 (no scale); sliding layers see `sliding_window` keys.

Refused in one line: a layer kind `rope_parameters` does not name (transformers' lookup fails),
a rotary other than the default. Kept apart from the model so that reading a config imports
no layer code.
"""

from __future__ import annotations

from typing import Any

# CohereCompassForConditionalGeneration (CohereLabs' North vision models): its text model, read
# text-only (the vision tower `model.visual.` is not read); its head untied unless the top-level
# flag says (CohereCompassConfig's default, whatever its text_config's)
ARCHITECTURES = {"CohereCompassForCausalLM": "cohere_compass",
                 "CohereCompassForConditionalGeneration": "cohere_compass"}  # fmt: skip
TEXT_MODEL_TYPES = {
    "CohereCompassForConditionalGeneration": {"cohere_compass_text": "cohere_compass"}
}
WRAPPER_TIES = {"cohere_compass": False}
MODEL_CLASSES = {"cohere_compass": ("cohere", "CohereModel")}
SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' CohereCompassTextConfig defaults (Cohere2Config's; logit_scale none), where
# config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "cohere_compass": {"vocab_size": 256_000, "hidden_size": 8192, "intermediate_size": 22_528,
                       "logit_scale": 1.0, "num_hidden_layers": 40, "num_attention_heads": 64,
                       "max_position_embeddings": 8192, "layer_norm_eps": 1e-5,
                       "bos_token_id": 5, "eos_token_id": 255_001, "pad_token_id": 0,
                       "tie_word_embeddings": True, "sliding_window": 4096},
}  # fmt: skip
EPS = {"cohere_compass": "layer_norm_eps"}


def _rotary(cfg, types: list[str]) -> dict[str, dict | None]:
    """Each layer kind's rotary parameters (None: NoPE), as the model looks them up."""
    params = cfg.get("rope_parameters") or {}
    out = {}
    for kind in dict.fromkeys(types):
        if kind not in params:
            raise ValueError(f"cohere_compass rope_parameters names no {kind!r} entry (its "
                             "layers' rotary, or null for none)")  # fmt: skip
        p = params[kind]
        if p is not None and (p.get("rope_type", "default") != "default"
                              or float(p.get("partial_rotary_factor") or 1.0) != 1.0):  # fmt: skip
            raise ValueError(f"cohere_compass {kind} rotary {p} is not supported (the default "
                             "one over the whole head)")  # fmt: skip
        out[kind] = p
    return out


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Cohere Compass text config.json (its layers: `n`), as
    transformers reads them; ValueError, one line, for what it does not run."""
    types = list(cfg.get("layer_types") or [FULL] * n)
    if len(types) != n:
        raise ValueError(f"cohere_compass layer_types names {len(types)} layers, the model "
                         f"has {n}")  # fmt: skip
    unknown = sorted(set(types) - {SLIDING, FULL})
    if unknown:
        raise ValueError(f"cohere_compass layer_types {unknown} are not supported")
    rotary = _rotary(cfg, types)
    sliding = tuple(t == SLIDING for t in types)
    fields: dict[str, Any] = {
        "cohere_layer": True,
        "rope_interleaved": False,
        "logit_scale": float(cfg["logit_scale"]),
        "rope_layers": tuple(rotary[t] is not None for t in types),
        "sliding_window": int(cfg["sliding_window"]) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
    }
    local = rotary.get(SLIDING)
    if local is not None:
        fields["local_rope_theta"] = float(local.get("rope_theta") or 10_000.0)
    return fields
