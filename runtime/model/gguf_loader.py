"""GGUF → (ModelConfig, HF-named float tensors, Tokenizer) through the `gguf` package.

Architectures as llama.cpp names them: llama (Mixtral too, with experts), mistral, qwen2, qwen3,
qwen3moe, gemma3, gemma2, qwen2moe (its shared expert `ffn_*_shexp`, gated by
`ffn_gate_inp_shexp`), granite (`embedding_scale`, `residual_scale`, `attention.scale`,
`logit_scale`), granitemoe (its `input_linear` split as gate and up), olmo2 (norms after the sublayers, q/k norms over every head; with
`attention.sliding_window`, OLMo 3's window layers), olmoe, smollm3 (llama with every fourth
layer NoPE, as llama.cpp hard-codes it), deepseek2 (`gguf_deepseek.py`), glm4, command-r and cohere2
(`gguf_glm_cohere.py`), gpt-oss, phi3, exaone4, seed_oss, ernie4_5, starcoder2, arcee, apertus,
mistral3, glm4moe, llama4, granitehybrid, nemotron_h, nemotron_h_moe and falcon-h1 (`gguf_archs.py`: their names, fused rows and fields). Quantized tensors (Q4_0,
Q4_1, Q8_0, the K kinds, MXFP4, ...) are dequantized in torch (`gguf_dequant`) when the model
builder reads them (`GGUFWeights`), one at a time from the memory-mapped file. llama.cpp stores the Q and K projections of Llama models permuted for its
interleaved rotary; we undo that (in torch) so one rotate-half rotary (Hugging Face layout)
serves every loader. Mixture-of-experts tensors (`ffn_*_exps`, [E, N, K]) keep their stacked
shape under `...experts.{gate,up,down}.weight` names (`moe.py` slices them, blocks included). Gemma's norms are stored as 1 + w
(`FamilyConfig.norms_hold_one_plus_w`). The metadata is parsed by `gguf_reader`, once per file
in a process (the start-up checks' reader is the load's).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from pagoda.runtime.config import FamilyConfig, ModelConfig
from pagoda.runtime.cpu.quantized import QuantizedWeight, from_gguf, readable
from pagoda.runtime.model import gguf_archs, gguf_deepseek, gguf_glm_cohere, pre_tokenizers
from pagoda.runtime.model.gguf_dequant import dequantize
from pagoda.runtime.model.gguf_reader import parse as _reader  # noqa: F401 - one of its own
from pagoda.runtime.model.gguf_reader import take_reader
from pagoda.runtime.model.tokenizer import (
    Tokenizer,
    build_bpe_tokenizer,
    build_gemma_tokenizer,
    build_spm_tokenizer,
)

log = logging.getLogger(__name__)
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "qwen3moe", "gemma3", "gemma2",
                   "qwen2moe", "granite", "granitemoe", "olmo2",
                   "olmoe", "smollm3", gguf_deepseek.GGUF_ARCH,
                   *gguf_glm_cohere.ENGINE_ARCH, *gguf_archs.ENGINE_ARCH)  # fmt: skip
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_NAMES = {  # Gemma 2's and 3's four norms a layer; the rest as above
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_OLMO2_NAMES = {  # OLMo 2's norms after attention and the MLP (none before); q/k norms whole
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_MOE_NAMES = {  # llama.cpp's expert tensors -> (router | stacked experts) under the MoE block
    "ffn_gate_inp": "gate",
    "ffn_gate_exps": "experts.{gate}",
    "ffn_up_exps": "experts.{up}",
    "ffn_down_exps": "experts.{down}",
    # Qwen2-MoE's shared expert and its sigmoid gate ([1, hidden] as the converter writes it)
    "ffn_gate_inp_shexp": "shared_expert_gate",
    "ffn_gate_shexp": "shared_expert.gate_proj",
    "ffn_up_shexp": "shared_expert.up_proj",
    "ffn_down_shexp": "shared_expert.down_proj",
}
_MOE_BLOCKS = {  # architecture -> (block prefix, expert weight names) as the models read them
    "mixtral": ("block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}),
    "qwen3moe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    "qwen2moe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    "olmoe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    # the converter splits GraniteMoe's input_linear into gate and up: Mixtral's three stacks
    "granitemoe": ("block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}),
}
_MOE_ROUTERS = {"granitemoe": "router.layer"}  # ffn_gate_inp where the model's is not `gate`
# llama.cpp renormalises the top-k routing weights of these (the others' it hands on as they are)
_RENORMALISED = ("mixtral", "qwen3moe", "granitemoe", "granitemoehybrid")
GEMMA3_SWA_PATTERN = 6  # llama.cpp's: every sixth layer is global
GEMMA3_LOCAL_THETA = 10_000.0
# llama.cpp's Gemma 2: every other layer global, soft caps 50 (attention) and 30 (final)
GEMMA2_SWA_PATTERN, GEMMA2_ATTN_CAP, GEMMA2_FINAL_CAP = 2, 50.0, 30.0
SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3 (no GGUF key)
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output_norm.bias": "model.norm.bias",  # StarCoder2's LayerNorm
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert-time permute (rows interleaved per head for rotary), on
    whatever device and dtype `w` is (rows of values or of raw blocks)."""
    rows = w.shape[0]
    split = w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
    return split.transpose(1, 2).reshape(w.shape)


