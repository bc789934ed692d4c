"""GGUFs of Kimi Linear (`kimi-linear`) as llama.cpp's converter writes them (its
KimiLinearModel), read as `gguf_classic` reads its families: the checkpoint's config.json
(the published `KimiLinearForCausalLM` keys) rebuilt from the file's keys (`hf_config`), the
tensors under the names `model/kimi_linear.py` reads, in the checkpoint's forms (`value`).

What the converter wrote, read back here:
- the layer kinds as a per-layer `attention.head_count_kv` (0: a KDA layer; 1 on the latent
  attention layers: llama.cpp's MQA over the latent), read back as `linear_attn_config`'s
  1-indexed `full_attn_layers` / `kda_layers`;
- the KDA heads: llama.cpp runs `attention.head_count` of them (it keeps no count of its own:
  `linear_attn_config.num_heads` must equal `num_attention_heads`), each `kda.head_dim` wide
  (older files: `ssm.state_size`), the conv `ssm.conv_kernel` wide;
- the KDA tensors: q/k/v as `attn_q`/`attn_k`/`attn_v`, their convs `ssm_conv1d_{q,k,v}`
  reshaped [1, C, 1, K] (read back as [C, 1, K]), A as -exp(A_log) (`ssm_a`, no suffix),
  dt_bias as `ssm_dt.bias`, f_a/f_b/g_a/g_b/b projections as `ssm_f_a`/`ssm_f_b`/`ssm_g_a`/
  `ssm_g_b`/`ssm_beta`, the gated norm `ssm_norm`;
- the latent attention as `deepseek2`'s (`gguf_deepseek`): `kv_b_proj` split into `attn_k_b`
  (transposed) and `attn_v_b` (`deepseek.kv_b_weight` joins them), the model's own head sizes
  in `key_length_mla` / `value_length_mla`, its shared key part `rope.dimension_count` wide
  (used unrotated: no rotary, as in transformers and llama.cpp);
- the experts stacked, the correction bias `exp_probs_b`, `leading_dense_block_count` dense
  layers first, `expert_weights_scale` the routed scaling; llama.cpp renormalises the top-k
  (no key for it: moe_renormalize) and runs no expert groups (one group).
Refused in one line: another variant's tensors or keys (Kimi K3's, which the converter
writes under the same name), a key it reads missing, a layer-kind list of the wrong length, no experts, a router other than
the sigmoid (`expert_gating_func` 2), the correction bias missing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from pagoda.runtime.model import gguf_deepseek

ENGINE_ARCH = {"kimi-linear": "kimi_linear"}
HF_ARCH = {"kimi_linear": "KimiLinearForCausalLM"}
ARCHS = tuple(HF_ARCH)  # the engine's
# llama.cpp's KDA tensors (`blk.N.<part>.<kind>`) -> the checkpoint's (under self_attn.)
KDA = {"ssm_conv1d_q": "q_conv1d", "ssm_conv1d_k": "k_conv1d", "ssm_conv1d_v": "v_conv1d",
       "ssm_f_a": "f_a_proj", "ssm_f_b": "f_b_proj", "ssm_g_a": "g_a_proj",
       "ssm_g_b": "g_b_proj", "ssm_beta": "b_proj", "ssm_norm": "o_norm",
       "attn_k": "k_proj", "attn_v": "v_proj"}  # fmt: skip
_BARE = re.compile(r"^blk\.(\d+)\.ssm_a$")  # A (as -exp(A_log)), no suffix
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
SIGMOID = 2  # llama.cpp's expert_gating_func
# the keys read without a default (the KDA head size: `kda.head_dim` or `ssm.state_size`)
_REQUIRED = ("block_count", "attention.head_count", "embedding_length", "feed_forward_length",
             "ssm.conv_kernel", "rope.dimension_count", "attention.key_length_mla",
             "attention.value_length_mla", "attention.kv_lora_rank", "expert_used_count",
             "expert_feed_forward_length")  # fmt: skip
Get = Callable[..., Any]  # get(key, default): the file's `kimi-linear.<key>`


def hf_name(layer: str, part: str, kind: str) -> str | None:
    """The checkpoint's name of `blk.{layer}.{part}.{kind}` (None: not read)."""
    if part == "ssm_dt":  # dt_bias (the converter's `dt_proj.bias`)
        return f"model.layers.{layer}.self_attn.dt_bias"
    if part in KDA:
        return f"model.layers.{layer}.self_attn.{KDA[part]}.{kind}"
    return gguf_deepseek.hf_name(layer, part, kind)


