"""Gemma 4's text config as transformers 5 reads it (`Gemma4TextConfig`: `Gemma4ForCausalLM`,
and the text model of `Gemma4ForConditionalGeneration`, under `text_config`), for
`model/gemma4.py`; Gemma 4 Unified's (`Gemma4UnifiedTextConfig`, architecture
"gemma4_unified": `Gemma4UnifiedForCausalLM`, `Gemma4UnifiedForConditionalGeneration` read
text-only) is Gemma 4's without per-layer inputs or the MoE block, with a 1024-key window. Kept apart from the model so that reading a config imports no layer code.

- `layer_types` (by default every sixth layer full attention), the last layer always full
  attention (transformers forces it); sliding layers see `sliding_window` keys;
- each layer's head size and KV heads: `per_layer_config` (what transformers 5.25 writes: layer
  index -> overrides), else `global_head_dim` (default 512) on the full-attention layers and,
  where `attention_k_eq_v`, `num_global_key_value_heads` (the published configs' keys);
- `attention_k_eq_v`: the full-attention layers have no v_proj (values are the keys'
  projection, before the k norm);
- `num_kv_shared_layers`: the last ones read the KV of the last earlier layer of their kind
  (`Gemma4TextConfig.kv_sharing_modes`); with `use_double_wide_mlp` their MLP is twice as wide;
- rotary per layer kind (`rope_parameters`): sliding layers' default, the full-attention
  layers' "proportional" (the first `partial_rotary_factor` of the angles over the whole head
  size, the rest 0) or default;
- per-layer inputs (`hidden_size_per_layer_input`, 0: none) from a table of
  `vocab_size_per_layer_input` rows;
- `enable_moe_block`: a router and `num_experts` GeGLU experts (`top_k_experts`,
  `moe_intermediate_size`) beside the dense MLP in every layer.

Refused in one line: `use_bidirectional_attention` "all" ("vision" makes image tokens attend
both ways: text, all this model reads, stays causal), another rotary, a per-layer table shorter
than the vocabulary (transformers' lookup would fail on the ids past it), per-layer overrides
other than head_dim / num_key_value_heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.model_configs import Gemma4Layers

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"Gemma4ForCausalLM": "gemma4", "Gemma4ForConditionalGeneration": "gemma4",
                 "Gemma4UnifiedForCausalLM": "gemma4_unified",
                 "Gemma4UnifiedForConditionalGeneration": "gemma4_unified"}  # fmt: skip
TEXT_MODEL_TYPES = {"Gemma4ForConditionalGeneration": {"gemma4_text": "gemma4"},
                    "Gemma4UnifiedForConditionalGeneration":
                        {"gemma4_unified_text": "gemma4_unified"}}  # fmt: skip
ARCHS = ("gemma4", "gemma4_unified")  # (the unified one: Gemma 4's without PLE or MoE)
GEMMA4_LAYERS = (*ARCHS, "gemma3n")  # the families whose layers are a `Gemma4Layers`
# transformers' Gemma4TextConfig defaults, where config.json leaves one out
DEFAULTS = {
    "gemma4": {"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
               "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True, "sliding_window": 512, "bos_token_id": 2,
               "eos_token_id": 1, "pad_token_id": 0, "vocab_size_per_layer_input": 262_144,
               "hidden_size_per_layer_input": 256, "attention_k_eq_v": False,
               "num_kv_shared_layers": 0, "enable_moe_block": False,
               "use_double_wide_mlp": False, "attention_bias": False},
}  # fmt: skip
# Gemma4UnifiedTextConfig's: Gemma 4's, a longer window and context; no per-layer inputs nor
# MoE block (the keys do not exist there: `layers` ignores them)
DEFAULTS["gemma4_unified"] = {**DEFAULTS["gemma4"], "sliding_window": 1024,
                              "max_position_embeddings": 262_144}  # fmt: skip
_UNIFIED_NONE = {"hidden_size_per_layer_input": 0, "enable_moe_block": False}
SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
_OVERRIDES = ("head_dim", "num_key_value_heads")


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
    types = list(types)
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    unknown = sorted({t for t in types if t not in (SLIDING, FULL)})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported in a gemma4 model")
    types[-1] = FULL  # as Gemma4TextConfig forces it
    return types


def rope_params(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each layer kind's rotary; ValueError for a kind the model does not compute."""
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    out = {}
    for kind in (SLIDING, FULL):
        p = params.get(kind) or DEFAULT_ROPE[kind]
        rope = p.get("rope_type", "default")
        allowed = ("default",) if kind == SLIDING else ("default", "proportional")
        if rope not in allowed:
            raise ValueError(f"gemma4 {kind} rope_type {rope!r} is not supported "
                             f"({' or '.join(allowed)})")  # fmt: skip
        out[kind] = dict(p)
    return out


