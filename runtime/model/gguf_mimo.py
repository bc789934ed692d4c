"""GGUFs of MiMo-V2-Flash (`mimo2`) as llama.cpp's converter writes them (its MimoV2Model, from
the published config.json: `hybrid_layer_pattern`, `swa_num_key_value_heads`, ...), read as
`gguf_classic` reads its families: the checkpoint's config.json (transformers'
`MiMoV2FlashConfig` keys) rebuilt from the file's keys (`hf_config`), the tensors under the
names `model/mimo_v2_flash.py` reads, as stored (the converter permutes and shifts nothing).

What the converter wrote, read back here:
- the layer kinds as `attention.sliding_window_pattern` (1: sliding), the KV heads a value per
  layer (the sliding layers' `swa_num_key_value_heads`), both with entries for the
  multi-token-prediction blocks after the decoder's (`nextn_predict_layers`: not read);
- `attention.sliding_window` the published `sliding_window`, which equals its
  `sliding_window_size` (the converter reads only the published layout, where both are 128):
  read back as `sliding_window_size`, a window of that + 1 keys, as transformers reads it
  (llama.cpp masks at the file's value: one key fewer);
- q/k heads `attention.key_length` wide, values `attention.value_length`; the partial rotary
  as `rope.dimension_count`; the rotary bases `rope.freq_base` and `rope.freq_base_swa` (absent:
  the one base for both, as llama.cpp runs it); the value scale `attention.value_scale`;
- the sinks `attn_sinks` (the published `attention_sink_bias`); the experts stacked, the
  correction bias `exp_probs_b`, dense layers where there is no router (`ffn_gate_inp`);
  llama.cpp's sigmoid router renormalised, no expert groups, `expert_weights_scale` (absent
  or 0: none).
Refused in one line: a decoder tensor it does not place (MiMo-V2.5's fused `attn_qkv`), a
key it reads missing, no `attention.value_scale` (older converters left it out and llama.cpp
then runs none: the checkpoint's scale is not in the file), sliding layers whose KV heads are
not twice the full layers', sinks on a full-attention layer, a per-layer list of the wrong
length.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ENGINE_ARCH = {"mimo2": "mimo_v2_flash"}
HF_ARCH = {"mimo_v2_flash": "MiMoV2FlashForCausalLM"}
ARCHS = tuple(HF_ARCH)  # the engine's
SLIDING, FULL = "sliding_attention", "full_attention"
# the decoder layers' tensors this reading places (another: another variant's, e.g. MiMo-V2.5's
# fused `attn_qkv`, whose sliding layers' rows this cannot split without the file's sizes)
PARTS = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_sinks", "ffn_norm",
         "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
         "ffn_down_exps", "exp_probs_b"}  # fmt: skip
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.weight|\.bias)?$")
Get = Callable[..., Any]  # get(key, default): the file's `mimo2.<key>`
# the keys read without a default
_REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
             "attention.key_length", "attention.value_length", "rope.dimension_count",
             "attention.sliding_window", "expert_count", "expert_used_count",
             "expert_feed_forward_length")  # fmt: skip


def hf_name(layer: str, part: str, kind: str) -> str | None:
    """The checkpoint's name of a sink (`blk.N.attn_sinks.weight`: no suffix there); None for
    the others (Llama's names and `gguf_classic`'s experts)."""
    return f"model.layers.{layer}.self_attn.attention_sink_bias" if part == "attn_sinks" else None


def hf_config(get: Get, tensors: set[str], vocab: int) -> dict[str, Any]:
    """The config.json of the checkpoint a `mimo2` file was converted from, as far as the
    engine reads it (module docstring)."""
    missing = [k for k in _REQUIRED if get(k) is None]
    if missing:
        raise ValueError(f"GGUF mimo2 needs {', '.join(missing)}")
    n = int(get("block_count")) - int(get("nextn_predict_layers", 0) or 0)
    pattern, kv = get("attention.sliding_window_pattern"), get("attention.head_count_kv")
    if not isinstance(pattern, list) or not isinstance(kv, list) or min(len(pattern), len(kv)) < n:
        raise ValueError(f"GGUF mimo2 needs attention.sliding_window_pattern and "
                         f"attention.head_count_kv with a value for each of its {n} layers")  # fmt: skip
    blocks = (_BLOCK.match(t) for t in tensors)
    unknown = sorted({m[2] for m in blocks if m and int(m[1]) < n} - PARTS)
    if unknown:
        raise ValueError(f"GGUF mimo2 with {', '.join(unknown)} in its decoder layers is not "
                         "supported (another variant's: MiMo-V2.5's fused attn_qkv)")  # fmt: skip
    types = [SLIDING if pattern[i] else FULL for i in range(n)]
    full = {int(kv[i]) for i in range(n) if types[i] == FULL}
    swa = {int(kv[i]) for i in range(n) if types[i] == SLIDING}
    heads_kv = next(iter(full or {min(swa) // 2}))
    if len(full) > 1 or swa - {2 * heads_kv}:
        raise ValueError(f"GGUF mimo2 attention.head_count_kv {list(kv[:n])}: the sliding layers "
                         "must have twice the full layers' KV heads")  # fmt: skip
    if any(types[i] == FULL and f"blk.{i}.attn_sinks.weight" in tensors for i in range(n)):
        raise ValueError("GGUF mimo2 with sinks on a full-attention layer is not supported")
    scale = get("attention.value_scale")
    if scale is None:
        raise ValueError("GGUF mimo2 without attention.value_scale (older converters left "
                         "MiMo's value scale out): reconvert it")  # fmt: skip
    head_dim, rot = int(get("attention.key_length")), int(get("rope.dimension_count"))
    # (rot + 0.5) / head_dim: the engine's int(head_dim * factor) is rot whatever the rounding
    partial = (rot + 0.5) / head_dim if rot < head_dim else 1.0
    base = float(get("rope.freq_base", 10000.0))
    rope = {FULL: {"rope_type": "default", "rope_theta": base, "partial_rotary_factor": partial},
            SLIDING: {"rope_type": "default", "partial_rotary_factor": partial,
                      "rope_theta": float(get("rope.freq_base_swa", base) or base)}}  # fmt: skip
    routed = float(get("expert_weights_scale", 0.0) or 0.0)
    return {
        "architectures": [HF_ARCH["mimo_v2_flash"]], "model_type": "mimo_v2_flash",
        "vocab_size": vocab, "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": n,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": heads_kv, "head_dim": head_dim,
        "v_head_dim": int(get("attention.value_length")), "layer_types": types,
        "sliding_window_size": int(get("attention.sliding_window")),
        "attention_value_scale": float(scale), "rope_parameters": rope,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(get("context_length", 131072)), "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors, "attention_bias": False,
        "n_routed_experts": int(get("expert_count")),
        "num_experts_per_tok": int(get("expert_used_count")),
        "moe_intermediate_size": int(get("expert_feed_forward_length")), "n_group": 1,
        "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": routed or 1.0,
        "mlp_layer_types": ["sparse" if f"blk.{i}.ffn_gate_inp.weight" in tensors else "dense"
                            for i in range(n)],
    }  # fmt: skip
