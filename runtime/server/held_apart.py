"""The bytes one rank holds of a checkpoint tensor that is no `Linear`'s matrix (`held_apart`):
a learned position table, a float32 router, latent attention's absorbed kv_b, a Mamba2 mixer's
conv, A and D, norms (float32 where the family keeps them so), attention sinks and biases, and
a family's own tensors (`held_families.HELD`, asked first). `weights.resident` counts the
`Linear`s' matrices by layer, and these one by one.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from pagoda.runtime.server import held_families
from pagoda.runtime.server.checkpoint_table import POSITIONS
from pagoda.runtime.server.held_families import NORM as _NORM
from pagoda.runtime.server.placement import Placement, float32_router_bytes
from pagoda.runtime.server.rank_share import _local, _mamba_share
from pagoda.runtime.server.weights_from_shapes import _kv_b_rows

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.server.stored import Stored

# llama.cpp's split of DeepSeek's kv_b_proj, joined back at load (`deepseek.kv_b_weight`)
# kv_b_proj, or llama.cpp's split of it: held as the absorbed W_UK and W_UV (model/deepseek.py)
_KV_B = re.compile(r"self_attn\.(\d+\.)?(kv|k|v)_b_proj\.weight$")  # (LongCat's sublayers')
# a Mamba2 mixer's tensors held as they are, not as `Linear`s (`model/mamba2.py`)
_MAMBA_TENSORS = re.compile(
    r"(\.(mamba|linear_attn)\.([qkv]_)?(conv1d\.weight|A_log|D)|\.conv\.conv\.weight)$"
)  # (LFM2's conv; Qwen3-Next's DeltaNet conv and A; OLMo Hybrid's conv in q, k, v parts)
# a KDA layer's conv (whole or in q, k, v parts), A_log, dt_bias and gated norm: tensors, not
# `Linear`s, all but the conv in float32 (`model/kimi_linear.py`)
# DeepSeek's router: its weight and correction bias held in float32 (moe_routing.GroupedRouter;
# their names in the families of `model/moe_names.py` too)
_FLOAT32_ROUTER = re.compile(r"(mlp|block_sparse_moe|feed_forward)\.((router\.)?gate\.(wg\.)?weight|"
                             r"router\.classifier\.weight|"  # (LongCat-Flash's)
                             r"((gate|moe_statics|experts|router)\.)?e_score_correction_bias|expert_bias)$")  # fmt: skip

# HY V4's tensors held in float32: the hyper-connections, the sinks, the indexer key's norm
_HY_V4_FLOAT32 = re.compile(
    r"(_hc\.(fn|base|scale)|hc_head\.hc_\w+|self_attn\.sinks|"
    r"indexer\.k_norm\.(weight|bias))$"
)


def held_apart(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """The bytes one rank holds of a tensor that is no `Linear`'s matrix: a position table,
    a float32 router, latent attention's absorbed kv_b, a Mamba2 mixer's conv, A and D, norms,
    sinks and biases; None for a `Linear`'s matrix (`resident` counts them by layer)."""
    if name == POSITIONS:  # a table (not a Linear), whole on every rank
        return t.numel * p.dtype.itemsize
    m = mc.family.mamba  # DeepSeek's router, and Nemotron-H's (the same one), held in float32
    float32_router = mc.family.routing is not None or (m is not None and m.moe is not None)
    # (Cohere's q/k norms: [heads, head_dim]; Gemma 4's MoE block's `_1`, `_2`)
    norm = _NORM.search(name) is not None
    # Nemotron-H's block and final norms in float32 (`NemotronHModel.norm_weight`); its
    # Mamba2 mixers' gated norm (`mamba.norm`) in the dtype
    float32_norm = norm and ".mamba." not in name and mc.architecture == "nemotron_h"
    # Qwen3-Next's and Qwen3.5's (1 + w) norms (`qwen3_next.Qwen3NextModel`), not the gated one
    float32_norm |= (
        norm
        and ".linear_attn." not in name
        and mc.family.mamba is not None
        and (mc.family.mamba.mixer == "gated_deltanet")
        and not mc.family.olmo2_norms  # (OLMo Hybrid's: as stored)
        and mc.architecture != "lara_mini"  # (as stored)
    )
    if float32_router and _FLOAT32_ROUTER.search(name):
        return float32_router_bytes(t, p)
    if name.endswith("indexer.weights_proj.weight") and mc.architecture != "glm5_next":
        # DeepSeek Sparse Attention's, float32 (GLM-5-Next's in the model's dtype)
        return float32_router_bytes(t, p)
    if mc.family.hyper is not None and _HY_V4_FLOAT32.search(name):  # (model/hy_v4.py)
        start, stop = lay.heads(mc.num_heads) if name.endswith(".sinks") else (0, t.numel)
        return (stop - start) * 4  # (the sinks: this rank's heads')
    if mc.family.mla is not None and _KV_B.search(name):
        return _absorbed_kv_b(t, mc, lay, p)
    if name == "lm_head.logit_scale":  # Dory's per-token logit scale, float32
        return t.numel * 4
    family = held_families.HELD.get(mc.architecture)  # a family's own tensors
    if family is not None and (held := family(name, t, mc, lay, p)) != held_families.GENERIC:
        return held
    if _MAMBA_TENSORS.search(name):  # a Mamba2 mixer's conv (a tensor, not a Linear),
        # A and D in float32 (`model/mamba2.py`), this rank's channels and heads
        n = t.numel * _mamba_share(name, mc, lay)
        return int(n) * (4 if name.endswith(("A_log", "D")) else p.dtype.itemsize)
    if name.endswith(".weight") and len(t.shape) in (2, 3) and not norm:
        return None
    if norm and (
        mc.family.gemma_norms or (mc.family.cohere_layer and not mc.family.cohere_rms_norm)
        or mc.architecture in ("gpt_oss", "minimax_m3") or float32_norm
        or mc.family.gemma4 is not None
        or name.endswith(("q_layernorm.weight", "k_layernorm.weight"))
    ):  # fmt: skip
        # float32: Gemma's (and MiniMax-M3's) 1 + w (gemma2.norm_weight), Cohere's LayerNorm
        # weights, gpt-oss's w, Nemotron-H's, StableLM's per-head q/k norms stacked (a GGUF's)
        return math.prod(_local(name, t.shape, mc, lay)) * 4
    if name.endswith(("self_attn.sinks", "self_attn.attention_sink_bias")):  # float32, this
        # rank's heads (gpt-oss's, MiMo-V2-Flash's)
        start, stop = lay.heads(mc.num_heads)
        return (stop - start) * 4
    return _local(name, t.shape, mc, lay)[0] * p.dtype.itemsize  # norms and biases (o's and
    # down's whole on every rank)


def _absorbed_kv_b(t: Stored, mc: ModelConfig, lay, p: Placement) -> int:
    """kv_b_proj as `model/deepseek.py` holds it, the absorbed W_UK and W_UV: this rank's
    heads' rows, dense in the dtype (never in place, packed or FP8); llama.cpp's split counted
    with its k_b part (its v_b part: 0)."""
    if ".v_b_proj." in t.name:
        return 0
    q0, q1 = lay.heads(mc.num_heads)
    return _kv_b_rows(q1 - q0, mc.family.mla) * mc.family.mla.kv_lora_rank * p.dtype.itemsize