def _hf_name(name: str, architecture: str = "llama") -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK.match(name)
    if not m:  # (a Mamba2 mixer's A and D: `blk.N.ssm_a`)
        return gguf_archs.suffixless_name(name, architecture)
    layer, part, kind = m.groups()
    if architecture in gguf_deepseek.ARCHITECTURES:  # deepseek2 (gguf_deepseek.py)
        return gguf_deepseek.hf_name(layer, part, kind)
    names = _GEMMA3_NAMES if architecture in ("gemma2", "gemma3") else _LAYER_NAMES
    names = _OLMO2_NAMES if architecture == "olmo2" else names
    names = {**names, **gguf_glm_cohere.GLM4_NAMES} if architecture == "glm4" else names
    if architecture in gguf_archs.NAMES:  # gpt-oss, Seed-OSS, EXAONE 4, ... (gguf_archs.py)
        own = gguf_archs.hf_name(layer, part, kind, architecture)
        if own is not None:
            return own
    if part in names:
        return f"model.layers.{layer}.{names[part]}.{kind}"
    if part in _MOE_NAMES and architecture in _MOE_BLOCKS:
        block, experts = _MOE_BLOCKS[architecture]
        if part == "ffn_gate_inp" and architecture in _MOE_ROUTERS:
            return f"model.layers.{layer}.{block}{_MOE_ROUTERS[architecture]}.{kind}"
        return f"model.layers.{layer}.{block}{_MOE_NAMES[part].format(**experts)}.{kind}"
    return None


