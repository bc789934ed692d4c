"""GGUFs of the families the engine runs from safetensors that llama.cpp's converter writes
under architectures of their own: `gpt-oss`, `phi3`, `exaone4`, `seed_oss`, `ernie4_5`,
`starcoder2`, `arcee`, `apertus`, `mistral3`, `glm4moe`, `llama4`, `granitehybrid`,
`nemotron_h`, `nemotron_h_moe` and `falcon-h1`, read into the names and
`FamilyConfig` fields of the models the safetensors loader builds (`gguf_loader` asks this
module where they differ from Llama's).

- gpt-oss: `attn_sinks` (a logit per head), the FFN's input norm as `post_attention_norm`, the
  router with its bias as `ffn_gate_inp`, the experts apart (`ffn_{gate,up,down}_exps`, each with
  a bias; newer converters may fuse gate and up as `ffn_gate_up_exps`: gate rows, then up) in
  MXFP4 (`gguf_dequant`), llama.cpp's fixed swiglu (alpha 1.702, limit 7) and window pattern
  (even layers slide), and gpt-oss's yarn, which does not truncate its correction range (the
  file cannot say so: its config does).
- phi3: q/k/v fused as `attn_qkv` and gate/up as `ffn_up` (row parts, read apart), a partial
  rotary as `rope.dimension_count`, `sliding_window` 0 for none, longrope as the
  `rope_factors_long`/`rope_factors_short` tensors with `rope.scaling.attn_factor` and
  `rope.scaling.original_context_length`.
- exaone4: OLMo 2's norms after (`post_attention_norm`, `post_ffw_norm`), q/k norms per head;
  `attention.sliding_window` with its per-layer `sliding_window_pattern`, the global layers NoPE.
- seed_oss: the FFN's input norm as `post_attention_norm`. ernie4_5: interleaved rotary.
- starcoder2: LayerNorm (eps `attention.layer_norm_epsilon`) with biases, `ffn_up`/`ffn_down`
  as `c_fc`/`c_proj`. arcee: ReLU² `ffn_up`/`ffn_down`, Q/K permuted (its converter is
  LlamaModel's). apertus: `attn_norm`/`ffn_norm` as `attention_layernorm`/
  `feedforward_layernorm`, xIELU's parameters as metadata arrays (`xielu.alpha_p`, ... one a
  layer), Q/K as stored.
- glm4moe (GLM-4.5 / 4.6): DeepSeek-V3's router and experts as the deepseek2 files hold them
  (`exp_probs_b`, stacked `ffn_*_exps`, `ffn_*_shexp`), the FFN's input norm as
  `post_attention_norm`, a sigmoid `expert_gating_func`, the MTP blocks after the decoder's.
- mistral3 (Mistral-Small-3.x's text model, Ministral 3): Q/K permuted; with
  `attention.temperature_scale` it is Ministral 3 (q scaled by position: that beta over the
  yarn's original context; yarn's `mscale_all_dim` from `rope.scaling.yarn_log_multiplier`,
  its mscale 1 as llama.cpp assumes).

- llama4 (Llama 4's text model): the router `ffn_gate_inp`, the experts stacked apart
  (`ffn_{gate,up,down}_exps`, read as `model/llama4.py` reads them), the shared expert
  `ffn_*_shexp`, dense `ffn_*` on the other layers; Q/K as stored; llama.cpp's built-in chunks,
  NoPE layers, q temperature and q/k norms (`_llama4`).

- granitehybrid, nemotron_h, nemotron_h_moe and falcon-h1 (the hybrids' Mamba2 mixers):
  `gguf_mamba.py`.

For all of them, llama.cpp's end-of-generation tokens by their text (`EOG_TEXTS`: Phi-3's
`<|end|>`, gpt-oss's `<|return|>` and `<|call|>` but not its `<|end|>`) join the EOS ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from pagoda.runtime.model import gguf_mamba
from pagoda.runtime.model.gguf_dequant import dequantize

ENGINE_ARCH = {"gpt-oss": "gpt_oss", "phi3": "phi3", "exaone4": "exaone4",
               "seed_oss": "seed_oss", "ernie4_5": "ernie4_5", "starcoder2": "starcoder2",
               "arcee": "arcee", "apertus": "apertus", "mistral3": "mistral",
               "glm4moe": "glm4_moe", "llama4": "llama4",
               "granitehybrid": "granitemoehybrid", "nemotron_h": "nemotron_h",
               "nemotron_h_moe": "nemotron_h", "falcon-h1": "falcon_h1"}  # fmt: skip
# converted by llama.cpp's LlamaModel (its permute kept: `undo_permute`): Q/K rows permuted
PERMUTED = ("arcee", "mistral3", "granitehybrid", "nemotron_h", "nemotron_h_moe")
GPT_OSS_SWIGLU = (1.702, 7.0)  # llama.cpp's (alpha, limit): no key for them
# tokens llama.cpp ends a generation on by their text (llama-vocab.cpp), beside the file's EOS
# and EOT ids; where <|return|> and <|call|> are (harmony), <|end|> is not one
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
             "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
             "<end_of_utterance>")  # fmt: skip
# llama.cpp's Llama 4 (no GGUF keys): chunk size, q temperature floor and scale; NoPE step
LLAMA4_CHUNK, LLAMA4_NO_ROPE_STEP = (8192, 8192.0, 0.1), 4
XIELU = ("alpha_p", "alpha_n", "beta", "eps")  # `xielu.<p>`: one value a layer
# llama.cpp's per-layer names -> the engine's, where they differ from Llama's
NAMES: dict[str, dict[str, str]] = {
    "gpt_oss": {"post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router",
                "ffn_gate_exps": "mlp.experts.gate", "ffn_up_exps": "mlp.experts.up",
                "ffn_down_exps": "mlp.experts.down", "ffn_gate_up_exps": "mlp.experts.gate_up"},
    "seed_oss": {"post_attention_norm": "post_attention_layernorm"},
    "llama4": {"ffn_gate_inp": "feed_forward.router",
               **{f"ffn_{p}_exps": f"feed_forward.experts.{p}" for p in ("gate", "up", "down")},
               **{f"ffn_{p}_shexp": f"feed_forward.shared_expert.{p}_proj"
                  for p in ("gate", "up", "down")},
               **{f"ffn_{p}": f"feed_forward.{p}_proj" for p in ("gate", "up", "down")}},
    # the fused wholes (their parts are read: `fused_parts`), named for the weights estimate
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "exaone4": {"post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"},
    "starcoder2": {"ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"},
    "apertus": {"attn_norm": "attention_layernorm", "ffn_norm": "feedforward_layernorm"},
    "glm4_moe": {"post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate",
                 **{f"ffn_{p}_exps": f"mlp.experts.{p}_proj" for p in ("gate", "up", "down")},
                 **{f"ffn_{p}_shexp": f"mlp.shared_experts.{p}_proj"
                    for p in ("gate", "up", "down")}},
    **gguf_mamba.NAMES,
}  # fmt: skip
# names without a weight/bias suffix in the engine's checkpoints
BARE = {("gpt_oss", "attn_sinks"): "self_attn.sinks",
        ("glm4_moe", "exp_probs_b"): "mlp.gate.e_score_correction_bias",
        **gguf_mamba.BARE}  # fmt: skip
_FUSED = {"attn_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "ffn_up": ("mlp.gate_proj", "mlp.up_proj")}  # phi3's, in row order  # fmt: skip
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
Get = Callable[..., Any]  # get(key, default): the file's `<arch>.<key>`


def engine_arch(gguf_arch: str, get: Get) -> str:
    """The engine's architecture of a file of `gguf_arch` (one of `ENGINE_ARCH`)."""
    if gguf_arch == "mistral3" and get("attention.temperature_scale") is not None:
        return "ministral3"
    return ENGINE_ARCH[gguf_arch]


