"""GGUFs of the families llama.cpp's converter writes with classes of their own that the engine
runs from a config.json alone (`gemma`: Gemma 1, `phi2`, `stablelm`, `gpt2`, `starcoder`:
GPTBigCode, `gptneox`, `falcon`, `bloom`, `mpt`, `olmo`, `exaone`: EXAONE 3, `nemotron`,
`jais2`, `minicpm3`, `hunyuan-dense`, `hunyuan-moe`, `lfm2`, `lfm2moe`, `ernie4_5-moe`,
`dots1`, `exaone-moe`, `mamba`: Mamba-1 and Falcon-Mamba, `mamba2`; `jamba`: its keys and
names in `gguf_jamba`; `minimax-m2`: its experts' keys in `gguf_minimax_m2`; `qwen3next`,
`qwen35`, `qwen35moe`: their keys, names and forms in `gguf_qwen3next`; `gemma4`: in
`gguf_gemma4`; `kimi-linear`: in `gguf_kimi`; `mimo2`: in `gguf_mimo`), read by writing the
config.json the family's checkpoint would have from the file's keys (`hf_config`) and reading
it as the safetensors loader does (`hf_loader.model_config`): the engine builds the model it
builds from the checkpoint, its tensors under the names that loader gives them (`hf_name`).

What the converter changed, undone here:
- Gemma: its norms stored as 1 + w (`FamilyConfig.norms_hold_one_plus_w`); no rope base
  written (llama.cpp's 10000); the lm_head never written (tied).
- GPT-2: its Conv1D matrices transposed to [out, in] by the converter: read as they are;
  `c_attn` as `attn_qkv` (q, k and v rows in turn, read apart).
- GPT-NeoX and BLOOM: `query_key_value`'s per-head q/k/v rows regrouped as every q head, every
  k head, every v head; Falcon's ("jploski" layout, `tensor_data_layout`) likewise, by KV group:
  all are read as q, k and v row blocks (`fused_parts`).
- StableLM 2 12B: the per-head q/k LayerNorm weights stacked [heads, head_dim] as
  `attn_q_norm`/`attn_k_norm`: each row read as its head's norm.
- MPT: `attention.clamp_kqv` its clip_qkv, `attention.max_alibi_bias` its ALiBi bias max (0:
  without ALiBi, refused as the safetensors loader refuses it).
- OLMo: Q/K permuted as Llama's (`PERMUTED`: un-permuted by the loader); `clamp_kqv`.
- Nemotron: its LayerNorm1P weights stored as 1 + w (`value`: read back as w); the rotating
  dims of hidden / heads, as the converter counts them.
- EXAONE 3: llama3's rotary as `rope_freqs` (read over the config's by `gguf_config`).
- MiniCPM3: DeepSeek's latent attention names; longrope's factors as `rope_factors_long` /
  `rope_factors_short` (the original context the file's own unless it says); its muP scales
  (12, 1.4, 256) llama.cpp's constants.
- LFM2 / LFM2-MoE: the layer kinds from the per-layer `attention.head_count_kv` (0: a short
  conv), the conv's weight squeezed to [C, K] (read back as [C, 1, K]), the MLP's width as the
  converter adjusted it, the final norm named `token_embd_norm`; LFM2-MoE's experts stacked,
  its `expert_bias` as `exp_probs_b`, llama.cpp's renormalised top-k (no key for it).
- ERNIE 4.5 MoE, Hunyuan-A13B, dots.llm1 and EXAONE MoE: the experts stacked [E, N, K] (`moe._ExpertTensors` slices
  them), the router, shared experts and correction bias (`exp_probs_b`, the converter's
  rename of `e_score_correction_bias`) where `moe_names` puts them; ERNIE's MoE layers from
  `leading_dense_block_count` and `interleave_moe_layer_step`; dots.llm1's sigmoid router with
  its groups, scale and norm from the `expert_*` keys, no window (llama.cpp runs none); EXAONE
  MoE's the same, its window layers by `attention.sliding_window_pattern` (the global ones
  NoPE), its MTP blocks after the decoder's not counted (`nextn_predict_layers`).
- Mamba-1, Falcon-Mamba (`ssm.dt_b_c_rms`) and Mamba2: the `ssm.*` sizes (Mamba2's heads its
  `time_step_rank`), A stored as -exp(A_log) (Mamba2's A and D [heads, 1], its norm by group),
  the conv squeezed, Mamba2's dt_bias as `ssm_dt.bias`: read back by `gguf_mamba.mamba_value`;
  no time-step limit nor scan chunk in the file (llama.cpp has neither: transformers' defaults);
  Falcon-Mamba's mixer eps transformers' default (1e-6: llama.cpp uses the layers' eps).
- Jamba (`gguf_jamba`): its layer kinds read back as offsets and periods; its mixer as
  Mamba-1's above (`SSM`), with its dt/B/C norms; the experts stacked.
- MiniMax-M2 (`gguf_minimax_m2`): the experts stacked, the correction bias as `exp_probs_b`,
  the rotating dims as `rope.dimension_count` (its `rotary_dim`); a sigmoid router renormalised.
- Hunyuan: the NTK alpha baked into `rope.freq_base` (read as the plain base); q/k norms
  as its `query_layernorm`/`key_layernorm`.

llama.cpp keeps no key for a family's activation where transformers' configs differ: GPT-NeoX
and Falcon run exact GELU here (Pythia's and falcon's `hidden_act`), GPT-2 and Phi-2 the tanh
form, as their configs say. Falcon's layer: two norms (`attn_norm_2`: new_decoder_architecture),
else one, in parallel (llama.cpp runs no sequential Falcon). StableLM and GPT-NeoX: parallel or
sequential: GPT-NeoX by `use_parallel_residual`, StableLM by whether `ffn_norm` is there
(llama.cpp's test).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pagoda.runtime.model import (
    gguf_gemma4,
    gguf_jamba,
    gguf_kimi,
    gguf_mimo,
    gguf_minimax_m2,
    gguf_qwen3next,
)

# llama.cpp's architecture -> (the engine's, the checkpoint's config.json `architectures`)
ENGINE_ARCH = {"gemma": "gemma", "phi2": "phi", "stablelm": "stablelm", "gpt2": "gpt2",
               "starcoder": "gpt_bigcode", "gptneox": "gpt_neox", "falcon": "falcon",
               "bloom": "bloom", "mpt": "mpt", "olmo": "olmo", "exaone": "exaone",
               "nemotron": "nemotron", "jais2": "jais2", "minicpm3": "minicpm3",
               "hunyuan-dense": "hunyuan_v1_dense", "lfm2": "lfm2", "lfm2moe": "lfm2_moe",
               "ernie4_5-moe": "ernie4_5_moe", "hunyuan-moe": "hunyuan_v1_moe",
               "dots1": "dots1", "mamba": "mamba", "mamba2": "mamba2", "exaone-moe": "exaone_moe",
               **gguf_jamba.ENGINE_ARCH, **gguf_minimax_m2.ENGINE_ARCH,
               **gguf_qwen3next.ENGINE_ARCH, **gguf_gemma4.ENGINE_ARCH,
               **gguf_kimi.ENGINE_ARCH, **gguf_mimo.ENGINE_ARCH}  # fmt: skip
HF_ARCH = {"gemma": "GemmaForCausalLM", "phi": "PhiForCausalLM",
           "stablelm": "StableLmForCausalLM", "gpt2": "GPT2LMHeadModel",
           "gpt_bigcode": "GPTBigCodeForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
           "falcon": "FalconForCausalLM", "bloom": "BloomForCausalLM", "mpt": "MptForCausalLM",
           "olmo": "OlmoForCausalLM", "exaone": "ExaoneForCausalLM",
           "nemotron": "NemotronForCausalLM", "jais2": "Jais2ForCausalLM",
           "minicpm3": "MiniCPM3ForCausalLM", "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
           "lfm2": "Lfm2ForCausalLM", "lfm2_moe": "Lfm2MoeForCausalLM",
           "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
           "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM", "dots1": "Dots1ForCausalLM",
           "mamba": "MambaForCausalLM", "falcon_mamba": "FalconMambaForCausalLM",
           "mamba2": "Mamba2ForCausalLM", "exaone_moe": "ExaoneMoeForCausalLM",
           **gguf_jamba.HF_ARCH, **gguf_minimax_m2.HF_ARCH, **gguf_qwen3next.HF_ARCH,
           **gguf_gemma4.HF_ARCH, **gguf_kimi.HF_ARCH, **gguf_mimo.HF_ARCH}  # fmt: skip
ARCHS = tuple(HF_ARCH)  # the engine's
PERMUTED = ("olmo",)  # the files' whose Q/K rows the converter permutes (LlamaModel's permute)
# the activations llama.cpp hard-codes, as the families' configs name them (no GGUF key)
ACTIVATIONS = {"gemma": "gelu_pytorch_tanh", "phi": "gelu_new", "stablelm": "silu",
               "gpt2": "gelu_new", "gpt_bigcode": "gelu_pytorch_tanh", "gpt_neox": "gelu",
               "falcon": "gelu", "bloom": "gelu_pytorch_tanh", "mpt": "gelu", "olmo": "silu",
               "exaone": "silu", "nemotron": "relu2", "jais2": "relu2", "minicpm3": "silu",
               "hunyuan_v1_dense": "silu", "lfm2": "silu", "lfm2_moe": "silu",
               "ernie4_5_moe": "silu", "hunyuan_v1_moe": "silu", "dots1": "silu", "mamba": "silu",
               "falcon_mamba": "silu", "mamba2": "silu", "exaone_moe": "silu", "jamba": "silu",
               "minimax_m2": "silu",
               **dict.fromkeys(gguf_qwen3next.ARCHS, "silu"),
               **dict.fromkeys(gguf_gemma4.ARCHS, gguf_gemma4.ACTIVATION),
               **dict.fromkeys(gguf_kimi.ARCHS + gguf_mimo.ARCHS, "silu")}  # fmt: skip
# the Mamba mixers' tensors (Mamba-1's and Mamba2's; A and D: `gguf_mamba.suffixless_name`)
SSM = {"ssm_in": "mamba.in_proj", "ssm_out": "mamba.out_proj", "ssm_conv1d": "mamba.conv1d",
       "ssm_x": "mamba.x_proj", "ssm_dt": "mamba.dt_proj", "ssm_norm": "mamba.norm"}  # fmt: skip
# the mixture-of-experts families whose tensors `moe_names` places
MOE = ("ernie4_5_moe", "hunyuan_v1_moe", "dots1", "exaone_moe", "jamba", "minimax_m2",
       *gguf_mimo.ARCHS)  # fmt: skip
_PARTS = ("gate", "up", "down")
# families whose config.json names the head size (the file's key_length)
_HEAD_DIM = ("gemma", "exaone", "nemotron", "jais2", "hunyuan_v1_dense", "hunyuan_v1_moe",
             "ernie4_5_moe", "dots1", "exaone_moe", "minimax_m2")  # fmt: skip
# families whose config.json says attention_bias / mlp_bias
_BIAS_KEYS = ("gpt_neox", "olmo", "exaone", "nemotron", "jais2", "minicpm3", "hunyuan_v1_dense",
              "hunyuan_v1_moe", "dots1")  # fmt: skip
# DeepSeek-style latent attention's tensors (MiniCPM3's), by llama.cpp's names
_MLA = {"attn_q_a": "q_a_proj", "attn_q_a_norm": "q_a_layernorm", "attn_q_b": "q_b_proj",
        "attn_kv_a_mqa": "kv_a_proj_with_mqa", "attn_kv_a_norm": "kv_a_layernorm",
        "attn_kv_b": "kv_b_proj"}  # fmt: skip
# the file's global tensors -> the engine's names, where they differ from Llama's
GLOBALS = {"position_embd.weight": "model.embed_positions.weight",
           "token_embd_norm.weight": "model.embed_layernorm.weight",
           "token_embd_norm.bias": "model.embed_layernorm.bias",
           "output.bias": "lm_head.bias"}  # fmt: skip
PHI_GLOBALS = {"output_norm.weight": "model.final_layernorm.weight",
               "output_norm.bias": "model.final_layernorm.bias"}  # fmt: skip
# the per-layer names, where they differ from Llama's (`gguf_loader._LAYER_NAMES`)
NAMES = {"attn_qkv": "self_attn.qkv_proj", "attn_norm_2": "ln_attn"}
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # attn_qkv's row blocks
# LFM2's: its short conv's tensors, its MLP (w1 gate, w3 up, w2 down) and experts, the final
# norm the converter names `token_embd_norm` (the checkpoint's `embedding_norm`)
LFM2 = {"ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
        "ffn_gate_inp": "feed_forward.gate", "ffn_gate_exps": "feed_forward.experts.w1",
        "ffn_up_exps": "feed_forward.experts.w3", "ffn_down_exps": "feed_forward.experts.w2"}  # fmt: skip
_SHORTCONV = re.compile(r"^blk\.(\d+)\.shortconv\.(in_proj|conv|out_proj)\.(weight|bias)$")
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
Get = Callable[..., Any]  # get(key, default): the file's `<arch>.<key>`


def engine_arch(gguf_arch: str, get: Get) -> str:
    """The engine's architecture of a file of `gguf_arch`: Mamba-1 with norms on B, C and dt
    (`ssm.dt_b_c_rms`) is Falcon-Mamba."""
    if gguf_arch == "mamba" and get("ssm.dt_b_c_rms"):
        return "falcon_mamba"
    return ENGINE_ARCH[gguf_arch]


def global_name(name: str, architecture: str) -> str | None:
    """The engine's name of a global tensor of these families, or of LFM2's short conv's
    (None: Llama's name, or `hf_name`'s, holds)."""
    if architecture == "phi" and name in PHI_GLOBALS:
        return PHI_GLOBALS[name]
    if architecture in gguf_jamba.ARCHS and gguf_jamba.global_name(name):
        return gguf_jamba.global_name(name)
    if architecture in ("lfm2", "lfm2_moe"):
        if name == "token_embd_norm.weight":
            return "model.norm.weight"
        m = _SHORTCONV.match(name)
        return f"model.layers.{m[1]}.conv.{m[2]}.{m[3]}" if m else None
    return GLOBALS.get(name)


def hf_name(layer: str, part: str, kind: str, architecture: str) -> str | None:
    """The engine's name of `blk.{layer}.{part}.{kind}` where it differs from Llama's."""
    if architecture in gguf_qwen3next.ARCHS:
        return gguf_qwen3next.hf_name(layer, part, kind)
    if architecture in gguf_kimi.ARCHS:
        return gguf_kimi.hf_name(layer, part, kind)
    if architecture in gguf_mimo.ARCHS and part == "attn_sinks":
        return gguf_mimo.hf_name(layer, part, kind)
    if architecture == "stablelm" and part in ("attn_q_norm", "attn_k_norm"):
        return f"model.layers.{layer}.self_attn.{part[5]}_layernorm.{kind}"  # (read by row)
    if architecture in gguf_jamba.ARCHS and part in gguf_jamba.NAMES:
        return gguf_jamba.hf_name(layer, part, kind)
    if architecture in ("mamba", "falcon_mamba", "mamba2", "jamba") and part in SSM:
        if architecture == "mamba2" and part == "ssm_dt":  # its dt bias alone, no suffix
            return f"model.layers.{layer}.mamba.dt_bias"
        return f"model.layers.{layer}.{SSM[part]}.{kind}"
    if architecture in MOE:
        own = _moe_name(layer, part, kind, architecture)
        if own is not None:
            return own
    if architecture.startswith("hunyuan") and part in ("attn_q_norm", "attn_k_norm"):
        which = "query" if part == "attn_q_norm" else "key"
        return f"model.layers.{layer}.self_attn.{which}_layernorm.{kind}"
    if architecture == "minicpm3" and part in _MLA:
        return f"model.layers.{layer}.self_attn.{_MLA[part]}.{kind}"
    if architecture in ("lfm2", "lfm2_moe"):
        if part == "exp_probs_b":  # its choice-only bias (`expert_bias`, no suffix)
            return f"model.layers.{layer}.feed_forward.expert_bias"
        if part in LFM2:
            return f"model.layers.{layer}.{LFM2[part]}.{kind}"
    name = NAMES.get(part)
    return None if name is None else f"model.layers.{layer}.{name}.{kind}"


def falcon_norms(tensors: dict, architecture: str) -> dict:
    """Falcon-40B's two norms by the engine's names: llama.cpp's `attn_norm` is its `ln_mlp`
    (the MLP's input: post_attention_layernorm), `attn_norm_2` its `ln_attn` (attention's:
    input_layernorm); one norm (falcon-7b): `attn_norm` is input_layernorm, as named."""
    if architecture != "falcon" or not any(".ln_attn." in n for n in tensors):
        return tensors
    out = {}
    for name, t in tensors.items():
        name = name.replace(".input_layernorm.", ".post_attention_layernorm.")
        out[name.replace(".ln_attn.", ".input_layernorm.")] = t
    return out


def _moe_name(layer: str, part: str, kind: str, architecture: str) -> str | None:
    """The engine's name of an expert block's tensor (`moe_names`' table): the router, the
    stacked experts [E, N, K] (`moe._ExpertTensors` slices them), the shared expert, the
    correction bias (no suffix)."""
    from pagoda.runtime.model import moe_names

    n = moe_names.of(architecture)
    p = f"model.layers.{layer}.{n.block}"
    if part == "ffn_gate_inp":
        return p + n.router
    if part == "exp_probs_b":
        return p + n.bias
    for i, which in enumerate(_PARTS):
        if part == f"ffn_{which}_exps":
            return f"{p}experts.{n.experts[i]}.{kind}"
        if part == f"ffn_{which}_shexp":
            return f"{p}{n.shared}{which}_proj.{kind}"
    return None


def fused_parts(name: str, shape: tuple[int, ...], config) -> list[tuple[str, int, int]]:
    """(engine name, first row, row after) of each part of a stored tensor these families read
    apart: `attn_qkv` as q, k and v rows (the converter's order: every q head, then k, then v);
    StableLM's stacked q/k norms as one row a head. [] for any other tensor."""
    m = _BLOCK.match(name)
    if (config.architecture not in ARCHS or config.architecture in gguf_qwen3next.ARCHS
            or config.architecture in gguf_gemma4.ARCHS or not m):  # fmt: skip
        return []  # (Qwen3-Next's attn_qkv: its DeltaNet's, read whole)
    layer, part, kind = m.groups()
    prefix = f"model.layers.{layer}."
    if part == "attn_qkv":
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        if q + 2 * kv != shape[0]:
            raise ValueError(f"GGUF {name} has {shape[0]} rows; q, k and v need {q + 2 * kv}")
        edges = (0, q, q + kv, q + 2 * kv)
        return [(f"{prefix}{p}.{kind}", a, b) for p, a, b in zip(QKV, edges, edges[1:])]
    if config.architecture == "stablelm" and part in ("attn_q_norm", "attn_k_norm"):
        which = f"{prefix}self_attn.{part[5]}_layernorm.norms"
        return [(f"{which}.{h}.{kind}", h, h + 1) for h in range(shape[0])]
    return []


def value(name: str, w, architecture: str):
    """A tensor as the checkpoint holds it, from the file's form: Nemotron's LayerNorm1P
    weights, which the converter stored as 1 + w; Kimi Linear's KDA tensors (`gguf_kimi`)."""
    if architecture in gguf_kimi.ARCHS:
        return gguf_kimi.value(name, w)
    if architecture == "nemotron" and name.endswith("norm.weight"):
        return w - 1
    if name.endswith(".conv.conv.weight") and w.dim() == 2:  # LFM2's, squeezed: [C, 1, K]
        return w[:, None, :]
    return w


def hf_config(get: Get, gguf_arch: str, tensors: set[str], vocab: int,
              values: Callable[[str], list[float]]) -> dict[str, Any]:  # fmt: skip
    """The config.json of the checkpoint a file of `gguf_arch` was converted from, as far as
    the engine reads it (`tensors`: the file's names; `vocab`: its vocabulary's size;
    `values(name)`: a tensor's values, MiniCPM3's rope factors)."""
    arch = engine_arch(gguf_arch, get)
    if arch in gguf_qwen3next.ARCHS:
        return gguf_qwen3next.hf_config(get, gguf_arch, tensors, vocab)
    if arch in gguf_gemma4.ARCHS:
        return gguf_gemma4.hf_config(get, tensors, vocab, values)
    if arch in gguf_kimi.ARCHS:
        return gguf_kimi.hf_config(get, tensors, vocab)
    if arch in gguf_mimo.ARCHS:
        return gguf_mimo.hf_config(get, tensors, vocab)
    if arch in ("mamba", "falcon_mamba", "mamba2"):
        return _ssm(get, arch, tensors, vocab)
    if arch in gguf_jamba.ARCHS:
        return gguf_jamba.hf_config(get, tensors, vocab)
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    per_layer = get("attention.head_count_kv")  # (LFM2's: a value a layer, 0 on its convs)
    kv = max(per_layer) if isinstance(per_layer, list) else per_layer
    kv = int(kv) if kv else heads
    head_dim = int(get("attention.key_length", 0) or 0) or hidden // heads
    eps = get("attention.layer_norm_epsilon")
    rms = get("attention.layer_norm_rms_epsilon", eps)
    cfg: dict[str, Any] = {
        "architectures": [HF_ARCH[arch]], "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        # (less the multi-token-prediction blocks after the decoder's: EXAONE MoE's)
        "num_hidden_layers": int(get("block_count")) - int(get("nextn_predict_layers", 0) or 0),
        "num_attention_heads": heads,
        "num_key_value_heads": kv, "max_position_embeddings": int(get("context_length", 2048)),
        "hidden_act": ACTIVATIONS[arch], "tie_word_embeddings": "output.weight" not in tensors,
        "layer_norm_eps": eps, "layer_norm_epsilon": eps, "norm_eps": eps, "rms_norm_eps": rms,
    }  # fmt: skip
    biased = "blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors
    if arch in _BIAS_KEYS:  # (the others' configs have no such keys)
        cfg.update(attention_bias=biased, mlp_bias="blk.0.ffn_up.bias" in tensors)
    if arch in _HEAD_DIM:
        cfg["head_dim"] = head_dim
    rotated = get("rope.dimension_count")
    rope = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))}
    if rotated is not None and int(rotated) != head_dim and arch != "minicpm3":  # (its latent
        # attention's rotating dims: `_minicpm3`)
        rope["partial_rotary_factor"] = int(rotated) / head_dim
    if arch not in ("gpt2", "gpt_bigcode", "bloom", "mpt"):  # rotary
        cfg["rope_parameters"] = rope
    if arch == "minicpm3":
        cfg.update(_minicpm3(get, tensors, values, rope))
    if arch in ("lfm2", "lfm2_moe"):
        cfg.update(_lfm2(get, tensors, per_layer, cfg["num_hidden_layers"]))
    if arch in MOE:
        cfg.update(_experts(get, arch, tensors))
    cfg.update(_family_keys(get, gguf_arch, arch, tensors, cfg))
    return cfg