def _family(reader, gguf_arch: str, arch: str, layers: int, head_dim: int, heads: int, hidden: int):
    """`FamilyConfig` from llama.cpp's keys, with llama.cpp's built-in values where a family has
    none in the file (Gemma 3's layer pattern, local rotary base and query scale)."""
    p = f"{gguf_arch}."
    fields: dict = {"qk_norm": arch in ("qwen3", "qwen3moe", "gemma3")}
    if gguf_arch in gguf_glm_cohere.ENGINE_ARCH:  # GLM-4, Cohere (gguf_glm_cohere.py)
        fields.update(gguf_glm_cohere.family_fields(
            lambda key, default=None: _field(reader, p + key, default), gguf_arch, layers,
            {t.name for t in reader.tensors},
        ))  # fmt: skip
    if gguf_arch in gguf_archs.ENGINE_ARCH:  # gpt-oss, Phi-3, EXAONE 4, ... (gguf_archs.py)
        fields.update(gguf_archs.family_fields(
            lambda key, default=None: _field(reader, p + key, default), gguf_arch, layers,
            lambda default: _window_flags(reader, p, layers, default),
            {t.name for t in reader.tensors},
        ))  # fmt: skip
    window = _field(reader, p + "attention.sliding_window")
    if arch in ("gemma3", "mistral", "mixtral") and window:
        fields["sliding_window"] = int(window)
    if arch in ("gemma2", "gemma3"):
        fields.update(_gemma_fields(reader, p, arch, layers, head_dim, heads, hidden, window))
    if arch == "smollm3":  # llama.cpp: no key for it, every fourth layer NoPE; no window
        if window:
            raise ValueError("GGUF smollm3 with attention.sliding_window is not supported")
        fields["rope_layers"] = tuple(bool((i + 1) % SMOLLM3_NO_ROPE_STEP) for i in range(layers))
    if arch == "olmo2" and window:  # OLMo 3, as llama.cpp's converter writes it
        fields.update(_olmo3_windows(reader, p, layers, int(window)))
    if arch in ("olmo2", "olmoe"):
        if _field(reader, p + "attention.clamp_kqv") is not None:
            raise ValueError("GGUF attention.clamp_kqv (OLMoE's q/k/v clamp) is not supported")
        fields.update(qk_norm_whole=True, olmo2_norms=arch == "olmo2")
    if arch == "granitemoe" and _field(reader, p + "expert_shared_feed_forward_length"):
        raise ValueError("GGUF granitemoe with a shared expert (GraniteMoeShared) is not supported")
    if arch in ("granite", "granitemoe", "granitemoehybrid"):
        fields.update(_granite_scalars(reader, p))
    fields.update(_expert_fields(reader, p, arch, layers))
    return FamilyConfig(**fields)