def _per_layer(cfg: Mapping[str, Any], types: list[str]) -> dict[int, dict[str, int]]:
    """Layer index -> its head_dim / num_key_value_heads overrides (module docstring)."""
    given = cfg.get("per_layer_config")
    if given is None:
        over: dict[str, int] = {"head_dim": int(cfg.get("global_head_dim") or 512)}
        kv = cfg.get("num_global_key_value_heads")
        if cfg.get("attention_k_eq_v") and kv is not None:
            over["num_key_value_heads"] = int(kv)
        return {i: over for i, t in enumerate(types) if t == FULL}
    out = {}
    for key, values in dict(given).items():
        extra = sorted(set(values) - set(_OVERRIDES))
        if extra:
            raise ValueError(f"gemma4 per_layer_config overrides {extra} of layer {key}: only "
                             f"{' and '.join(_OVERRIDES)} are supported")  # fmt: skip
        out[int(key)] = {k: int(v) for k, v in values.items()}
    return out


def kv_sources(types: list[str], shared: int) -> tuple[int, ...]:
    """The layer whose KV cache each layer reads: itself, or for the last `shared` layers the
    last earlier unshared layer of its kind (`Gemma4TextConfig.kv_sharing_modes`)."""
    n = len(types)
    first = n - shared
    if shared < 0 or first < 1:
        raise ValueError(f"num_kv_shared_layers {shared} must leave a layer of the {n} that "
                         "keeps its own KV cache")  # fmt: skip
    out = list(range(n))
    for i in range(first, n):
        earlier = [j for j in range(first) if types[j] == types[i]]
        if not earlier:
            raise ValueError(f"gemma4 layer {i} ({types[i]}) shares the KV cache of no earlier "
                             "layer of its kind")  # fmt: skip
        out[i] = earlier[-1]
    return tuple(out)


def layers(cfg: Mapping[str, Any], n: int, unified: bool = False) -> Gemma4Layers:
    if unified:  # (Gemma4UnifiedTextModel builds neither, whatever config.json says)
        cfg = {**cfg, **_UNIFIED_NONE}
    bidirectional = cfg.get("use_bidirectional_attention")
    if bidirectional not in (None, "vision"):  # ("vision": image tokens only; text is causal)
        raise ValueError(f"gemma4 use_bidirectional_attention {bidirectional!r} is not "
                         "supported: Pagoda serves causal decoders")  # fmt: skip
    types = layer_types(cfg, n)
    over = _per_layer(cfg, types)
    for kind in (SLIDING, FULL):
        dims = {over.get(i, {}).get("head_dim", cfg["head_dim"]) for i in range(n)
                if types[i] == kind}  # fmt: skip
        if len(dims) > 1:  # (transformers' rotary takes one head size per kind)
            raise ValueError(f"gemma4 {kind} layers of head sizes {sorted(dims)} are not "
                             "supported: one per layer kind")  # fmt: skip
    src = kv_sources(types, int(cfg.get("num_kv_shared_layers") or 0))
    ple, ple_vocab = int(cfg.get("hidden_size_per_layer_input") or 0), 0
    if ple:
        ple_vocab = int(cfg["vocab_size_per_layer_input"])
        if ple_vocab < int(cfg["vocab_size"]):
            raise ValueError(f"gemma4 vocab_size_per_layer_input {ple_vocab} below vocab_size "
                             f"{cfg['vocab_size']} is not supported")  # fmt: skip
    wide = bool(cfg.get("use_double_wide_mlp"))
    width = int(cfg["intermediate_size"])
    full = rope_params(cfg)[FULL]
    moe: dict[str, int] = {}
    if cfg.get("enable_moe_block"):
        moe = {"num_experts": int(cfg["num_experts"]), "top_k": int(cfg["top_k_experts"]),
               "moe_intermediate_size": int(cfg["moe_intermediate_size"])}  # fmt: skip
    head_dims = tuple(int(over.get(i, {}).get("head_dim", cfg["head_dim"])) for i in range(n))
    kv = int(cfg["num_key_value_heads"])
    kv_heads = tuple(int(over.get(i, {}).get("num_key_value_heads", kv)) for i in range(n))
    return Gemma4Layers(
        head_dims=head_dims,
        kv_heads=kv_heads,
        kv_source=src,
        k_eq_v=tuple(bool(cfg.get("attention_k_eq_v")) and t == FULL for t in types),
        mlp_widths=tuple(width * (2 if wide and src[i] != i else 1) for i in range(n)),
        global_rope_theta=float(full["rope_theta"]),
        global_rotary=float(full.get("partial_rotary_factor") or 1.0)
        if full.get("rope_type") == "proportional"
        else 1.0,
        global_rope_factor=float(full.get("factor") or 1.0)
        if full.get("rope_type") == "proportional"
        else 1.0,
        per_layer_input=ple,
        per_layer_vocab=ple_vocab,
        **moe,
    )


