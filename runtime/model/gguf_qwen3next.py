"""GGUFs of Qwen3-Next (`qwen3next`), Qwen3.5 (`qwen35`) and Qwen3.5-MoE (`qwen35moe`) as
llama.cpp's converter writes them (its Qwen3NextModel and the Qwen3.5 classes above it), read
as `gguf_classic` reads its families: the checkpoint's config.json rebuilt from the file's keys
(`hf_config`), the tensors under the names `model/qwen3_next.py` reads, in the checkpoint's
forms (`value`).

What the converter changed, undone here:
- the layers: Gated DeltaNet where (i + 1) % `full_attention_interval` is not 0, else gated
  attention (llama.cpp's rule; the file keeps no per-layer kinds); the DeltaNet's sizes from
  `ssm.*` (`group_count`: key heads, `time_step_rank`: value heads, `state_size`: a key head's
  width, `inner_size` over the value heads: a value head's); the rotating dims
  `rope.dimension_count` of `attention.key_length`; the multi-token-prediction blocks after
  the decoder's (`nextn_predict_layers`) not counted.
- every RMSNorm weight but the DeltaNet's gated norm stored as 1 + w (read back as w: the
  model adds the 1, as transformers' Qwen3NextRMSNorm does);
- A as -exp(A_log) (`ssm_a`, no suffix), dt_bias as `ssm_dt.bias`, the conv squeezed [C, K];
- Qwen3-Next's `in_proj_qkvz` (q, k, v, z by key head) written as `attn_qkv` (every q head,
  then k, then v: Qwen3.5's `in_proj_qkv`) and `attn_gate` (z: its `in_proj_z`);
  `in_proj_ba` as stored (`ssm_ba`); Qwen3.5's projections as they are (`ssm_beta`,
  `ssm_alpha`: in_proj_b, in_proj_a);
- Qwen3.5 with fewer key heads than value heads: the value heads reordered from grouped by key
  head to tiled (the converter's `_reorder_v_heads`) in v, z, b, a, A, dt_bias, the conv's v
  channels and out_proj's columns: put back (`_untile`); those tensors read dequantized (not as
  `qgemm` blocks);
- the experts stacked (`ffn_*_exps`; gate and up fused in `ffn_gate_up_exps` with
  `--fuse-gate-up-exps`: read as the published Qwen3.5-MoE's `experts.gate_up_proj`), the shared expert (`ffn_*_shexp`) and its gate
  (`ffn_gate_inp_shexp`): `gguf_loader`'s Qwen-MoE names; llama.cpp renormalises the top-k
  weights (no key for it) and runs experts in every layer.
The attention's q rows hold each head's q and output gate, as the checkpoint's `q_proj`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

# llama.cpp's architecture -> the engine's; the engine's -> its checkpoint's `architectures`
ENGINE_ARCH = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}
HF_ARCH = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM",
           "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}  # fmt: skip
ARCHS = tuple(HF_ARCH)  # the engine's
# llama.cpp's per-layer names -> the engine's, where they differ from Llama's
NAMES = {"attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
         "ssm_ba": "linear_attn.in_proj_ba", "ssm_beta": "linear_attn.in_proj_b",
         "ssm_alpha": "linear_attn.in_proj_a", "ssm_conv1d": "linear_attn.conv1d",
         "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj",
         "post_attention_norm": "post_attention_layernorm"}  # fmt: skip
_BARE = re.compile(r"^blk\.(\d+)\.ssm_a$")  # A (as -exp(A_log)), no suffix
Get = Callable[..., Any]  # get(key, default): the file's `<arch>.<key>`


def hf_name(layer: str, part: str, kind: str) -> str | None:
    """The engine's name of `blk.{layer}.{part}.{kind}` where it differs from Llama's."""
    if part == "ssm_dt":  # dt_bias (the converter's `dt_proj.bias`)
        return f"model.layers.{layer}.linear_attn.dt_bias"
    if part == "ffn_gate_up_exps":  # (`--fuse-gate-up-exps`: [E, 2N, hidden], gate first)
        return f"model.layers.{layer}.mlp.experts.gate_up_proj.{kind}"
    name = NAMES.get(part)
    return None if name is None else f"model.layers.{layer}.{name}.{kind}"


def bare_name(name: str, architecture: str) -> str | None:
    """The engine's name of `blk.N.ssm_a` (None for another tensor or family)."""
    m = _BARE.match(name)
    return f"model.layers.{m[1]}.linear_attn.A_log" if m and architecture in ARCHS else None


