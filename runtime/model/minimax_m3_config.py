"""MiniMax-M3's text model's config.json (`MiniMaxM3VLForCausalLM`, model_type
`minimax_m3_vl_text`) as transformers' MiniMaxM3VLTextConfig reads it, its checkpoint's tensor
shapes: the `FamilyConfig` fields `model/minimax_m3.py` runs (its docstring says what they do).
Kept apart from the model so that reading a config imports no layer code.

- `intermediate_size` is the experts' width, `dense_intermediate_size` the dense layers' and
  `shared_intermediate_size` the shared expert's; `mlp_layer_types` (or the released
  `moe_layer_freq`) says which layers hold experts, `layer_types` (or the released
  `sparse_attention_config.sparse_attention_freq`) which attend through the lightning indexer;
- transformers ignores `rotary_dim` (its MiniMax-M2 reading is not inherited): the rotary is
  partial only where `rope_parameters` names a `partial_rotary_factor`;
- the indexer (`BlockIndexConfig`: `index_n_heads`, one per KV head, of `index_head_dim`)
  keeps, for every query and KV head, the `index_topk_blocks` best key blocks of
  `index_block_size` keys, the `index_local_blocks` ending at the query's own always among
  them (model/minimax_m3.py); with no more blocks than that every earlier key.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pagoda.runtime.distributed.tp_families import stacked_expert_rows
from pagoda.runtime.model_configs import BlockIndexConfig, ExpertRouting

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

# MiniMaxM3SparseForConditionalGeneration (MiniMaxAI/MiniMax-M3, the published checkpoint): its
# text model, read text-only (`vision_tower.`, `multi_modal_projector.`, `patch_merge_mlp.` not
# read), its tensors in the published layout (`read_published`); its head untied unless the
# top-level flag says (MiniMaxM3VLConfig's default)
ARCHITECTURES = {"MiniMaxM3VLForCausalLM": "minimax_m3",
                 "MiniMaxM3SparseForConditionalGeneration": "minimax_m3"}  # fmt: skip
TEXT_MODEL_TYPES = {"MiniMaxM3SparseForConditionalGeneration": {"minimax_m3_vl_text": "minimax_m3"}}
WRAPPER_TIES = {"minimax_m3_vl": False}  # (MiniMaxM3VLConfig's, by its model_type)
MODEL_CLASSES = {"minimax_m3": ("minimax_m3", "MiniMaxM3Model")}
PARTIAL_ROTARY = ("minimax_m3",)
SPARSE = "minimax_m3_sparse"
# transformers' MiniMaxM3VLTextConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "minimax_m3": {"vocab_size": 200_064, "hidden_size": 6144, "intermediate_size": 3072,
                   "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4,
                   "head_dim": 128, "max_position_embeddings": 524_288, "rms_norm_eps": 1e-6,
                   "rope_theta": 5_000_000.0, "bos_token_id": 200_034, "eos_token_id": 200_020,
                   "tie_word_embeddings": False, "num_experts_per_tok": 4,
                   "num_local_experts": 128, "dense_intermediate_size": 12_288,
                   "shared_intermediate_size": 3072, "routed_scaling_factor": 2.0,
                   "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "index_n_heads": 4,
                   "index_head_dim": 128, "index_block_size": 128, "index_topk_blocks": 16,
                   "index_local_blocks": 1},
}  # fmt: skip
# the released config's names of the indexer's sizes (transformers reads them there too)
_LEGACY = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
           "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
           "index_local_blocks": "sparse_local_block"}  # fmt: skip


def overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """The widths by kind (the dense MLP's as `intermediate_size`, the experts' as
    `moe_intermediate_size`) and the layer kinds from the released keys, as transformers
    derives them."""
    n = int(cfg["num_hidden_layers"])
    sparse = cfg.get("sparse_attention_config") or {}
    out = {key: sparse[old] for key, old in _LEGACY.items() if old in sparse}
    types = cfg.get("layer_types")
    if types is None and "sparse_attention_freq" in sparse:
        types = [SPARSE if f else "full_attention" for f in sparse["sparse_attention_freq"]]
    mlp = cfg.get("mlp_layer_types")
    if mlp is None and cfg.get("moe_layer_freq") is not None:
        mlp = ["sparse" if f else "dense" for f in cfg["moe_layer_freq"]]
    out.update(layer_types=types or ["full_attention"] * n, mlp_layer_types=mlp or ["sparse"] * n,
               moe_intermediate_size=cfg["intermediate_size"],
               intermediate_size=cfg["dense_intermediate_size"], hidden_act="silu")  # fmt: skip
    return out


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a MiniMax-M3 text config.json (its layers: `n`), as
    transformers reads them; ValueError, one line, for what it does not run."""
    types, mlp = cfg["layer_types"], cfg["mlp_layer_types"]
    for name, v in (("layer_types", types), ("mlp_layer_types", mlp)):
        if len(v) != n:
            raise ValueError(f"minimax_m3 {name} names {len(v)} layers, the model has {n}")
    if set(types) - {"full_attention", SPARSE}:
        raise ValueError(f"minimax_m3 layer_types {sorted(set(types))} are not supported "
                         f"(full_attention and {SPARSE})")  # fmt: skip
    if set(mlp) - {"dense", "sparse"}:
        raise ValueError(f"minimax_m3 mlp_layer_types {sorted(set(mlp))} are not supported")
    index = None
    if SPARSE in types:
        index = BlockIndexConfig(
            n_heads=int(cfg["index_n_heads"]), head_dim=int(cfg["index_head_dim"]),
            block=int(cfg["index_block_size"]), topk=int(cfg["index_topk_blocks"]),
            local=int(cfg["index_local_blocks"]), layers=tuple(t == SPARSE for t in types),
        )  # fmt: skip
        if index.n_heads != int(cfg["num_key_value_heads"]):
            raise ValueError(f"minimax_m3 index_n_heads {index.n_heads} must be its "
                             f"num_key_value_heads ({cfg['num_key_value_heads']}): one block "
                             "selection per KV head")  # fmt: skip
    return {
        "qk_norm": True,
        "routing": ExpertRouting(scoring="sigmoid", correction_bias=True,
                                 routed_scaling_factor=float(cfg["routed_scaling_factor"])),
        "num_experts": int(cfg["num_local_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": True,
        "moe_layers": tuple(t == "sparse" for t in mlp),
        "shared_expert_intermediate_size": int(cfg["shared_intermediate_size"]),
        "swiglu_alpha": float(cfg["swiglu_alpha"]),
        "swiglu_limit": float(cfg["swiglu_limit"]),
        "block_index": index,
    }  # fmt: skip


def expected_shapes(c, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s MLP (gate and up fused, gate rows first): dense, or the stacked experts and
    the shared expert (the router and bias: the checkpoint check's own); a sparse layer's
    indexer."""
    f, h, p = c.family, c.hidden_size, f"model.layers.{i}.mlp."
    out: dict[str, tuple[int, ...]] = {}
    ix = f.block_index
    if ix is not None and ix.layers[i]:
        a, d = f"model.layers.{i}.self_attn.indexer.", ix.head_dim
        out.update({a + "q_proj.weight": (ix.n_heads * d, h), a + "k_proj.weight": (d, h),
                    a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)})  # fmt: skip
    if not f.has_experts(i):
        n = c.intermediate_size
        return out | {p + "gate_up_proj.weight": (2 * n, h), p + "down_proj.weight": (h, n)}
    e, n, s = f.num_experts, f.moe_intermediate_size, f.shared_expert_intermediate_size
    return out | {p + "experts.gate_up_proj": (e, 2 * n, h), p + "experts.down_proj": (e, h, n),
                  p + "shared_experts.gate_up_proj.weight": (2 * s, h),
                  p + "shared_experts.down_proj.weight": (h, s)}  # fmt: skip


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its fused and stacked MLPs and sparse layers' indexers (`expected_shapes`) in
    `checkpoint_shapes.expected_shapes`' tensors."""
    for i in range(c.num_layers):
        out.update(expected_shapes(c, i))


# the published checkpoints' names of the text model's other tensors -> transformers' (its
# conversion_mapping "minimax_m3_vl"; the `language_model.` prefixes: `safetensors_weights`)
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"\.block_sparse_moe\.(experts|gate|shared_experts)\.", r".mlp.\1."),
    (r"\.block_sparse_moe\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.self_attn\.index_([qk])_(proj|norm)\.", r".self_attn.indexer.\1_\2."),
))  # fmt: skip


def read_published(weights, c) -> None:
    """The published layout (`MiniMaxM3SparseForConditionalGeneration`'s, as transformers saves
    it too) listed as the model reads it: each expert layer's per-expert
    `block_sparse_moe.experts.E.w1` / `w3` stacked as `mlp.experts.gate_up_proj` [E, 2I, hidden]
    (gate rows first) and `w2` as `mlp.experts.down_proj`, the split `gate_proj` / `up_proj` of
    the dense and shared-expert MLPs as their `gate_up_proj`, the router, correction bias and
    indexer renamed (`_RENAMES`); a checkpoint already in transformers' layout is left as it
    is. ValueError, one line, for a missing per-expert tensor."""
    f = c.family
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        if f.has_experts(i):
            b, m = p + "block_sparse_moe.", p + "mlp."
            experts = [f"{b}experts.{e}." for e in range(f.num_experts)]
            if any(
                e + x in weights for e in experts for x in ("w1.weight", "w3.weight", "w2.weight")
            ):
                weights.join(m + "experts.gate_up_proj",
                             [[e + "w1.weight", e + "w3.weight"] for e in experts], stacked=True)  # fmt: skip
                weights.join(m + "experts.down_proj", [[e + "w2.weight"] for e in experts], True)
            _join_gate_up(weights, b + "shared_experts.", m + "shared_experts.")
        else:
            _join_gate_up(weights, p + "mlp.", p + "mlp.")
    moves = {}
    for name in weights:
        new = name
        for pattern, to in _RENAMES:
            new = pattern.sub(to, new)
        if new != name:
            moves[name] = new
    weights.rename_all(moves)


def _join_gate_up(weights, stored: str, read: str) -> None:
    """An MLP's split `gate_proj` and `up_proj` (under `stored`) as its `gate_up_proj`."""
    gate, up = stored + "gate_proj.weight", stored + "up_proj.weight"
    if gate in weights or up in weights:
        weights.join(read + "gate_up_proj.weight", [[gate, up]], stacked=False)


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay: TPLayout):
    """A rank's (rows, columns) of the indexer's projections (`model/minimax_m3.py`: q_proj's
    queries of its KV heads, the one key whole) and of the stacked experts (per expert: gate_up
    by rows, down by columns), or None for the others (`distributed/tp_families.py`)."""
    if part == "self_attn.indexer.q_proj.weight":
        k0, k1 = lay.kv_heads(c.num_kv_heads)
        return rows // c.num_kv_heads * (k1 - k0), cols
    if part == "self_attn.indexer.k_proj.weight":
        return rows, cols
    return stacked_expert_rows(part, rows, cols, lay.size)