def bare_name(name: str, architecture: str) -> str | None:
    """The checkpoint's name of `blk.N.ssm_a` (None for another tensor or family)."""
    m = _BARE.match(name)
    return f"model.layers.{m[1]}.self_attn.A_log" if m and architecture in ARCHS else None


def value(name: str, w: torch.Tensor) -> torch.Tensor:
    """A tensor as the checkpoint holds it, from the file's form (module docstring)."""
    if name.endswith(".self_attn.A_log"):  # -exp(A_log) -> A_log [1, 1, H, 1]
        return torch.log(-w.flatten()).view(1, 1, -1, 1)
    if name.endswith(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")):
        return w.reshape(w.shape[-3] if w.dim() == 4 else w.shape[0], 1, w.shape[-1])
    if name.endswith(".self_attn.dt_bias"):
        return w.flatten()
    return w


def _known(name: str) -> bool:
    """Whether a `blk.` tensor is one this reading places (another is another variant's)."""
    m = _BLOCK.match(name)
    return bool(_BARE.match(name)) or (m is not None and hf_name(*m.groups()) is not None)


def hf_config(get: Get, tensors: set[str], vocab: int) -> dict[str, Any]:
    """The config.json of the checkpoint a `kimi-linear` file was converted from, as far as
    the engine reads it (module docstring)."""
    unknown = sorted(t for t in tensors if t.startswith("blk.") and not _known(t))
    if unknown or get("kda.gate_lower_bound") is not None or get("moe_latent_size"):
        what = f"tensors it does not read ({', '.join(unknown[:3])})" if unknown else "keys"
        raise ValueError(f"GGUF kimi-linear with {what} of another variant (Kimi K3's latent "
                         "experts, a bounded KDA gate) is not supported")  # fmt: skip
    missing = [k for k in _REQUIRED if get(k) is None]
    if get("kda.head_dim") is None and get("ssm.state_size") is None:
        missing.append("kda.head_dim")
    if missing:
        raise ValueError(f"GGUF kimi-linear needs {', '.join(missing)}")
    n, heads = int(get("block_count")), int(get("attention.head_count"))
    kv = get("attention.head_count_kv")
    if not isinstance(kv, list) or len(kv) != n:
        raise ValueError(f"GGUF kimi-linear needs attention.head_count_kv with a value for each "
                         f"of its {n} layers (0 on the KDA layers)")  # fmt: skip
    experts = int(get("expert_count", 0) or 0)
    if not experts:
        raise ValueError("GGUF kimi-linear needs expert_count (its MoE layers)")
    gating = get("expert_gating_func")
    if gating is not None and int(gating) != SIGMOID:
        raise ValueError(f"GGUF kimi-linear with expert_gating_func {gating} is not supported "
                         "(its router is a sigmoid: 2)")  # fmt: skip
    dense = int(get("leading_dense_block_count", 0) or 0)
    if any(f"blk.{i}.exp_probs_b.bias" not in tensors for i in range(dense, n)):
        raise ValueError("GGUF kimi-linear needs exp_probs_b (the router's "
                         "e_score_correction_bias) in every MoE layer")  # fmt: skip
    rope = int(get("rope.dimension_count"))
    qk = int(get("attention.key_length_mla"))
    q_lora = int(get("attention.q_lora_rank", 0) or 0)
    kda_dim = get("kda.head_dim") or get("ssm.state_size")
    linear = {"full_attn_layers": [i + 1 for i in range(n) if kv[i]],
              "kda_layers": [i + 1 for i in range(n) if not kv[i]], "num_heads": heads,
              "head_dim": int(kda_dim), "short_conv_kernel_size": int(get("ssm.conv_kernel"))}  # fmt: skip
    return {
        "architectures": [HF_ARCH["kimi_linear"]], "model_type": "kimi_linear",
        "vocab_size": vocab, "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": n,
        "num_attention_heads": heads, "num_key_value_heads": heads,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(get("context_length", 1048576)), "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors, "linear_attn_config": linear,
        "q_lora_rank": q_lora or None, "kv_lora_rank": int(get("attention.kv_lora_rank")),
        "qk_nope_head_dim": qk - rope, "qk_rope_head_dim": rope,
        "v_head_dim": int(get("attention.value_length_mla")),
        "num_experts": experts, "num_experts_per_token": int(get("expert_used_count")),
        "moe_intermediate_size": int(get("expert_feed_forward_length")),
        "num_shared_experts": int(get("expert_shared_count", 0) or 0),
        "first_k_dense_replace": dense, "moe_renormalize": True, "num_expert_group": 1,
        "topk_group": 1, "routed_scaling_factor": float(get("expert_weights_scale", 1.0) or 1.0),
        "moe_router_activation_func": "sigmoid",
    }  # fmt: skip
