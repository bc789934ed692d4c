"""Zamba's config as transformers 5 reads it (`ZambaForCausalLM`: Zyphra's Zamba-7B-v1 and its
phase-1 model), for `model/zamba.py`; reached through `mamba_config`. Kept apart from the model
so that reading a config imports no layer code.

- `layers_block_type` ("mamba" / "linear_attention", or "hybrid"; where left out,
  transformers' pattern: two Mamba layers, a hybrid one, then a hybrid layer every
  `attn_layer_period`-th from `attn_layer_offset`): a Mamba-1 mixer in every layer, split
  into `n_mamba_heads` heads, each with its own x_proj, dt_proj, B and C (x_proj_weight
  [H, dt_rank + 2 d_state, P], dt_proj_weight [H, P, dt_rank], A_log [H, P, d_state]; in_proj's
  rows interleave x and the gate), and on the "hybrid" ones the one shared transformer block
  before it (`recurrent_configs.Zamba2Blocks` with one block and no adapters);
- the block's attention reads 2 x hidden channels ([stream, embeddings]): head_dim
  2 x hidden / num_attention_heads (`attention_head_dim`), softmax scale (head_dim / 2) ** -0.5,
  no rotary; its MLP (gate_proj, up_proj, down_proj) gated by `hidden_act` (exact GELU).

The checkpoint holds the block's tensors under its first use's layer,
``model.layers.{i}.shared_transf.`` (transformers ties the later uses to it and reads no copy
they may hold); a hybrid layer's mixer and norm are under ``mamba_decoder.``, its own linear
under ``linear.``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.recurrent_configs import MambaConfig, Zamba2Blocks

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"ZambaForCausalLM": "zamba"}
# transformers' ZambaConfig defaults, where config.json leaves one out
DEFAULTS = {
    "zamba": {"vocab_size": 32000, "hidden_size": 3712, "intermediate_size": 14848,
              "num_hidden_layers": 76, "num_attention_heads": 16, "num_key_value_heads": 16,
              "n_mamba_heads": 2, "hidden_act": "gelu", "hidden_mamba_act": "silu",
              "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "attn_layer_period": 6,
              "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
              "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
              "tie_word_embeddings": True},
}  # fmt: skip
_MAMBA = ("mamba", "linear_attention")


def layer_types(cfg: Mapping[str, Any]) -> list[str]:
    """Each layer's type, "mamba" or "hybrid" (the shared block, then the mixer)."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if not types:  # transformers' default pattern
        period, offset = int(cfg["attn_layer_period"]), int(cfg["attn_layer_offset"])
        rest = int(cfg["num_hidden_layers"]) - 3
        types = ["mamba", "mamba", "hybrid"] + [
            "hybrid" if i % period == offset else "mamba" for i in range(rest)
        ]
    out = ["mamba" if t in _MAMBA else t for t in types]
    unknown = sorted({t for t in out if t not in ("mamba", "hybrid")})
    if unknown:
        raise ValueError(f"layers_block_type {unknown} are not supported in a zamba model "
                         "(mamba, hybrid)")  # fmt: skip
    return out