def hf_name(layer: str, part: str, kind: str, architecture: str) -> str | None:
    """The engine's name of `blk.{layer}.{part}.{kind}` where this module names it."""
    if (architecture, part) in BARE:
        return f"model.layers.{layer}.{BARE[architecture, part]}"
    name = NAMES.get(architecture, {}).get(part)
    return None if name is None else f"model.layers.{layer}.{name}.{kind}"


def fused_parts(name: str, rows: int, config) -> list[tuple[str, int, int]]:
    """The (engine name, first row, row after) of each part of a fused Phi-3 tensor; []
    for any other tensor."""
    m = _BLOCK.match(name)
    if config.architecture != "phi3" or not m or m.group(2) not in _FUSED:
        return []
    layer, part, kind = m.groups()
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    sizes = [q, kv, kv] if part == "attn_qkv" else [rows // 2, rows // 2]
    if sum(sizes) != rows:
        raise ValueError(f"GGUF {name} has {rows} rows; q, k and v need {sum(sizes)}")
    out, start = [], 0
    for hf, size in zip(_FUSED[part], sizes):
        out.append((f"model.layers.{layer}.{hf}.{kind}", start, start + size))
        start += size
    return out


def extra_tensors(reader, gguf_arch: str, layers: int) -> dict[str, torch.Tensor]:
    """Tensors the converter wrote as metadata (Apertus' xIELU parameters), by engine name."""
    if gguf_arch != "apertus":
        return {}
    out = {}
    for p in XIELU:
        f = reader.fields.get(f"xielu.{p}")
        values = f.contents() if f is not None else None
        if not isinstance(values, list) or len(values) != layers:
            raise ValueError(f"GGUF apertus needs xielu.{p} with a value for each of its "
                             f"{layers} layers")  # fmt: skip
        for i, v in enumerate(values):
            out[f"model.layers.{i}.mlp.act_fn.{p}"] = torch.tensor([float(v)])
    return out


def eos_ids(gguf_arch: str, tokens: list[str]) -> list[int]:
    """The end-of-generation ids llama.cpp adds by their text (`EOG_TEXTS`: Phi-3's <|end|>,
    gpt-oss's <|return|> and <|call|>), for these families."""
    if gguf_arch not in ENGINE_ARCH:
        return []
    texts = set(EOG_TEXTS)
    found = {t: i for i, t in enumerate(tokens) if t in texts}
    if "<|return|>" in found and "<|call|>" in found:
        found.pop("<|end|>", None)
    return sorted(found.values())


def family_fields(get: Get, gguf_arch: str, layers: int, window_pattern,
                  tensors: set[str]) -> dict[str, Any]:  # fmt: skip
    """`FamilyConfig` fields of these families from the file (`window_pattern(default)`:
    `attention.sliding_window_pattern` as a flag per layer, checked; `tensors`: its names)."""
    window = get("attention.sliding_window")
    window = int(window) if window else None
    if gguf_arch == "glm4moe":
        return _glm4_moe(get, tensors)
    if gguf_arch == "llama4":
        return _llama4(get, layers)
    if gguf_arch in gguf_mamba.ARCHS:
        return gguf_mamba.family_fields(get, gguf_arch, layers, tensors)
    if gguf_arch == "gpt-oss":
        alpha, limit = GPT_OSS_SWIGLU
        return dict(attention_sinks=True, swiglu_alpha=alpha, swiglu_limit=limit,
                    round_topk_to_model_dtype=True, sliding_window=window,
                    window_layers=tuple(i % 2 == 0 for i in range(layers)) if window else ())  # fmt: skip
    if gguf_arch == "phi3":  # 0: no window (Phi-4), else on every layer
        return {"sliding_window": window}
    if gguf_arch == "exaone4":
        fields: dict[str, Any] = {"olmo2_norms": True, "qk_norm": True}
        if window:
            sliding = window_pattern([bool((i + 1) % 4) for i in range(layers)])  # llama.cpp's
            fields.update(sliding_window=window, window_layers=sliding, rope_layers=sliding)
        return fields
    if gguf_arch == "ernie4_5":
        return {"rope_interleaved": True}
    if gguf_arch == "starcoder2":
        return dict(gated_mlp=False, layer_norm_bias=True, hidden_act="gelu_tanh",
                    sliding_window=window)  # fmt: skip
    if gguf_arch == "arcee":
        return {"gated_mlp": False, "hidden_act": "relu2"}
    if gguf_arch == "apertus":
        return {"gated_mlp": False, "hidden_act": "xielu", "qk_norm": True}
    if gguf_arch == "mistral3":
        fields = {"sliding_window": window}
        beta = get("attention.temperature_scale")
        if beta is not None:  # Ministral 3's q scale by position
            context = get("rope.scaling.original_context_length")
            if not context:
                raise ValueError("GGUF mistral3 with attention.temperature_scale needs "
                                 "rope.scaling.original_context_length")  # fmt: skip
            fields.update(query_scale_beta=float(beta), query_scale_context=int(context))
        return fields
    return {}


def _glm4_moe(get: Get, tensors: set[str]) -> dict[str, Any]:
    """GLM-4.5's router (V3's: sigmoid with `exp_probs_b`, groups, scale) and shared experts;
    the experts' count, width, top-k, norm and layers are read as every family's."""
    from pagoda.runtime.model_configs import ExpertRouting

    if int(get("expert_gating_func", 2) or 2) != 2:
        raise ValueError("GGUF glm4moe with a router other than sigmoid (expert_gating_func 2) "
                         "is not supported")  # fmt: skip
    experts, groups = int(get("expert_count")), int(get("expert_group_count", 1) or 1)
    if experts % groups or experts // groups < 2:
        raise ValueError(f"GGUF glm4moe expert_group_count {groups} must divide the {experts} "
                         "experts into groups of two or more")  # fmt: skip
    routing = ExpertRouting(scoring="sigmoid", topk_method="noaux_tc", n_group=groups,
                            topk_group=int(get("expert_group_used_count", 1) or 1),
                            routed_scaling_factor=float(get("expert_weights_scale", 1.0) or 1.0))  # fmt: skip
    width = int(get("expert_feed_forward_length"))
    return {"qk_norm": "blk.0.attn_q_norm.weight" in tensors, "routing": routing,
            "shared_expert_intermediate_size": width * int(get("expert_shared_count", 0) or 0)}  # fmt: skip


def _llama4(get: Get, layers: int) -> dict[str, Any]:
    """Llama 4 as llama.cpp builds it (no keys for most of it): `attention.sliding_window` 0
    (the converter's for all-full-attention configs) means rotary on every layer, no chunks, no
    temperature; otherwise (any other value is overridden, as llama.cpp does) chunks of 8192 on
    three layers of four, the fourth NoPE with the q temperature (floor 8192, scale 0.1); q/k
    L2 norms on the rotary layers unless the model has 128 experts (Maverick). The experts
    (sigmoid top-k, the input scaled), the shared expert of their width: `model/llama4.py`."""
    from pagoda.runtime.model_configs import Llama4Attention

    full = get("attention.sliding_window") == 0
    chunk, floor, scale = LLAMA4_CHUNK
    rope = tuple(full or bool((i + 1) % LLAMA4_NO_ROPE_STEP) for i in range(layers))
    width = int(get("expert_feed_forward_length", 0) or 0)
    experts = int(get("expert_count", 0) or 0)
    fields: dict[str, Any] = {
        "rope_layers": rope, "rope_interleaved": True, "shared_expert_intermediate_size": width,
        "llama4": Llama4Attention(qk_norm=experts != 128, temperature_tuning=not full,
                                  floor_scale=floor, attn_scale=scale),
    }  # fmt: skip
    if not full:
        fields.update(attention_chunk_size=chunk, chunk_layers=rope)  # the rotary layers
    return fields


def rope_scaling(get: Get, gguf_arch: str, scaling: dict | None, head_dim: int,
                 tensors: dict) -> dict | None:  # fmt: skip
    """`ModelConfig.rope_scaling` for these families: Phi-3's longrope and partial rotary
    (`tensors`: the file's by name), gpt-oss's untruncated yarn, Ministral 3's yarn mscale;
    `scaling` is what the common reading made of the file (None for phi3, which it skips)."""
    if gguf_arch == "phi3":
        return _phi3_rope(get, head_dim, tensors)
    rotated = get("rope.dimension_count")
    if gguf_arch == "granitehybrid" and rotated and int(rotated) != head_dim:
        return {**(scaling or {}), "partial_rotary_factor": int(rotated) / head_dim}
    if scaling and scaling.get("rope_type") == "yarn":
        if gguf_arch == "gpt-oss":
            return {**scaling, "truncate": False}
        if gguf_arch == "mistral3":
            log_mul = float(get("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
            if log_mul:  # llama.cpp: mscale 1 over mscale_all_dim = the multiplier
                return {**scaling, "mscale": 1.0, "mscale_all_dim": log_mul}
    return scaling


def _phi3_rope(get: Get, head_dim: int, tensors: dict) -> dict | None:
    rotated = get("rope.dimension_count")
    partial = int(rotated) / head_dim if rotated is not None and int(rotated) != head_dim else None
    out: dict[str, Any] = {} if partial is None else {"partial_rotary_factor": partial}
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if (long is None) != (short is None):
        raise ValueError("GGUF phi3 needs both rope_factors_long and rope_factors_short, or "
                         "neither")  # fmt: skip
    if long is None:
        if get("rope.scaling.attn_factor") not in (None, 1.0):
            raise ValueError("GGUF phi3 rope.scaling.attn_factor without rope factors is not "
                             "supported")  # fmt: skip
        return out or None
    original = int(get("rope.scaling.original_context_length", 0) or 0)
    context = int(get("context_length"))
    if not original:
        raise ValueError("GGUF phi3 with rope factors needs rope.scaling.original_context_length")
    factors = {"long_factor": _values(long), "short_factor": _values(short)}
    dims = int(rotated) if rotated is not None else head_dim
    if any(len(f) != dims // 2 for f in factors.values()):
        raise ValueError(f"GGUF phi3 rope_factors_long/short need {dims // 2} values each (half "
                         f"the {dims} rotating dims)")  # fmt: skip
    out.update(rope_type="longrope", original_max_position_embeddings=original,
               factor=context / original, **factors)  # fmt: skip
    attention = get("rope.scaling.attn_factor")
    if attention is not None:
        out["attention_factor"] = float(attention)
    return out


def _values(t) -> list[float]:
    shape = tuple(int(d) for d in reversed(t.shape))
    return [float(x) for x in dequantize(t.data, t.tensor_type.name, shape).flatten()]