def _gemma_fields(reader, p: str, arch: str, layers: int, head_dim: int, heads: int,
                  hidden: int, window) -> dict:  # fmt: skip
    """Gemma 2's and Gemma 3's fields, with llama.cpp's built-in values where the file has none
    (the layer pattern, the window, the soft-caps, the local rotary base, the query scale)."""
    fields: dict = dict(gemma_norms=True, norms_hold_one_plus_w=True, hidden_act="gelu_tanh")
    if arch == "gemma2":  # llama.cpp's gemma2 hparams (its 27B, 46 layers: hidden / heads)
        fields.update(
            sliding_window=int(window or 4096),
            window_layers=tuple(bool((i + 1) % GEMMA2_SWA_PATTERN) for i in range(layers)),
            query_pre_attn_scalar=float(hidden // heads if layers == 46 else head_dim),
            attn_logit_softcapping=float(
                _field(reader, p + "attn_logit_softcapping", GEMMA2_ATTN_CAP)
            ),
            final_logit_softcapping=float(
                _field(reader, p + "final_logit_softcapping", GEMMA2_FINAL_CAP)
            ),
        )
    if arch == "gemma3":
        pattern = _field(reader, p + "attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        if isinstance(pattern, list):  # a flag per layer
            fields["window_layers"] = tuple(bool(x) for x in pattern)
        else:
            fields["window_layers"] = tuple(bool((i + 1) % int(pattern)) for i in range(layers))
        # llama.cpp: 27B (62 layers) scales by hidden / heads, the others by the head size
        scalar = hidden // heads if layers == 62 else head_dim
        cap = _field(reader, p + "final_logit_softcapping")
        fields.update(
            local_rope_theta=float(_field(reader, p + "rope.freq_base_swa", GEMMA3_LOCAL_THETA)),
            query_pre_attn_scalar=float(scalar),
            final_logit_softcapping=float(cap) if cap else None,
        )
    return fields


def _granite_scalars(reader, p: str) -> dict:
    """Granite's scalars from the converter's *_scale keys (llama.cpp: absent (0) means none)."""
    attention = _field(reader, p + "attention.scale")
    return dict(
        embedding_multiplier=float(_field(reader, p + "embedding_scale", 0) or 1.0),
        residual_multiplier=float(_field(reader, p + "residual_scale", 0) or 1.0),
        attention_multiplier=float(attention) if attention else None,
        logits_scaling=float(_field(reader, p + "logit_scale", 0) or 1.0),
    )


def _expert_fields(reader, p: str, arch: str, layers: int) -> dict:
    """The experts' fields (none for a dense model): their count, top-k, width, renormalising,
    the layers that have them; Qwen2-MoE's shared expert."""
    experts = int(_field(reader, p + "expert_count", 0) or 0)
    if not experts or arch == "nemotron_h":  # (Nemotron 3's: `gguf_archs._nemotron_experts`)
        return {}
    names = {t.name for t in reader.tensors}
    fields: dict = dict(
        num_experts=experts,
        num_experts_per_tok=int(_field(reader, p + "expert_used_count")),
        moe_intermediate_size=int(
            _field(reader, p + "expert_feed_forward_length", 0)
            or _field(reader, p + "feed_forward_length")
        ),
        norm_topk_prob=bool(_field(reader, p + "expert_weights_norm", arch in _RENORMALISED)),
        moe_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in names for i in range(layers)),
    )
    if arch in ("qwen3moe", "qwen2moe", "olmoe", "granitemoe", "granitemoehybrid"):
        fields["round_topk_to_model_dtype"] = True
    if arch == "granitemoehybrid":  # the shared MLP beside the experts
        fields["shared_expert_intermediate_size"] = int(
            _field(reader, p + "expert_shared_feed_forward_length")
        )
    if arch == "qwen2moe":  # the key, else the shared expert's rows (llama.cpp: the same)
        shexp = next((t for t in reader.tensors if t.name.endswith(".ffn_gate_shexp.weight")),
                     None)  # fmt: skip
        width = _field(reader, p + "expert_shared_feed_forward_length")
        fields["shared_expert_intermediate_size"] = int(
            width or (_shape(shexp)[0] if shexp is not None else 0)
        )
    return fields


def _olmo3_windows(reader, p: str, layers: int, window: int) -> dict:
    """OLMo 3 in a GGUF: `olmo2` with `attention.sliding_window` and a flag per layer in
    `attention.sliding_window_pattern` (without one, the converter's default: every fourth
    layer global); the window layers rotate with the plain base, unscaled (llama.cpp's olmo2
    graph; `rope.freq_base_swa` where the file has one), the global ones with its scaling."""
    fields: dict = {"sliding_window": window,
                    "window_layers": _window_flags(reader, p, layers, [bool((i + 1) % 4) for i in range(layers)])}  # fmt: skip
    theta = float(_field(reader, p + "rope.freq_base", 10000.0))
    local = float(_field(reader, p + "rope.freq_base_swa", theta))
    if local != theta or _field(reader, p + "rope.scaling.type") not in (None, "none"):
        fields["local_rope_theta"] = local
    return fields


def _window_flags(reader, p: str, layers: int, default: list[bool]) -> tuple[bool, ...]:
    """`attention.sliding_window_pattern` as a flag per layer (`default` where the file has
    none); ValueError for another form."""
    pattern = _field(reader, p + "attention.sliding_window_pattern")
    pattern = default if pattern is None else pattern
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise ValueError(f"GGUF attention.sliding_window_pattern must name each of the {layers} "
                         "layers")  # fmt: skip
    return tuple(bool(x) for x in pattern)


def _rope_scaling(reader, p: str, head_dim: int, partial: bool = False) -> dict | None:
    """`ModelConfig.rope_scaling` from the file: its `rope.scaling.type` (linear, yarn), or the
    per-frequency divisors of a `rope_freqs` tensor (llama.cpp's converter writes Llama 3.1's
    llama3 scaling so), carried as a llama3 scaling with `freq_factors`."""
    rotated = _field(reader, p + "rope.dimension_count")
    if rotated is not None and int(rotated) != head_dim and not partial:
        raise ValueError(f"GGUF rope.dimension_count {rotated} < head size {head_dim}: a partial "
                         "rotary embedding is not supported")  # fmt: skip
    scale_type = _field(reader, p + "rope.scaling.type")
    # yarn's attention factor (transformers' `attention_factor`: OLMo 3's), as the converter
    # writes it: `attn_factor` (older), `yarn_attn_factor` (newer)
    attn = {float(v) for v in (_field(reader, p + "rope.scaling.attn_factor"),
                               _field(reader, p + "rope.scaling.yarn_attn_factor")) if v is not None}  # fmt: skip
    if len(attn) > 1 or (attn - {1.0} and scale_type != "yarn"):
        raise ValueError(f"GGUF rope.scaling.attn_factor {sorted(attn)} is supported only as "
                         "yarn's one attention factor")  # fmt: skip
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        if scale_type not in (None, "none"):
            raise ValueError(f"GGUF has rope_freqs and rope.scaling.type {scale_type!r}: one "
                             "rotary scaling is read, not both")  # fmt: skip
        factors = [float(x) for x in dequantize(freqs.data, freqs.tensor_type.name,
                                                _shape(freqs), torch.float32, None).flatten()]  # fmt: skip
        if len(factors) != head_dim // 2:
            raise ValueError(f"GGUF rope_freqs has {len(factors)} factors; head size {head_dim} "
                             f"needs {head_dim // 2}")  # fmt: skip
        return {"rope_type": "llama3", "freq_factors": factors}
    if scale_type in (None, "none"):
        return None
    if scale_type not in ("linear", "yarn"):
        raise ValueError(f"GGUF rope.scaling.type {scale_type!r} is not supported (linear, yarn)")
    out = {
        "rope_type": scale_type,
        "factor": float(_field(reader, p + "rope.scaling.factor", 1.0)),
        "original_max_position_embeddings": int(
            _field(reader, p + "rope.scaling.original_context_length", 0) or 0
        ),
    }
    if scale_type == "yarn":  # its betas where the file has them (else yarn's 32 and 1)
        out.update(gguf_deepseek.yarn_betas(lambda key, d=None: _field(reader, p + key, d)))
        out.update({"attention_factor": attn.pop()} if attn else {})
    return out


def _check_pre_tokenizer(reader) -> None:
    """A byte-level BPE's `tokenizer.ggml.pre` refused at start-up where the engine does not
    split as it names (as llama.cpp refuses it); a warning where the file names none."""
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        return
    pre = _field(reader, "tokenizer.ggml.pre")
    pre_tokenizers.lookup(pre)
    if not pre:  # llama.cpp: "missing pre-tokenizer type, using: 'default'"
        log.warning("GGUF has no tokenizer.ggml.pre: splitting as llama.cpp's 'default'; "
                    "token ids may differ from the model's own tokenizer")  # fmt: skip


def _family_rope(reader, gguf_arch: str, head_dim: int) -> dict | None:
    """`ModelConfig.rope_scaling` of a family other than DeepSeek's: the file's scaling
    (`_rope_scaling`; Phi-3's longrope from `gguf_archs`), GLM's and Cohere's partial rotary."""
    p = f"{gguf_arch}."
    partial = gguf_glm_cohere.partial_rotary(
        gguf_arch, _field(reader, p + "rope.dimension_count"), head_dim
    )
    partial_ok = partial is not None or gguf_arch == "granitehybrid"  # (Bamba's: gguf_archs)
    rope_scaling = (None if gguf_arch == "phi3"  # (its longrope: gguf_archs)
                    else _rope_scaling(reader, p, head_dim, partial_ok))  # fmt: skip
    rope_scaling = {**(rope_scaling or {}), **partial} if partial else rope_scaling
    if gguf_arch in gguf_archs.ENGINE_ARCH:
        rope_scaling = gguf_archs.rope_scaling(
            lambda key, d=None: _field(reader, p + key, d), gguf_arch, rope_scaling, head_dim,
            {t.name: t for t in reader.tensors if t.name.startswith("rope_factors")},
        )  # fmt: skip
    return rope_scaling


def _eos_ids(reader, gguf_arch: str, tokens) -> tuple[int, ...]:
    """The end-of-generation ids llama.cpp reads (EOS, end of turn, end of message: Llama 3.1's
    <|eom_id|> after a built-in tool call), and a family's own (`gguf_archs.eos_ids`)."""
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    eos = list(dict.fromkeys(int(_field(reader, f"tokenizer.ggml.{k}", -1)) for k in keys))
    eos += [i for i in gguf_archs.eos_ids(gguf_arch, tokens) if i not in eos]
    return tuple(e for e in eos if e >= 0)


def read_config(reader) -> ModelConfig:
    gguf_arch, arch = _architectures(reader)
    _check_pre_tokenizer(reader)
    p = f"{gguf_arch}."
    hidden = int(_field(reader, p + "embedding_length"))
    heads = int(_field(reader, p + "attention.head_count"))
    kv_heads = _field(reader, p + "attention.head_count_kv", heads)
    if isinstance(kv_heads, list):  # a value a layer (granitehybrid: 0 on its Mamba2 layers)
        kv_heads = max(kv_heads) or heads
    kv_heads = int(kv_heads)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = int(_field(reader, p + "vocab_size", len(tokens)))
    deepseek: dict = {}
    if gguf_arch == gguf_deepseek.GGUF_ARCH:  # latent attention, DeepSeek's experts
        deepseek = gguf_deepseek.config_fields(
            lambda key, default=None: _field(reader, p + key, default),
            {t.name for t in reader.tensors}, hidden, heads, int(_field(reader, p + "block_count")),
        )  # fmt: skip
    head_dim = int(_field(reader, p + "attention.key_length", hidden // heads))
    head_dim = deepseek.get("head_dim", head_dim)
    rope_scaling = (
        deepseek["rope_scaling"] if deepseek else _family_rope(reader, gguf_arch, head_dim)
    )
    eos = _eos_ids(reader, gguf_arch, tokens)
    names = {t.name for t in reader.tensors}
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    layers = _decoder_layers(reader, gguf_arch)
    if deepseek:
        arch, kv_heads = deepseek["architecture"], deepseek["num_kv_heads"]
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_intermediate_size(reader, gguf_arch),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(_field(reader, p + gguf_glm_cohere.eps_key(gguf_arch), 1e-5)),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(_field(reader, p + "context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=eos,
        architecture=arch,
        family=deepseek.get("family")
        or _family(reader, gguf_arch, arch, layers, head_dim, heads, hidden),
    )


def _architectures(reader) -> tuple[str, str]:
    """(the file's `general.architecture`, the engine's architecture for it): llama.cpp's
    names that differ from the engine's (GLM-4, Cohere, the `gguf_archs` families), Mixtral as
    `llama` with experts; an architecture outside `SUPPORTED_ARCHS` refused."""
    gguf_arch = _field(reader, "general.architecture")
    if gguf_arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"unsupported GGUF architecture {gguf_arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    p = f"{gguf_arch}."
    arch = gguf_glm_cohere.ENGINE_ARCH.get(gguf_arch, gguf_arch)
    if gguf_arch in gguf_archs.ENGINE_ARCH:
        arch = gguf_archs.engine_arch(gguf_arch, lambda key, d=None: _field(reader, p + key, d))
    if arch == "llama" and _field(reader, p + "expert_count", 0):
        arch = "mixtral"  # llama.cpp stores Mixtral as llama with experts
    return gguf_arch, arch


def _decoder_layers(reader, gguf_arch: str) -> int:
    """`block_count` less the multi-token-prediction blocks after the decoder's (EXAONE 4.5's);
    a family's extra tensors checked (`gguf_archs.extra_tensors`: Apertus' xIELU)."""
    p = f"{gguf_arch}."
    layers = int(_field(reader, p + "block_count"))
    if gguf_arch in gguf_archs.ENGINE_ARCH:
        layers -= int(_field(reader, p + "nextn_predict_layers", 0) or 0)
    gguf_archs.extra_tensors(reader, gguf_arch, layers)
    return layers


def _intermediate_size(reader, gguf_arch: str) -> int:
    """The dense MLP's width: `feed_forward_length` (the widest of its per-layer values);
    Granite 4.0-H's shared MLP's where it has one (its feed_forward_length is the experts')."""
    p = f"{gguf_arch}."
    shared = 0
    if gguf_arch == "granitehybrid":
        shared = int(_field(reader, p + "expert_shared_feed_forward_length", 0))
    return shared or _widest(_field(reader, p + "feed_forward_length"))


def _widest(value) -> int:
    """`feed_forward_length`, or the widest of its per-layer values (Nemotron-H's: 0 on the
    layers without an MLP)."""
    return int(max(value) if isinstance(value, list) else value)


def read_tokenizer(reader, config: ModelConfig) -> Tokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    tokens, types = (
        _field(reader, "tokenizer.ggml.tokens"),
        _field(reader, "tokenizer.ggml.token_type"),
    )
    if model == "llama" and config.architecture in ("gemma2", "gemma3"):  # Gemma's SentencePiece
        hf_tok = build_gemma_tokenizer(tokens, types)
    elif model == "llama":  # SentencePiece: Llama's (Phi-3's prefix before every text)
        scores = _field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        hf_tok = build_spm_tokenizer(
            tokens, scores, types, bool(_field(reader, "tokenizer.ggml.add_space_prefix", True)),
            prefix_every_text=config.architecture == "phi3",
        )  # fmt: skip
    elif model == "gpt2":
        merges = _field(reader, "tokenizer.ggml.merges", [])
        hf_tok = build_bpe_tokenizer(tokens, merges, types, _field(reader, "tokenizer.ggml.pre"))
    else:
        raise ValueError(
            f"unsupported GGUF tokenizer {model!r}: byte-level BPE ('gpt2') and SentencePiece "
            "('llama') are read"
        )
    return Tokenizer(
        hf_tok,
        chat_template=_field(reader, "tokenizer.chat_template"),
        # a named template, as llama.cpp's converter writes them: tools render with it
        tool_chat_template=_field(reader, "tokenizer.chat_template.tool_use"),
        bos_token_id=config.bos_token_id,
        eos_token_ids=config.eos_token_ids,
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", model == "llama")),
    )


class _ByName(Mapping):
    """A mapping over `self._tensors` (HF name -> GGUF tensor) whose values are built on read."""

    _tensors: dict

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


class GGUFWeights(_ByName):
    """The file's tensors by HF name, dequantized to float32 (Q/K rows un-permuted) on each
    read, straight from the memory map: the model is built one tensor at a time, so loading
    never holds a float32 copy of the whole model (an 8B GGUF: 32 GB) beside what the model
    keeps (bf16 copies, `qgemm`'s blocks, or device tensors)."""

    def __init__(self, reader, config: ModelConfig) -> None:
        self._config = config  # the tensors' arrays view the reader's memory map, keeping it
        gguf_arch = _field(reader, "general.architecture")
        self._permuted = config.architecture in _PERMUTED or gguf_arch in gguf_archs.PERMUTED
        named = ((_hf_name(t.name, config.architecture), t) for t in reader.tensors)
        self._tensors = {name: t for name, t in named if name is not None}  # not e.g. rope_freqs
        self._rows: dict[str, tuple[int, int]] = {}  # a fused tensor's parts (GLM-4's ffn_up,
        # read as its Llama name up_proj above): each part's rows, under the part's own name
        for t in reader.tensors:
            parts = gguf_glm_cohere.fused_names(t.name, config.architecture)
            rows = _shape(t)[0] // max(len(parts), 1)
            spans = [(name, i * rows, (i + 1) * rows) for i, name in enumerate(parts)]
            for name, start, stop in spans or gguf_archs.fused_parts(t.name, _shape(t)[0], config):
                self._tensors[name], self._rows[name] = t, (start, stop)
        # values the converter wrote as metadata (Apertus' xIELU parameters)
        self._tensors.update(gguf_archs.extra_tensors(reader, gguf_arch, config.num_layers))
        # tensors stored as gate and up apart, read as one (Granite 4.0-H's input_linear)
        self._joined = gguf_archs.joined(set(self._tensors), config.architecture)
        self._tensors.update(dict.fromkeys(self._joined))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.read(name)

    def read(
        self,
        name: str,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Tensor `name` as `dtype` on `device` (default: the CPU), dequantized there
        (`gguf_dequant`: the stored blocks are what crosses to a GPU)."""
        t = self._tensors[name]
        if name in self._joined:  # gate rows, then up rows
            parts = [self.read(n, device, dtype) for n in self._joined[name]]
            return torch.cat(parts, dim=-2 if parts[0].dim() > 1 else 0)
        if isinstance(t, torch.Tensor):  # from the metadata
            return t.to(device=device, dtype=dtype)
        w = dequantize(t.data, t.tensor_type.name, _shape(t), dtype, device)
        if name in self._rows:  # a part of a fused tensor
            w = w[slice(*self._rows[name])].contiguous()
        if w.dim() == 1 and name.endswith("shared_expert_gate.weight"):  # squeezed: [hidden]
            return w[None]
        if ".mamba." in name:  # llama.cpp's forms of the mixer's tensors
            return gguf_archs.mamba_value(name, w)
        heads = _permuted_heads(self._config, name, self._permuted)
        return _unpermute(w, heads) if heads else w

    def blocks(self) -> GGUFBlocks:
        return GGUFBlocks(self._tensors, self._config, self._rows, self._permuted)


class GGUFBlocks(_ByName):
    """The raw blocks of the matrices stored in a format `qgemm` reads (`quantized.readable`),
    rows in the same HF order, copied out of the file when read: only float32 CPU models read
    them, so a GPU or bf16 load copies none."""

    def __init__(self, tensors: dict, config: ModelConfig, rows: dict | None = None,
                 permuted: bool = False) -> None:  # fmt: skip
        self._config, self._rows, self._permuted = config, rows or {}, permuted
        self._tensors = {
            name: t
            for name, t in tensors.items()
            if name.endswith(".weight")
            and t is not None  # (a joined tensor: read from its parts)
            and not isinstance(t, torch.Tensor)
            and len(_shape(t)) in (2, 3)  # 3: stacked experts, their rows one after another
            and readable(t.tensor_type.name, _shape(t)[-1])
        }

    def __getitem__(self, name: str) -> QuantizedWeight:
        t = self._tensors[name]
        blocks = from_gguf(t.tensor_type.name, t.data, _shape(t)[-1])  # experts: E * N rows
        if name in self._rows:  # a part of a fused tensor
            part = blocks.blocks[slice(*self._rows[name])].contiguous()
            blocks = QuantizedWeight(blocks.kind, part, blocks.cols)
        heads = _permuted_heads(self._config, name, self._permuted)
        if heads:
            blocks = QuantizedWeight(
                blocks.kind, _unpermute_rows(blocks.blocks, heads), blocks.cols
            )
        return blocks


def _shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first


def held_shape(name: str, t) -> tuple[int, ...]:
    """The shape of `t` (engine name `name`) as the loader gives it (a Mamba2 mixer's A, D,
    conv and norm reshaped: `gguf_archs.mamba_value`), for the weights estimate."""
    return gguf_archs.mamba_shape(name, _shape(t))


def load_gguf(
    path: str | Path,
) -> tuple[ModelConfig, GGUFWeights, Tokenizer, GGUFBlocks]:
    """Read config, the weights (HF names, float32 when read), tokenizer, and the raw blocks of
    the weights stored in a format `qgemm` reads (`quantized.BLOCKS`), rows in the same HF order.
    The file's last read in a process: the reader its checks shared, if any (`gguf_reader`)."""
    reader = take_reader(path)
    config = read_config(reader)
    weights = GGUFWeights(reader, config)
    return config, weights, read_tokenizer(reader, config), weights.blocks()


_PERMUTED = ("llama", "mixtral", "granite", "granitemoe", "smollm3")  # llama.cpp's LlamaModel's


def _permuted_heads(config: ModelConfig, name: str, permuted: bool) -> int:
    """Heads whose rows llama.cpp interleaved in this tensor (0: not permuted): q and k of a
    file whose converter permutes them (`permuted`)."""
    if not permuted:
        return 0
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return 0


def _unpermute_rows(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    return _unpermute(rows, n_heads).contiguous()
