"""Gemma 3n's text config as transformers 5 reads it (`Gemma3nTextConfig`: `Gemma3nForCausalLM`,
and the text model of `Gemma3nForConditionalGeneration`, under `text_config`), for
`model/gemma3n.py`. Its layers are described by Gemma 4's table (`model_configs.Gemma4Layers`:
KV sharing, per-layer inputs, MLP widths by layer) with `Gemma3nParts` for what Gemma 3n adds.

- `layer_types` (by default every fifth layer full attention); sliding layers see
  `sliding_window` keys; one head size and KV head count for every layer;
- `intermediate_size`: one width, or one per layer;
- `num_kv_shared_layers`: the last ones read the KV of the last earlier layer of their kind
  (`Gemma3nTextConfig.kv_sharing_modes`, as Gemma 4's: `gemma4_config.kv_sources`);
- rotary: the default on both kinds, the sliding layers' base `rope_parameters`'
  `sliding_attention` (else `rope_local_base_freq`, 10k), the full layers' `full_attention`
  (else `rope_theta`, 1M);
- per-layer inputs (`hidden_size_per_layer_input`) from a table of
  `vocab_size_per_layer_input` rows: ids past it read row 0, as transformers'
  `get_per_layer_inputs` (the published table is 256 rows short of the vocabulary: the
  multimodal wrapper's image and audio tokens);
- the multimodal wrapper's embedders of its image and audio token ids (`vision_config` /
  `audio_config`'s `vocab_offset`, `vocab_size`, `hidden_size`: `wrapper_embedders`), their
  tensors listed by `list_embedders` (the towers themselves are not read);
- AltUp (`altup_num_inputs` streams, `altup_active_idx`, `altup_correct_scale`), Laurel
  (`laurel_rank`), `activation_sparsity_pattern` (by default 0.95 on the first 10 layers of a
  model of more than 10).

Refused in one line: a rotary other than the default, a `layer_types` kind other than sliding
and full attention, a KV-shared layer with no earlier layer of its kind, an
`intermediate_size` list of the wrong length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.model.gemma4_config import FULL, SLIDING, fields_of, kv_sources
from pagoda.runtime.model_configs import Gemma3nParts, Gemma4Layers

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"Gemma3nForCausalLM": "gemma3n", "Gemma3nForConditionalGeneration": "gemma3n"}
TEXT_MODEL_TYPES = {"Gemma3nForConditionalGeneration": {"gemma3n_text": "gemma3n"}}
# transformers' Gemma3nTextConfig defaults, where config.json leaves one out
DEFAULTS = {
    "gemma3n": {"vocab_size": 262_400, "hidden_size": 2048, "intermediate_size": 16_384,
                "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
                "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True, "sliding_window": 512, "bos_token_id": 2,
                "eos_token_id": 1, "pad_token_id": 0, "final_logit_softcapping": 30.0,
                "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256,
                "altup_active_idx": 0, "altup_correct_scale": True, "altup_num_inputs": 4,
                "num_kv_shared_layers": 15, "laurel_rank": 64, "attention_bias": False},
}  # fmt: skip
THETAS = {FULL: ("rope_theta", 1_000_000.0), SLIDING: ("rope_local_base_freq", 10_000.0)}
# the wrapper's embedders of image and audio token ids: (name, config key, Gemma3nVisionConfig's
# / Gemma3nAudioConfig's defaults: vocab_offset, vocab_size, hidden_size)
EMBEDDERS = (("vision", "vision_config", 262_144, 128, 2048),
             ("audio", "audio_config", 262_272, 128, 1536))  # fmt: skip


def wrapper_embedders(top: Mapping[str, Any]) -> list[tuple[str, int, int, int, float]]:
    """(name, first id, ids, width, eps) of each of `Gemma3nModel`'s embedders: transformers
    embeds the ids of its image and audio ranges through them, whether or not images or audio
    come with the prompt (`Gemma3nModel.forward`); none for a causal LM's config.json. The
    ranges must follow one another up to the vocabulary's end, as transformers' masks read them
    (the image range up to the audio one, the audio range to the last id)."""
    if "text_config" not in top:
        return []
    out = []
    for name, key, offset, rows, width in EMBEDDERS:
        c = top.get(key) or {}
        out.append((name, int(c.get("vocab_offset", offset)), int(c.get("vocab_size", rows)),
                    int(c.get("hidden_size", width)), float(c.get("rms_norm_eps", 1e-6))))  # fmt: skip
    vocab = int({**DEFAULTS["gemma3n"], **top["text_config"]}["vocab_size"])
    (_, v_first, v_rows, _, _), (_, a_first, a_rows, _, _) = out
    if v_first + v_rows != a_first or a_first + a_rows != vocab:
        raise ValueError(f"gemma3n image ids {v_first}+{v_rows} and audio ids {a_first}+{a_rows} "
                         f"that do not end at each other and at the vocabulary's {vocab} are "
                         "not supported")  # fmt: skip
    return out


def list_embedders(weights, config: ModelConfig) -> None:
    """List the wrapper's embedder tensors (`safetensors_weights` leaves the multimodal parts
    out) that the model reads."""
    g = config.family.gemma4
    shapes = g.gemma3n.model_shapes(config.hidden_size) if g and g.gemma3n else {}
    weights.list_skipped({n for n in shapes if n.startswith(("model.embed_vision.",
                                                             "model.embed_audio."))})  # fmt: skip


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What `Gemma3nTextConfig.__post_init__` derives: one `intermediate_size` (the first layer's;
    the widths by layer in `intermediate_sizes`) and `rope_parameters` by layer kind from the
    older keys (`convert_rope_params_to_dict`)."""
    n, width = int(cfg["num_hidden_layers"]), cfg["intermediate_size"]
    widths = list(width) if isinstance(width, (list, tuple)) else [width] * n
    if len(widths) != n:
        raise ValueError(f"gemma3n intermediate_size names {len(widths)} layers, the model "
                         f"has {n}")  # fmt: skip
    params = {k: dict(v) for k, v in (cfg.get("rope_parameters") or {}).items()}
    if cfg.get("rope_scaling"):
        params[FULL] = {**params.get(FULL, {}), **cfg["rope_scaling"]}
    for kind, (key, default) in THETAS.items():
        params.setdefault(kind, {}).setdefault("rope_type", "default")
        params[kind].setdefault("rope_theta", float(cfg.get(key) or default))
        if params[kind].get("rope_type") != "default":
            raise ValueError(f"gemma3n {kind} rope_type {params[kind]['rope_type']!r} is not "
                             "supported (default)")  # fmt: skip
    return {"intermediate_size": int(widths[0]), "intermediate_sizes": [int(w) for w in widths],
            "rope_parameters": params}  # fmt: skip


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(n)]
    types = list(types)
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    unknown = sorted({t for t in types if t not in (SLIDING, FULL)})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported in a gemma3n model")
    return types