def _family_keys(get: Get, gguf_arch: str, arch: str, tensors: set[str],
                 cfg: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """What a family's config.json says beyond the common keys."""
    biased = "blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors
    if arch == "olmo":  # (its LayerNorms have no weights; the file, no norm tensors)
        clip = get("attention.clamp_kqv")
        return {"clip_qkv": None if clip is None else float(clip)}
    if arch == "stablelm":
        return {"use_qkv_bias": biased, "qk_layernorm": "blk.0.attn_q_norm.weight" in tensors,
                # llama.cpp's test: no `ffn_norm` (StableLM 2 12B), not the key
                "use_parallel_residual": "blk.0.ffn_norm.weight" not in tensors}  # fmt: skip
    if arch == "gpt_neox":
        return {"use_parallel_residual": bool(get("use_parallel_residual", True))}
    if arch in ("gpt2", "gpt_bigcode"):
        out: dict[str, Any] = {"n_inner": cfg["intermediate_size"]}
        if arch == "gpt_bigcode":
            out["multi_query"] = cfg["num_key_value_heads"] == 1
        return out
    if arch == "falcon":
        two = "blk.0.attn_norm_2.weight" in tensors  # falcon-40b / 180b: ln_attn and ln_mlp
        kv = cfg["num_key_value_heads"]
        return {"new_decoder_architecture": two or 1 < kv < cfg["num_attention_heads"],
                "num_ln_in_parallel_attn": 2 if two else 1, "parallel_attn": True,
                "multi_query": kv == 1, "num_kv_heads": kv, "bias": biased,
                "ffn_hidden_size": cfg["intermediate_size"]}  # fmt: skip
    if arch == "mpt":
        clip, bias_max = get("attention.clamp_kqv"), get("attention.max_alibi_bias")
        attn = {"alibi": bias_max is None or float(bias_max) > 0,
                "alibi_bias_max": float(bias_max) if bias_max else 8.0,
                "clip_qkv": None if clip is None else float(clip)}  # fmt: skip
        return {"attn_config": attn, "no_bias": not biased,
                "expansion_ratio": cfg["intermediate_size"] / cfg["hidden_size"]}  # fmt: skip
    return {}


def _minicpm3(get: Get, tensors: set[str], values: Callable[[str], list[float]],
              rope: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """MiniCPM3's latent attention sizes (v: hidden / heads, as the converter leaves it) and its
    longrope from the `rope_factors_long`/`_short` tensors, past the file's context (llama.cpp's
    original context where the file has none); its muP scales are llama.cpp's constants, the
    published ones (`hf_tables.DEFAULTS`)."""
    rotated, qk = int(get("rope.dimension_count")), int(get("attention.key_length"))
    out: dict[str, Any] = {"kv_lora_rank": int(get("attention.kv_lora_rank")),
                           "q_lora_rank": get("attention.q_lora_rank"),
                           "qk_rope_head_dim": rotated, "qk_nope_head_dim": qk - rotated}  # fmt: skip
    if {"rope_factors_long.weight", "rope_factors_short.weight"} <= tensors:
        original = get("rope.scaling.original_context_length") or get("context_length")
        out["rope_parameters"] = {**rope, "rope_type": "longrope",
                                  "long_factor": values("rope_factors_long.weight"),
                                  "short_factor": values("rope_factors_short.weight"),
                                  "original_max_position_embeddings": int(original)}  # fmt: skip
    return out


def _lfm2(get: Get, tensors: set[str], per_layer, n: int) -> dict[str, Any]:
    """LFM2's layers (a conv where the per-layer `attention.head_count_kv` is 0), its conv
    width (`shortconv.l_cache`), its MLP width as the file has it (adjusted by the converter);
    LFM2-MoE's experts after `leading_dense_block_count` dense layers, sigmoid-routed with the
    choice-only bias (`exp_probs_b`), renormalised and scaled as llama.cpp runs them."""
    if not isinstance(per_layer, list) or len(per_layer) != n:
        raise ValueError(f"GGUF lfm2 needs attention.head_count_kv with a value for each of its "
                         f"{n} layers (0 on the conv layers)")  # fmt: skip
    out: dict[str, Any] = {
        "layer_types": ["full_attention" if k else "conv" for k in per_layer],
        "conv_L_cache": int(get("shortconv.l_cache")), "block_auto_adjust_ff_dim": False,
        "conv_bias": any(t.endswith("shortconv.in_proj.bias") for t in tensors),
    }  # fmt: skip
    if get("expert_count"):
        out.update(num_experts=int(get("expert_count")),
                   num_experts_per_tok=int(get("expert_used_count")),
                   moe_intermediate_size=int(get("expert_feed_forward_length")),
                   num_dense_layers=int(get("leading_dense_block_count", 0) or 0),
                   use_expert_bias=any(t.endswith(".exp_probs_b.bias") for t in tensors),
                   routed_scaling_factor=float(get("expert_weights_scale", 1.0) or 1.0),
                   norm_topk_prob=bool(get("expert_weights_norm", True)))  # fmt: skip
    return out


def _experts(get: Get, arch: str, tensors: set[str]) -> dict[str, Any]:
    """ERNIE 4.5 MoE's, Hunyuan-A13B's and dots.llm1's expert keys, as their config.json names
    them."""
    count, used = int(get("expert_count")), int(get("expert_used_count"))
    width, shared = int(get("expert_feed_forward_length")), int(get("expert_shared_count", 0) or 0)
    if arch == "ernie4_5_moe":  # experts from `leading_dense_block_count`, every `interleave`
        return {"moe_num_experts": count, "moe_k": used, "moe_intermediate_size": width,
                "moe_layer_interval": int(get("interleave_moe_layer_step", 1) or 1),
                "moe_layer_start_index": int(get("leading_dense_block_count", 0) or 0),
                "moe_layer_end_index": -1, "moe_num_shared_experts": shared,
                "use_bias": "blk.0.attn_q.bias" in tensors}  # fmt: skip
    if arch in gguf_minimax_m2.ARCHS:
        return gguf_minimax_m2.experts(get, count, used, width)
    if arch in ("dots1", "exaone_moe"):  # DeepSeek-V3's router: sigmoid, the correction bias
        gating = get("expert_gating_func")
        if gating is not None and int(gating) != 2:
            raise ValueError(f"GGUF {arch} with expert_gating_func {gating} is not supported "
                             "(its router is a sigmoid: 2)")  # fmt: skip
    if arch == "exaone_moe":  # EXAONE 4's window layers (the others global, NoPE)
        n = int(get("block_count")) - int(get("nextn_predict_layers", 0) or 0)
        window, pattern = get("attention.sliding_window"), get("attention.sliding_window_pattern")
        if not window or not isinstance(pattern, list) or len(pattern) < n:
            raise ValueError(f"GGUF exaone-moe needs attention.sliding_window and "
                             f"attention.sliding_window_pattern with a flag for each of its {n} "
                             "layers")  # fmt: skip
        return {"num_experts": count, "num_experts_per_tok": used, "moe_intermediate_size": width,
                "num_shared_experts": shared,
                "first_k_dense_replace": int(get("leading_dense_block_count", 0) or 0),
                "n_group": int(get("expert_group_count", 1) or 1),
                "topk_group": int(get("expert_group_used_count", 1) or 1),
                "routed_scaling_factor": float(get("expert_weights_scale", 1.0) or 1.0),
                "norm_topk_prob": bool(get("expert_weights_norm", False)),
                "sliding_window": int(window),
                "layer_types": ["sliding_attention" if f else "full_attention"
                                for f in pattern[:n]]}  # fmt: skip
    if arch == "dots1":
        return {"n_routed_experts": count, "num_experts_per_tok": used,
                "moe_intermediate_size": width, "n_shared_experts": shared,
                "first_k_dense_replace": int(get("leading_dense_block_count", 0) or 0),
                "n_group": int(get("expert_group_count", 1) or 1),
                "topk_group": int(get("expert_group_used_count", 1) or 1),
                "routed_scaling_factor": float(get("expert_weights_scale", 1.0) or 1.0),
                "norm_topk_prob": bool(get("expert_weights_norm", False)),
                "sliding_window": None}  # fmt: skip
    shexp = any(t.endswith("ffn_up_shexp.weight") for t in tensors)
    return {"num_experts": count, "moe_topk": used, "moe_intermediate_size": width,
            "num_shared_expert": shared, "use_mixed_mlp_moe": shexp,
            "intermediate_size": int(get("expert_shared_feed_forward_length", 0) or 0)
            or int(get("feed_forward_length")),
            "use_qk_norm": any(t.endswith("attn_q_norm.weight") for t in tensors)}  # fmt: skip


def _ssm(get: Get, arch: str, tensors: set[str], vocab: int) -> dict[str, Any]:
    """Mamba-1's, Falcon-Mamba's and Mamba2's config.json from the `ssm.*` keys (Mamba2's heads:
    `time_step_rank`; no time-step limit, as llama.cpp runs none); Falcon-Mamba's mixer eps
    transformers' default (the file has none: llama.cpp uses the layers')."""
    hidden, inner = int(get("embedding_length")), int(get("ssm.inner_size"))
    cfg: dict[str, Any] = {
        "architectures": [HF_ARCH[arch]], "vocab_size": vocab, "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")), "state_size": int(get("ssm.state_size")),
        "conv_kernel": int(get("ssm.conv_kernel")), "expand": inner // hidden,
        "layer_norm_epsilon": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "use_bias": "blk.0.ssm_in.bias" in tensors,
        "use_conv_bias": "blk.0.ssm_conv1d.bias" in tensors,
        "tie_word_embeddings": "output.weight" not in tensors, "hidden_act": "silu",
    }  # fmt: skip
    if arch == "mamba2":
        heads = int(get("ssm.time_step_rank"))
        cfg.update(num_heads=heads, head_dim=inner // heads,
                   n_groups=int(get("ssm.group_count", 1) or 1))  # fmt: skip
    else:
        cfg.update(intermediate_size=inner, time_step_rank=int(get("ssm.time_step_rank")))
    return cfg
