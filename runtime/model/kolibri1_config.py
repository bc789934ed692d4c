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

Kolibri 1.1 (`Kolibri1_1ForCausalLM`: Aleph-Alpha/Kolibri-1.1) is this model with

- "indexed_attention" layers for the full ones (NoPE): transformers' `Kolibri1_1Indexer` picks
  the keys each query attends to, the `index_topk` best of a pool (by the first
  `index_num_heads` query heads against key head 0) plus the first `index_num_sink_tokens` and
  the last `index_num_local_tokens`, once a query sees more keys than those together (2184
  with the defaults; below that every key: `Kolibri11.budget`), their keys and values rounded
  to NVFP4 (E2M1 values, an E4M3 scale per 16: `kolibri1.nvfp4_round`) as transformers rounds
  them (`kolibri1.TokenSelection`); the pool is every visible key up to `index_pool_size`
  tokens (16384), past which the `index_layers` layers (by default the 1st, 3rd, 4th and 6th
  indexed ones) pick it by blocks of `index_compression` keys (their means of the keys before
  NVFP4 rounding), the indexed layers after one reusing it;
- KV-shared layers (`kv_source_layers`: an indexed layer reading an earlier one's keys and
  values, without k_proj, v_proj or k_norm of its own), by default Kolibri 1.1's layout;
- dense MLPs of `mlp_only_intermediate_size` in `mlp_only_layers` (by default the first two).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"Kolibri1ForCausalLM": "kolibri1", "Kolibri1_1ForCausalLM": "kolibri1_1"}
MODEL_CLASSES = {"kolibri1": ("kolibri1", "Kolibri1Model"),
                 "kolibri1_1": ("kolibri1", "Kolibri11Model")}  # fmt: skip
SLIDING, FULL, INDEXED = "sliding_attention", "full_attention", "indexed_attention"
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
# Kolibri1_1Config's: Kolibri 1's, its dense MLPs' width (read as intermediate_size), the budget
DEFAULTS["kolibri1_1"] = {**DEFAULTS["kolibri1"], "intermediate_size": 3584, "index_topk": 2048,
                          "index_num_local_tokens": 128, "index_num_sink_tokens": 8,
                          "index_num_heads": 12, "index_pool_size": 16384,
                          "index_compression": 16}  # fmt: skip
# transformers' default kv_source_layers of Kolibri 1.1's indexed layers: the source of each, as
# the count of indexed layers before it
_SOURCES = (0, 0, 0, 3, 4, 5, 5, 5, 5, 0)


@dataclass(frozen=True)
class Kolibri11:
    """Kolibri 1.1's KV-shared layers (`FamilyConfig.kolibri11`): the layer whose KV cache each
    layer reads (its own, or an earlier indexed layer's); its indexed layers' selection: the
    `topk` best keys by `index_heads` query heads, the first `sinks`, the last `local`."""

    kv_source: tuple[int, ...]
    topk: int = 2048
    local: int = 128
    sinks: int = 8
    index_heads: int = 12
    pool_layers: tuple[bool, ...] = ()  # `index_layers`: the layers that pick a new pool
    pool_size: int = 16384
    compression: int = 16

    @property
    def budget(self) -> int:
        """The most keys an indexed layer's query attends to (all of them up to this many)."""
        return self.topk + self.local + self.sinks

    def shares_kv(self, layer: int) -> bool:
        return self.kv_source[layer] != layer


# the published tensor names -> the ones the model reads (transformers' conversion mapping)
_RENAMES = (
    (".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias"),
    (".post_attn_norm.weight", ".post_self_attn_layernorm.weight"),
    (".post_ffn_norm.weight", ".post_mlp_layernorm.weight"),
)


def layer_types(cfg: Mapping[str, Any], n: int, full: str = FULL) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        types = [full if (i + 1) % 5 == 0 else SLIDING for i in range(n)]
    if len(types) != n or not set(types) <= {SLIDING, full}:
        raise ValueError(f"layer_types {types!r} must name {n} layers, each {SLIDING} or {full}")
    return list(types)