def sparsity(cfg: Mapping[str, Any], n: int) -> tuple[float, ...]:
    pattern = cfg.get("activation_sparsity_pattern")
    if pattern is None:
        sparse = 10 if n > 10 else 0
        pattern = [0.95] * sparse + [0.0] * (n - sparse)
    if isinstance(pattern, (int, float)):
        pattern = [pattern] * n
    if len(pattern) != n:
        raise ValueError(f"gemma3n activation_sparsity_pattern names {len(pattern)} layers, the "
                         f"model has {n}")  # fmt: skip
    return tuple(float(s) for s in pattern)


def layers(cfg: Mapping[str, Any], n: int) -> Gemma4Layers:
    types = layer_types(cfg, n)
    d, kv = int(cfg["head_dim"]), int(cfg["num_key_value_heads"])
    parts = Gemma3nParts(
        altup_inputs=int(cfg["altup_num_inputs"]),
        altup_active=int(cfg["altup_active_idx"]),
        altup_correct_scale=bool(cfg["altup_correct_scale"]),
        laurel_rank=int(cfg["laurel_rank"]),
        sparsity=sparsity(cfg, n),
        embedders=tuple(tuple(e) for e in cfg.get("multimodal_embedders") or ()),
    )
    return Gemma4Layers(
        head_dims=(d,) * n,
        kv_heads=(kv,) * n,
        kv_source=kv_sources(types, int(cfg.get("num_kv_shared_layers") or 0)),
        k_eq_v=(False,) * n,
        mlp_widths=tuple(cfg["intermediate_sizes"]),
        global_rope_theta=float(cfg["rope_parameters"][FULL]["rope_theta"]),
        per_layer_input=int(cfg["hidden_size_per_layer_input"]),
        per_layer_vocab=int(cfg["vocab_size_per_layer_input"]),
        gemma3n=parts,
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    return fields_of(cfg, layers(cfg, n), layer_types(cfg, n))