def _head_dim(cfg: Mapping[str, Any]) -> int:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    wide = int(cfg.get("attention_hidden_size") or 2 * hidden)
    if wide != 2 * hidden:
        raise ValueError(f"a zamba model with attention_hidden_size {wide} is not supported "
                         f"(2 x hidden_size, {2 * hidden})")  # fmt: skip
    head_dim = cfg.get("attention_head_dim") or cfg.get("head_dim") or wide // heads
    return int(head_dim)


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The layers from their types, the shared attention's head size (its input is [stream,
    embeddings], 2 x hidden wide)."""
    if cfg["hidden_mamba_act"] != "silu":
        raise ValueError(f"hidden_mamba_act {cfg['hidden_mamba_act']!r} is not supported in a "
                         "zamba model (silu)")  # fmt: skip
    return {"num_hidden_layers": len(layer_types(cfg)), "head_dim": _head_dim(cfg),
            "attention_bias": False}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["n_mamba_heads"])
    inner = int(cfg["mamba_expand"]) * hidden
    if inner % heads:
        raise ValueError(f"n_mamba_heads ({heads}) must divide mamba_expand x hidden_size "
                         f"({inner})")  # fmt: skip
    rank = cfg["mamba_dt_rank"]
    types = layer_types(cfg)
    blocks = Zamba2Blocks(hybrid=tuple(t == "hybrid" for t in types), blocks=1, adapter_rank=0,
                          attention_adapters=False)  # fmt: skip
    mamba = MambaConfig(
        layers=(True,) * n,
        n_heads=heads,
        head_dim=inner // heads,
        d_state=int(cfg["mamba_d_state"]),
        d_conv=int(cfg["mamba_d_conv"]),
        chunk_size=1,  # (Mamba-1's position-major scan: `ssd.pack` in chunks of one token)
        conv_bias=bool(cfg["mamba_conv_bias"]),
        proj_bias=bool(cfg["mamba_proj_bias"]),
        mixer="mamba1",
        dt_rank=math.ceil(hidden / 16) if rank == "auto" else int(rank),
        zamba2=blocks,
    )
    head_dim = _head_dim(cfg)
    return {"mamba": mamba, "rope_layers": (False,) * n,
            "attention_multiplier": (head_dim / 2) ** -0.5}  # fmt: skip


def mixer_prefix(c: ModelConfig, i: int) -> str:
    """Where layer `i`'s mixer (under ``mamba.``) and its norm are: the layer, or a hybrid
    layer's ``mamba_decoder.``."""
    hybrid = c.family.mamba.zamba2.hybrid[i]
    return f"model.layers.{i}.mamba_decoder." if hybrid else f"model.layers.{i}."


def mixer_shapes(m: MambaConfig, h: int, p: str) -> dict[str, tuple[int, ...]]:
    """A Zamba mixer's tensors (under `p`): Mamba-1's, x_proj, dt_proj, A and D per head."""
    x, d, n, r, heads, hd = p + "mamba.", m.d_inner, m.d_state, m.dt_rank, m.n_heads, m.head_dim
    out = {x + "in_proj.weight": (2 * d, h), x + "conv1d.weight": (d, 1, m.d_conv),
           x + "x_proj_weight": (heads, r + 2 * n, hd), x + "dt_proj_weight": (heads, hd, r),
           x + "dt_proj_bias": (heads, hd), x + "A_log": (heads, hd, n), x + "D": (heads, hd),
           x + "out_proj.weight": (h, d)}  # fmt: skip
    if m.conv_bias:
        out[x + "conv1d.bias"] = (d,)
    if m.proj_bias:
        out.update({x + "in_proj.bias": (2 * d,), x + "out_proj.bias": (h,)})
    return out


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors: its mixer and norm; a hybrid layer's linear and, on the block's
    first use, the block's tensors."""
    m, h = c.family.mamba, c.hidden_size
    z, p = m.zamba2, mixer_prefix(c, i)
    out = {p + "input_layernorm.weight": (h,), **mixer_shapes(m, h, p)}
    if not z.hybrid[i]:
        return out
    out[f"model.layers.{i}.linear.weight"] = (h, h)
    if z.block(i)[1]:  # a later use: the block's tensors are under its first use
        return out
    b, wide, inter = f"model.layers.{i}.shared_transf.", 2 * h, c.intermediate_size
    q, kv, a, f = (
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        b + "self_attn.",
        b + "feed_forward.",
    )
    out.update({b + "input_layernorm.weight": (wide,), b + "pre_ff_layernorm.weight": (h,),
                a + "q_proj.weight": (q, wide), a + "k_proj.weight": (kv, wide),
                a + "v_proj.weight": (kv, wide), a + "o_proj.weight": (h, q),
                f + "gate_proj.weight": (inter, h), f + "up_proj.weight": (inter, h),
                f + "down_proj.weight": (h, inter)})  # fmt: skip
    return out