def kv_sources(cfg: Mapping[str, Any], types: list[str]) -> tuple[int, ...]:
    """Kolibri 1.1's `kv_source_layers` (transformers' default where left out), checked as
    Kolibri1_1Config checks them."""
    indexed = [i for i, t in enumerate(types) if t == INDEXED]
    sources = cfg.get("kv_source_layers")
    if sources is None:
        if len(indexed) > len(_SOURCES):
            raise ValueError(f"Kolibri 1.1 with {len(indexed)} indexed-attention layers needs "
                             "kv_source_layers")  # fmt: skip
        sources = list(range(len(types)))
        for layer, source in zip(indexed, _SOURCES, strict=False):
            sources[layer] = indexed[source]
    if len(sources) != len(types):
        raise ValueError(f"kv_source_layers names {len(sources)} layers, the model has "
                         f"{len(types)}")  # fmt: skip
    for i, s in enumerate(sources):
        if not 0 <= s <= i or sources[s] != s or types[s] != types[i]:
            raise ValueError(f"kv_source_layers: layer {i} cannot read layer {s}'s keys and "
                             "values (an earlier layer of its kind with its own)")  # fmt: skip
    return tuple(int(s) for s in sources)


def _kolibri1_1(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Kolibri 1.1's fields beside Kolibri 1's (module docstring)."""
    types = layer_types(cfg, n, INDEXED)
    if int(cfg["head_dim"]) % 16:
        raise ValueError(f"Kolibri 1.1's head_dim must be a multiple of 16 (NVFP4 blocks), got "
                         f"{cfg['head_dim']}")  # fmt: skip
    indexed = [i for i, t in enumerate(types) if t == INDEXED]
    pools = cfg.get("index_layers")
    if pools is None:  # transformers' default: the 1st, 3rd, 4th and 6th indexed layers
        pools = [indexed[i] for i in (0, 2, 3, 5) if i < len(indexed)]
    if (
        sorted(set(pools)) != list(pools)
        or not set(pools) <= set(indexed)
        or (indexed and indexed[0] not in pools)
    ):
        raise ValueError(f"Kolibri 1.1's index_layers must be increasing indexed-attention "
                         f"layers, the first among them, got {pools}")  # fmt: skip
    k11 = Kolibri11(kv_sources(cfg, types), topk=int(cfg["index_topk"]),
                    local=int(cfg["index_num_local_tokens"]),
                    sinks=int(cfg["index_num_sink_tokens"]),
                    index_heads=int(cfg["index_num_heads"]),
                    pool_layers=tuple(i in pools for i in range(n)),
                    pool_size=int(cfg["index_pool_size"]),
                    compression=int(cfg["index_compression"]))  # fmt: skip
    if k11.compression < 1 or k11.pool_size % k11.compression:
        raise ValueError(f"Kolibri 1.1's index_pool_size ({k11.pool_size}) must be a multiple "
                         f"of index_compression ({k11.compression})")  # fmt: skip
    heads = int(cfg["num_attention_heads"]) // int(cfg["num_key_value_heads"])
    if not 0 < k11.index_heads <= heads or k11.topk < 1 or min(k11.local, k11.sinks) < 0:
        raise ValueError(f"Kolibri 1.1's index_num_heads must be within 1 .. {heads} (key head "
                         f"0's query heads), index_topk positive, got {k11.index_heads}, "
                         f"{k11.topk}")  # fmt: skip
    dense = cfg.get("mlp_only_layers")
    dense = set(range(min(2, n)) if dense is None else dense)
    return {"kolibri11": k11,
            "moe_layers": tuple(i not in dense for i in range(n))}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Kolibri 1 config.json (its layers: `n`), as transformers
    reads them; ValueError, one line, for what it does not run."""
    types = layer_types(cfg, n, INDEXED if arch == "kolibri1_1" else FULL)
    window = cfg.get("sliding_window")
    if SLIDING in types and (window is None or int(window) < 1):
        raise ValueError(f"Kolibri 1's sliding-attention layers need a positive sliding_window, "
                         f"got {window}")  # fmt: skip
    sliding = tuple(t == SLIDING for t in types)
    extra = _kolibri1_1(cfg, n) if arch == "kolibri1_1" else {}
    return extra | {
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


def tp_problem(c, size: int) -> str | None:
    """Why `size` ranks cannot split Kolibri 1.1 (one line), or None: rank 0 selects each
    indexed layer's keys (`kolibri1.TokenSelection`) by the first `index_heads` query heads, so
    it must hold them all (`distributed/tp_families.py`)."""
    k = c.family.kolibri11
    if k is None or k.index_heads <= c.num_heads // size:
        return None
    return (
        f"--tensor-parallel-size {size} leaves rank 0 {c.num_heads // size} query heads, "
        f"fewer than Kolibri 1.1's index_num_heads ({k.index_heads}) its key selection reads"
    )
