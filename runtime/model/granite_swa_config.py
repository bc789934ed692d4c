"""GraniteSWA's and GraniteMoeSWA's config.json (`GraniteSWAForCausalLM`,
`GraniteMoeSWAForCausalLM`: ibm-granite/granite-swash-2b, -3b-a600m) as transformers'
GraniteSWAConfig / GraniteMoeSWAConfig read them. Their models (`model/granite.py`) are Granite's
and GraniteMoeShared's (the four scalars; Mixtral-style stacked experts with an optional ungated
`shared_mlp`) with this attention:

- `layer_types` (by default layer i full where i % 4 == 0, the rest sliding); a sliding layer
  sees `sliding_window` keys, its own included (null: every layer full);
- a learned sink logit per head in every layer (`self_attn.sinks`: transformers scales each
  output by sigmoid(logsumexp(scores) - sink), the sink joining the softmax's denominator, as
  gpt-oss's);
- a rotary base per layer (`layer_rope_theta`, `FamilyConfig.rope_thetas`; 0: that layer
  attends without positions, NoPE; left out: `rope_parameters.rope_theta` everywhere), each
  base with the config's rope scaling.

Tensor parallel as Granite's and GraniteMoeShared's, each rank its heads' sinks;
`--quantization fp8` is refused in one line (`family_options`). Kept apart from the model so
that reading a config imports no layer code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ARCHITECTURES = {"GraniteSWAForCausalLM": "granite_swa",
                 "GraniteMoeSWAForCausalLM": "granitemoe_swa"}  # fmt: skip
MODEL_CLASSES = {"granite_swa": ("granite", "GraniteSwaModel"),
                 "granitemoe_swa": ("granite", "GraniteMoeSwaModel")}  # fmt: skip
SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' GraniteSWAConfig / GraniteMoeSWAConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "granite_swa": {"vocab_size": 100_352, "hidden_size": 2560, "intermediate_size": 8192,
                    "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 4,
                    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                    "bos_token_id": 100_257, "eos_token_id": 100_257,
                    "tie_word_embeddings": True, "sliding_window": 128},
    "granitemoe_swa": {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008,
                       "num_hidden_layers": 32, "num_attention_heads": 32,
                       "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1,
                       "eos_token_id": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
                       "sliding_window": 128},
}  # fmt: skip
# a null sliding_window means none (every layer full), not the default's 128
NULLABLE = {"granite_swa": ("sliding_window",), "granitemoe_swa": ("sliding_window",)}


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [FULL if i % 4 == 0 else SLIDING for i in range(n)]
    if len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ValueError(f"layer_types {types!r} must name {n} layers, each {SLIDING} or {FULL}")
    return list(types)


def rope_thetas(cfg: Mapping[str, Any], n: int, theta: float) -> tuple[float, ...]:
    """Each layer's rotary base (`layer_rope_theta`; 0: NoPE), `theta` everywhere without it."""
    thetas = cfg.get("layer_rope_theta")
    if thetas is None:
        return (theta,) * n
    if len(thetas) != n or any(not isinstance(t, (int, float)) or t < 0 for t in thetas):
        raise ValueError(f"layer_rope_theta {thetas!r} must give {n} layers a base >= 0 each "
                         "(0: no rotary)")  # fmt: skip
    return tuple(float(t) for t in thetas)


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a GraniteSWA / GraniteMoeSWA config.json (its layers: `n`), as
    transformers reads them; ValueError, one line, for what it does not run."""
    fields: dict[str, Any] = {}
    if arch == "granitemoe_swa":  # GraniteMoeShared's experts (its shared_mlp where sized)
        fields.update(num_experts=int(cfg["num_local_experts"]),
                      num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["intermediate_size"]),
                      round_topk_to_model_dtype=True,
                      shared_expert_intermediate_size=int(cfg.get("shared_intermediate_size")
                                                          or 0))  # fmt: skip
    for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                 "logits_scaling"):  # fmt: skip
        fields[name] = float(cfg.get(name, 1.0))
    types = layer_types(cfg, n)
    window = cfg.get("sliding_window")
    if window is not None and int(window) < 1:
        raise ValueError(f"sliding_window must be positive, got {window}")
    params = cfg.get("rope_parameters") or {}  # (the base `family_fields.read_rope` reads)
    thetas = rope_thetas(cfg, n, float(params.get("rope_theta") or cfg.get("rope_theta") or 1e4))
    return {
        **fields,
        "sliding_window": None if window is None else int(window),
        "window_layers": () if window is None else tuple(t == SLIDING for t in types),
        "attention_sinks": True,
        "rope_thetas": thetas,
        "rope_layers": tuple(t != 0 for t in thetas),
    }


# transformers 5's GraniteMoeSWA names (no conversion mapping: it writes them so) -> the
# published GraniteMoe names `model/granite.py` reads stacked experts and routers by
_EXPERT_NAMES = (
    (".block_sparse_moe.experts.gate_up_proj", ".block_sparse_moe.input_linear.weight"),
    (".block_sparse_moe.experts.down_proj", ".block_sparse_moe.output_linear.weight"),
    (".block_sparse_moe.router.weight", ".block_sparse_moe.router.layer.weight"),
)


def rename_tensors(weights) -> None:
    """GraniteMoeSWA's experts ([E, 2I, hidden] gate then up, [E, hidden, I]) and router as
    transformers writes them, listed under GraniteMoe's names (the same layouts)."""
    for name in list(weights):
        for old, new in _EXPERT_NAMES:
            if name.endswith(old):
                weights.rename(name, name[: -len(old)] + new)
