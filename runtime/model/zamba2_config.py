"""Zamba2's config as transformers 5 reads it (`Zamba2ForCausalLM`: Zyphra's Zamba2-1.2B, 2.7B,
7B and their instruct models), for `model/zamba2.py`; reached through `mamba_config`. Kept
apart from the model so that reading a config imports no layer code.

- `layers_block_type` ("mamba" / "linear_attention", or "hybrid"; transformers' default
  pattern of 54 layers where left out): a Mamba2 mixer in every layer (n_mamba_heads heads of
  mamba_expand x hidden / n_mamba_heads, `mamba_ngroups` B/C groups, the conv always biased,
  dt clamped below at `time_step_min`, the gated norm's eps 1e-5 whatever `rms_norm_eps`
  says), and on the "hybrid" ones a shared transformer block before it
  (`recurrent_configs.Zamba2Blocks`): `num_mem_blocks` blocks used in turn, each use with LoRA
  adapters (`adapter_rank`) of its own on the MLP's gate_up, and on q, k and v where
  `use_shared_attention_adapter`;
- the block's attention reads 2 x hidden channels ([stream, embeddings]): head_dim
  2 x hidden / num_attention_heads, softmax scale (head_dim / 2) ** -0.5, rotary on the whole
  head where `use_mem_rope`; its MLP (`intermediate_size`, 4 x hidden where left out) is
  gated by `hidden_act` (GELU, exact, by default).

The checkpoint holds a block's tensors (and every use's adapters) under its first use's layer,
``model.layers.{i}.shared_transformer.`` (transformers ties the later uses to it and reads no
copy they may hold); a hybrid layer's mixer and norm are under ``mamba_decoder.``, its own
linear under ``linear.``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.recurrent_configs import MambaConfig, Zamba2Blocks

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig

ARCHITECTURES = {"Zamba2ForCausalLM": "zamba2"}
# transformers' Zamba2Config defaults, where config.json leaves one out
DEFAULTS = {
    "zamba2": {"vocab_size": 32000, "max_position_embeddings": 4096, "hidden_size": 2560,
               "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1,
               "time_step_min": 0.001, "n_mamba_heads": 8, "chunk_size": 256,
               "add_bias_linear": False, "hidden_act": "gelu", "num_attention_heads": 32,
               "num_mem_blocks": 1, "use_shared_attention_adapter": False, "adapter_rank": 128,
               "use_mem_rope": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
               "use_long_context": False, "tie_word_embeddings": True},
}  # fmt: skip
GATED_NORM_EPS = 1e-5  # Zamba2RMSNormGated's, hard-coded in transformers
# transformers' default `layers_block_type` (Zamba2-2.7B's 54 layers)
_DEFAULT_TYPES = (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"]
                  + ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2)  # fmt: skip
_MAMBA = ("mamba", "linear_attention")


def layer_types(cfg: Mapping[str, Any]) -> list[str]:
    """Each layer's type, "mamba" or "hybrid" (a shared block, then the mixer)."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types") or _DEFAULT_TYPES
    out = ["mamba" if t in _MAMBA else t for t in types]
    unknown = sorted({t for t in out if t not in ("mamba", "hybrid")})
    if unknown:
        raise ValueError(f"layers_block_type {unknown} are not supported in a zamba2 model "
                         "(mamba, hybrid)")  # fmt: skip
    return out


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The layers from their types, the MLP's width, the shared attention's head size (its
    input is [stream, embeddings], 2 x hidden wide)."""
    if cfg.get("use_long_context"):
        raise ValueError("a zamba2 model with use_long_context (its rescaled rotary base) is not "
                         "supported")  # fmt: skip
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    if 2 * hidden % heads:
        raise ValueError(f"num_attention_heads ({heads}) must divide 2 x hidden_size "
                         f"({2 * hidden})")  # fmt: skip
    return {"num_hidden_layers": len(layer_types(cfg)), "head_dim": 2 * hidden // heads,
            "intermediate_size": cfg.get("intermediate_size") or 4 * hidden,
            "attention_bias": False}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    adapters = bool(cfg["use_shared_attention_adapter"])
    if adapters and kv != heads:  # (transformers' k/v adapters are 2 x hidden wide, as q's)
        raise ValueError(f"use_shared_attention_adapter with num_key_value_heads ({kv}) other "
                         f"than num_attention_heads ({heads}) is not supported")  # fmt: skip
    mamba_heads, inner = int(cfg["n_mamba_heads"]), int(cfg["mamba_expand"]) * hidden
    if inner % mamba_heads:
        raise ValueError(f"n_mamba_heads ({mamba_heads}) must divide mamba_expand x "
                         f"hidden_size ({inner})")  # fmt: skip
    types = layer_types(cfg)
    blocks = Zamba2Blocks(hybrid=tuple(t == "hybrid" for t in types),
                          blocks=int(cfg["num_mem_blocks"]), adapter_rank=int(cfg["adapter_rank"]),
                          attention_adapters=adapters)  # fmt: skip
    mamba = MambaConfig(
        layers=(True,) * n,
        n_heads=mamba_heads,
        head_dim=inner // mamba_heads,
        d_state=int(cfg["mamba_d_state"]),
        n_groups=int(cfg["mamba_ngroups"]),
        d_conv=int(cfg["mamba_d_conv"]),
        chunk_size=int(cfg["chunk_size"]),
        conv_bias=True,  # (transformers builds the conv with a bias whatever use_conv_bias says)
        proj_bias=bool(cfg["add_bias_linear"]),
        dt_min=float(cfg["time_step_min"]),
        zamba2=blocks,
    )
    head_dim = 2 * hidden // heads
    return {"mamba": mamba, "rope_layers": (bool(cfg["use_mem_rope"]),) * n,
            "attention_multiplier": (head_dim / 2) ** -0.5}  # fmt: skip


def mixer_prefix(c: ModelConfig, i: int) -> str:
    """Where layer `i`'s mixer (under ``mamba.``) and its norm are: the layer, or a hybrid
    layer's ``mamba_decoder.``."""
    hybrid = c.family.mamba.zamba2.hybrid[i]
    return f"model.layers.{i}.mamba_decoder." if hybrid else f"model.layers.{i}."


