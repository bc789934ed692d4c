"""GGUFs of Gemma 4's text model (`gemma4`) as llama.cpp's converter writes them (its
Gemma4Model over Gemma3Model), read as `gguf_classic` reads its families: the checkpoint's
config.json (`Gemma4TextConfig`) rebuilt from the file's keys (`hf_config`), the tensors under
the names `model/gemma4.py` reads, as stored (the converter shifts no norm for Gemma 4).

What the converter wrote, read back here:
- the layer kinds as `attention.sliding_window_pattern` (a flag per layer), the full-attention
  layers' head size as `attention.key_length`, the sliding ones' as `attention.key_length_swa`;
  `attention.head_count_kv` a value per layer where the config had `num_global_key_value_heads`
  (its full layers' count);
- `feed_forward_length` a value per layer with `use_double_wide_mlp` (twice as wide on the
  `attention.shared_kv_layers` last layers); per-layer inputs from
  `embedding_length_per_layer_input` (0: none), their table `per_layer_token_embd`;
- the full-attention layers' "proportional" rotary as a `rope_freqs` tensor (1 on the rotating
  frequencies, 1e30 on the others: their count is the partial rotary factor), `rope.freq_base`
  theirs, `rope.freq_base_swa` the sliding layers';
- `attention_k_eq_v` where a full-attention layer holds `attn_k` but no `attn_v`;
- the MoE block (`expert_count`): the router's `ffn_gate_inp` with its `.scale` vector, the
  experts' fused `ffn_gate_up_exps` and `ffn_down_exps` with the per-expert `.scale` (the
  router's `per_expert_scale`), the block's extra norms;
- the lm_head never written (tied); llama.cpp's GeGLU (`gelu_pytorch_tanh`), no key for it.
Refused in one line: a partial rotary on the sliding layers, full-attention KV heads other than
the sliding layers' without `attention_k_eq_v`, a per-layer width that is not the double-wide
pattern.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ENGINE_ARCH = {"gemma4": "gemma4"}
HF_ARCH = {"gemma4": "Gemma4ForCausalLM"}
ARCHS = tuple(HF_ARCH)  # the engine's
ACTIVATION = "gelu_pytorch_tanh"  # llama.cpp's LLM_FFN_GELU
# the file's global tensors -> the checkpoint's
GLOBALS = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight",
           "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
           "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
           "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight"}  # fmt: skip
# the per-layer tensors (`blk.N.<part>.<suffix>`) -> the checkpoint's (under model.layers.N.)
LAYER = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
         "attn_v.weight": "self_attn.v_proj.weight",
         "attn_output.weight": "self_attn.o_proj.weight",
         "attn_q_norm.weight": "self_attn.q_norm.weight",
         "attn_k_norm.weight": "self_attn.k_norm.weight",
         "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
         "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
         "post_attention_norm.weight": "post_attention_layernorm.weight",
         "ffn_norm.weight": "pre_feedforward_layernorm.weight",
         "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
         "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
         "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
         "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
         "layer_output_scale.weight": "layer_scalar",
         "inp_gate.weight": "per_layer_input_gate.weight",
         "proj.weight": "per_layer_projection.weight",
         "post_norm.weight": "post_per_layer_input_norm.weight",
         "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
         "ffn_gate_up_exps.weight": "experts.gate_up_proj",
         "ffn_down_exps.weight": "experts.down_proj",
         "ffn_down_exps.scale": "router.per_expert_scale"}  # fmt: skip
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+\.(?:weight|scale))$")
SLIDING, FULL = "sliding_attention", "full_attention"
FROZEN = 1e29  # a `rope_freqs` factor at least this freezes its frequency (the converter's 1e30)
Get = Callable[..., Any]  # get(key, default): the file's `gemma4.<key>`


def hf_name(name: str) -> str | None:
    """The checkpoint's name of a Gemma 4 file's tensor (None: not read, e.g. `rope_freqs`)."""
    if name in GLOBALS:
        return GLOBALS[name]
    m = _BLOCK.match(name)
    if m is None or m[2] not in LAYER:
        return None
    return f"model.layers.{m[1]}.{LAYER[m[2]]}"


def hf_config(get: Get, tensors: set[str], vocab: int,
              values: Callable[[str], list[float]]) -> dict[str, Any]:  # fmt: skip
    """The `Gemma4TextConfig` of the checkpoint a `gemma4` file was converted from, as far as
    the engine reads it (module docstring)."""
    n = int(get("block_count"))
    flags = get("attention.sliding_window_pattern")
    if not isinstance(flags, list) or len(flags) != n:
        raise ValueError(f"GGUF gemma4 needs attention.sliding_window_pattern with a flag for "
                         f"each of its {n} layers")  # fmt: skip
    types = [SLIDING if f else FULL for f in flags]
    head_dim, global_dim = int(get("attention.key_length_swa")), int(get("attention.key_length"))
    rot_swa = get("rope.dimension_count_swa")
    if rot_swa is not None and int(rot_swa) != head_dim:
        raise ValueError(f"GGUF gemma4 rope.dimension_count_swa {rot_swa} < the sliding layers' "
                         f"head size {head_dim}: a partial rotary there is not supported")  # fmt: skip
    if get("rope.scaling.type") not in (None, "none"):
        raise ValueError(f"GGUF gemma4 rope.scaling.type {get('rope.scaling.type')!r} is not "
                         "supported (its rotary: proportional, from rope_freqs)")  # fmt: skip
    shared = int(get("attention.shared_kv_layers", 0) or 0)
    cfg: dict[str, Any] = {
        "architectures": [HF_ARCH["gemma4"]], "model_type": "gemma4_text", "vocab_size": vocab,
        "hidden_size": int(get("embedding_length")), "num_hidden_layers": n,
        "num_attention_heads": int(get("attention.head_count")), "head_dim": head_dim,
        "global_head_dim": global_dim, "layer_types": types,
        "sliding_window": int(get("attention.sliding_window")),
        "max_position_embeddings": int(get("context_length", 131072)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "num_kv_shared_layers": shared, "hidden_activation": ACTIVATION,
        "tie_word_embeddings": "output.weight" not in tensors, "attention_bias": False,
        "hidden_size_per_layer_input": int(get("embedding_length_per_layer_input", 0) or 0),
        "vocab_size_per_layer_input": vocab,
        "rope_parameters": _rope(get, tensors, global_dim, values),
    }  # fmt: skip
    cfg.update(_widths(get, n, shared))
    cfg.update(_kv_heads(get, types, tensors))
    experts = int(get("expert_count", 0) or 0)
    cfg["enable_moe_block"] = bool(experts)
    if experts:
        cfg.update(num_experts=experts, top_k_experts=int(get("expert_used_count")),
                   moe_intermediate_size=int(get("expert_feed_forward_length")))  # fmt: skip
    return cfg


def _rope(get: Get, tensors: set[str], global_dim: int,
          values: Callable[[str], list[float]]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Each layer kind's rotary: the full layers' proportional one from `rope_freqs` (its
    entries of 1 rotate; 1e30 freezes the rest), else default."""
    full: dict[str, Any] = {"rope_type": "default",
                            "rope_theta": float(get("rope.freq_base", 1_000_000.0))}  # fmt: skip
    if "rope_freqs.weight" in tensors:
        factors = values("rope_freqs.weight")
        rotating = sum(1 for f in factors if f == 1.0)
        frozen = factors[rotating:]  # (1e30 in float32: not Python's 1e30 exactly)
        if len(factors) != global_dim // 2 or any(f < FROZEN for f in frozen):
            raise ValueError(f"GGUF gemma4 rope_freqs must be {global_dim // 2} factors: 1 on "
                             "the rotating frequencies, then 1e30 (the proportional rotary)")  # fmt: skip
        full.update(rope_type="proportional", partial_rotary_factor=2 * rotating / global_dim)
    sliding = {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa", 10_000.0))}
    return {SLIDING: sliding, FULL: full}


def _widths(get: Get, n: int, shared: int) -> dict[str, Any]:
    """The MLP's width; `use_double_wide_mlp` where the per-layer widths say so."""
    width = get("feed_forward_length")
    if not isinstance(width, list):
        return {"intermediate_size": int(width)}
    base = int(width[0])
    double = [base if i < n - shared else 2 * base for i in range(n)]
    if [int(w) for w in width] != double or not shared:
        raise ValueError(f"GGUF gemma4 feed_forward_length {list(width)} is not one width with "
                         "the KV-shared layers' double (use_double_wide_mlp)")  # fmt: skip
    return {"intermediate_size": base, "use_double_wide_mlp": True}


def _kv_heads(get: Get, types: list[str], tensors: set[str]) -> dict[str, Any]:
    """The KV heads (the sliding layers'; the full layers' with `attention_k_eq_v`) and
    whether the full layers take values from the keys' projection (no `attn_v`)."""
    full = [i for i, t in enumerate(types) if t == FULL]
    k_eq_v = any(f"blk.{i}.attn_k.weight" in tensors and f"blk.{i}.attn_v.weight" not in tensors
                 for i in full)  # fmt: skip
    kv = get("attention.head_count_kv")
    if not isinstance(kv, list):
        return {"num_key_value_heads": int(kv), "attention_k_eq_v": k_eq_v}
    sliding = {int(kv[i]) for i, t in enumerate(types) if t == SLIDING}
    wide = {int(kv[i]) for i in full}
    if len(sliding) > 1 or len(wide) > 1:
        raise ValueError(f"GGUF gemma4 attention.head_count_kv {list(kv)}: one count for each "
                         "layer kind is supported")  # fmt: skip
    out: dict[str, Any] = {"num_key_value_heads": next(iter(sliding or wide)),
                           "attention_k_eq_v": k_eq_v}  # fmt: skip
    if wide and wide != (sliding or wide):
        if not k_eq_v:
            raise ValueError("GGUF gemma4 full-attention layers with their own KV head count "
                             "are supported only with keys as values (no attn_v)")  # fmt: skip
        out["num_global_key_value_heads"] = next(iter(wide))
    return out