def family_fields(cfg: Mapping[str, Any], n: int, arch: str = "gemma4") -> dict[str, Any]:
    return fields_of(cfg, layers(cfg, n, unified=arch == "gemma4_unified"), layer_types(cfg, n))


def fields_of(cfg: Mapping[str, Any], table: Gemma4Layers, types: list[str]) -> dict[str, Any]:
    """The `FamilyConfig` fields of a model of Gemma 4's layers (`table`, layer kinds `types`):
    Gemma 4's and Gemma 3n's."""
    return dict(
        gemma4=table,
        qk_norm=True,
        window_layers=tuple(t == SLIDING for t in types),
        attention_multiplier=1.0,  # (q and k normed: no softmax scale)
        final_logit_softcapping=cfg.get("final_logit_softcapping") or None,
    )


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads, with its shape (`Gemma4Layers.tensor_shapes`)."""
    return c.family.gemma4.tensor_shapes(c)


_SPLIT_ROWS = ("self_attn.q_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "experts.gate_up_proj")  # fmt: skip
_SPLIT_COLUMNS = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "experts.down_proj")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def _rank_share(name: str, shape: tuple[int, ...], c: ModelConfig, tp: int) -> int:
    """Elements of tensor `name` one of `tp` ranks holds (`model/gemma4.py`): the vocabulary's
    padded rows, q's and the MLPs' and experts' rows (o's, down's columns) split, k and v the
    rank's KV heads of their layer (split, or one replicated), the rest whole (norms, routers,
    per-layer inputs, Gemma 3n's AltUp and Laurel)."""
    size = 1
    for s in shape:
        size *= s
    if tp == 1:
        return size
    if name in _VOCAB:
        return -(-shape[0] // tp) * shape[1]
    if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
        layer = int(name.split(".")[2])
        kv = c.family.gemma4.kv_heads[layer]
        return size // kv * max(1, kv // tp)
    return size // tp if name.endswith(_SPLIT_ROWS + _SPLIT_COLUMNS) else size


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split Gemma 4's (or Gemma 3n's) layers of their own shapes (one
    line), or None (`distributed/tp_families.py`): each layer's KV heads (the full-attention
    layers' `num_global_key_value_heads`) must divide by `size` or it by them, each layer's MLP
    width (double wide, Gemma 3n's by layer) and the MoE block's experts' width divide by it
    (`model/gemma4.py`)."""
    g = c.family.gemma4
    if g is None:  # (a config of Gemma 4's architecture without its layers: none to check)
        return None
    for i, kv in enumerate(g.kv_heads):
        if kv % size and size % kv:
            return (f"--tensor-parallel-size {size}: layer {i}'s {kv} KV heads can neither be "
                    f"split over {size} ranks nor replicated evenly")  # fmt: skip
    for i, width in enumerate(g.mlp_widths):
        if width % size:
            return f"--tensor-parallel-size {size} does not divide layer {i}'s MLP width ({width})"
    if g.num_experts and g.moe_intermediate_size % size:
        return (f"--tensor-parallel-size {size} does not divide the experts' width "
                f"(moe_intermediate_size {g.moe_intermediate_size})")  # fmt: skip
    return None


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """(rows, columns) of a Gemma 4 / Gemma 3n layer's tensor on one rank (`model/gemma4.py`,
    `distributed/tp_families.py`): q by its heads and k/v by its KV heads of the layer's head
    size, o, the MLP's down and the experts' down by input columns, gate/up and the experts'
    gate_up by rows; the rest whole (norms, the router, per-layer inputs, AltUp, Laurel)."""
    g = c.family.gemma4
    if g is None:
        return None
    d = g.head_dims[layer]
    if part == "self_attn.q_proj.weight":
        q0, q1 = lay.heads(c.num_heads)
        return (q1 - q0) * d, cols
    if part in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        k0, k1 = lay.kv_heads(g.kv_heads[layer])
        return (k1 - k0) * d, cols
    if part in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "experts.down_proj"):
        return rows, cols // lay.size
    if part in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "experts.gate_up_proj"):
        return rows // lay.size, cols
    return rows, cols


def param_count(c: ModelConfig, tp: int = 1) -> int:
    """The weights' elements, on one rank of `tp` (`server/weights_from_shapes.from_shapes` for
    a config alone)."""
    return sum(_rank_share(n, shape, c, tp) for n, shape in expected_shapes(c).items())