def block_prefix(c: ModelConfig, block: int) -> str:
    """Where shared block `block`'s tensors are: under its first use's layer."""
    z = c.family.mamba.zamba2
    first = [i for i, h in enumerate(z.hybrid) if h][block]
    return f"model.layers.{first}.{shared_name(c)}."


def shared_name(c: ModelConfig) -> str:
    """The shared block's name under a hybrid layer: Zamba2's, Zamba's (`zamba_config.py`)."""
    return "shared_transf" if c.architecture == "zamba" else "shared_transformer"


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors: its mixer and norm; a hybrid layer's linear and, on a block's
    first use, the block's tensors and every use's adapters."""
    m, h = c.family.mamba, c.hidden_size
    z, p = m.zamba2, mixer_prefix(c, i)
    x = p + "mamba."
    out = {p + "input_layernorm.weight": (h,),
           x + "in_proj.weight": (m.d_inner + m.conv_dim + m.n_heads, h),
           x + "conv1d.weight": (m.conv_dim, 1, m.d_conv), x + "conv1d.bias": (m.conv_dim,),
           x + "A_log": (m.n_heads,), x + "D": (m.n_heads,), x + "dt_bias": (m.n_heads,),
           x + "norm.weight": (m.d_inner,), x + "out_proj.weight": (h, m.d_inner)}  # fmt: skip
    if not z.hybrid[i]:
        return out
    out[f"model.layers.{i}.linear.weight"] = (h, h)
    block, use = z.block(i)
    if use >= z.blocks:  # a later use: the block's tensors are under its first use
        return out
    b, wide, inter, r = block_prefix(c, block), 2 * h, c.intermediate_size, z.adapter_rank
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    a = b + "self_attn."
    out.update({b + "input_layernorm.weight": (wide,), b + "pre_ff_layernorm.weight": (h,),
                a + "q_proj.weight": (q, wide), a + "k_proj.weight": (kv, wide),
                a + "v_proj.weight": (kv, wide), a + "o_proj.weight": (h, q),
                b + "feed_forward.gate_up_proj.weight": (2 * inter, h),
                b + "feed_forward.down_proj.weight": (h, inter)})  # fmt: skip
    for j in range(block, sum(z.hybrid), z.blocks):  # this block's uses
        f = f"{b}feed_forward.gate_up_proj_adapter_list.{j}."
        out.update({f + "0.weight": (r, h), f + "1.weight": (2 * inter, r)})
        if z.attention_adapters:
            for n in "qkv":
                s = f"{a}linear_{n}_adapter_list.{j}."
                out.update({s + "0.weight": (r, wide), s + "1.weight": (wide, r)})
    return out


def params(c: ModelConfig) -> int:
    """The model's weights (`Zamba2Blocks.params`)."""
    return c.family.mamba.zamba2.params(c)


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay):
    """A rank's (rows, columns) of a shared block use's LoRA adapters' B (`model/zamba2.py`,
    as `server/held_forms.py` stacks them): gate_up's by its rows, q/k/v's by the rank's
    query and KV heads (A whole); None for the other tensors (`distributed/tp_families.py`)."""
    if re.search(r"gate_up_proj_adapter_list\.\d+\.1\.weight$", part):
        return rows // lay.size, cols
    if re.search(r"\blora_qkv\.\d+\.1\.weight$", part):
        (q0, q1), (k0, k1) = lay.heads(c.num_heads), lay.kv_heads(c.num_kv_heads)
        return (q1 - q0 + 2 * (k1 - k0)) * c.head_dim, cols
    return None