def hf_config(get: Get, gguf_arch: str, tensors: set[str], vocab: int) -> dict[str, Any]:
    """The config.json of the checkpoint a `qwen3next`/`qwen35`/`qwen35moe` file was converted
    from, as far as the engine reads it (module docstring)."""
    arch = ENGINE_ARCH[gguf_arch]
    keys = ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")
    ssm = {k: get(f"ssm.{k}") for k in keys}
    missing = [f"ssm.{k}" for k, v in ssm.items() if not v]
    if missing:
        raise ValueError(f"GGUF {gguf_arch} needs {', '.join(missing)}")
    k_heads, v_heads, inner = (int(ssm[k]) for k in ("group_count", "time_step_rank", "inner_size"))
    if inner % v_heads or v_heads % k_heads:
        raise ValueError(f"GGUF {gguf_arch} ssm.inner_size {inner} / ssm.time_step_rank "
                         f"{v_heads} / ssm.group_count {k_heads} do not divide")  # fmt: skip
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    layers = int(get("block_count")) - int(get("nextn_predict_layers", 0) or 0)
    interval = int(get("full_attention_interval", 4) or 4)
    head_dim = int(get("attention.key_length", 0) or 0) or hidden // heads
    rotated = int(get("rope.dimension_count", head_dim // 4) or head_dim // 4)
    cfg: dict[str, Any] = {
        "architectures": [HF_ARCH[arch]], "vocab_size": vocab, "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)), "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(get("context_length", 2048)), "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors, "attention_bias": False,
        "full_attention_interval": interval,
        "layer_types": ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                        for i in range(layers)],
        "linear_conv_kernel_dim": int(ssm["conv_kernel"]),
        "linear_key_head_dim": int(ssm["state_size"]), "linear_value_head_dim": inner // v_heads,
        "linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads,
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(get("rope.freq_base", 10000.0)),
                            "partial_rotary_factor": rotated / head_dim},
    }  # fmt: skip
    if get("feed_forward_length"):
        cfg["intermediate_size"] = int(get("feed_forward_length"))
    if get("expert_count"):
        cfg.update(num_experts=int(get("expert_count")),
                   num_experts_per_tok=int(get("expert_used_count")),
                   moe_intermediate_size=int(get("expert_feed_forward_length")),
                   shared_expert_intermediate_size=int(
                       get("expert_shared_feed_forward_length", 0) or 0),
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])  # fmt: skip
    return cfg


def reordered(name: str, config) -> bool:
    """Whether the converter reordered this tensor's value heads (Qwen3.5's, fewer key heads
    than value heads): read dequantized, put back by `value`."""
    m = config.family.mamba
    if config.architecture == "qwen3_next" or m is None or m.n_groups == m.n_heads:
        return False
    return ".linear_attn." in name and not name.endswith("linear_attn.norm.weight")


def value(name: str, w: torch.Tensor, config) -> torch.Tensor:
    """A tensor as the checkpoint holds it, from the file's form (module docstring)."""
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return w - 1
    if name.endswith("linear_attn.A_log"):
        w = torch.log(-w.flatten())
    if name.endswith("linear_attn.conv1d.weight") and w.dim() == 2:
        w = w[:, None, :]
    if not reordered(name, config):
        return w
    m = config.family.mamba
    k, r, dv = m.n_groups, m.n_heads // m.n_groups, m.head_dim
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        qk = 2 * k * m.d_state
        return torch.cat([w[:qk], _untile(w[qk:], 0, k, r, dv)])
    if name.endswith("in_proj_z.weight"):
        return _untile(w, 0, k, r, dv)
    if name.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
        return _untile(w, 0, k, r, 1)
    if name.endswith("out_proj.weight"):
        return _untile(w, 1, k, r, dv)
    return w


def _untile(t: torch.Tensor, dim: int, k: int, r: int, d: int) -> torch.Tensor:
    """The inverse of the converter's `_reorder_v_heads` along `dim`: heads in tiled order
    (each key head's j-th value head in turn) back to grouped by key head."""
    shape = list(t.shape)
    tiled = t.reshape(*shape[:dim], r, k, d, *shape[dim + 1 :])
    return tiled.transpose(dim, dim + 1).reshape(shape)
