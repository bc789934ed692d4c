"""A GGUF's metadata read as the engine's `ModelConfig`: llama.cpp's keys (`<arch>.*`), with
llama.cpp's built-in values where a family has none in the file (Gemma's layer patterns, soft
caps and query scales, SmolLM3's NoPE layers, the routers it renormalises), the rotary scaling
(`rope.scaling.*`, a `rope_freqs` tensor), the end-of-generation ids; the families with keys of
their own through `gguf_archs`, `gguf_deepseek` and `gguf_glm_cohere`. A byte-level BPE's
pre-tokenizer is checked here, before anything loads. The tensors: `gguf_loader`."""

from __future__ import annotations

import logging

import torch
from pagoda.runtime.config import FamilyConfig, ModelConfig
from pagoda.runtime.model import (
    gguf_archs,
    gguf_classic,
    gguf_deepseek,
    gguf_gemma4,
    gguf_glm_cohere,
    pre_tokenizers,
)
from pagoda.runtime.model.gguf_dequant import dequantize
from pagoda.runtime.model.gguf_reader import field as _field
from pagoda.runtime.model.gguf_reader import tensor_shape as _shape

log = logging.getLogger(__name__)
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "qwen3moe", "gemma3", "gemma2",
                   "qwen2moe", "granite", "granitemoe", "olmo2",
                   "olmoe", "smollm3", gguf_deepseek.GGUF_ARCH,
                   *gguf_glm_cohere.ENGINE_ARCH, *gguf_archs.ENGINE_ARCH,
                   *gguf_classic.ENGINE_ARCH)  # fmt: skip

# llama.cpp renormalises the top-k routing weights of these (the others' it hands on as they are)
_RENORMALISED = ("mixtral", "qwen3moe", "granitemoe", "granitemoehybrid")
GEMMA3_SWA_PATTERN = 6  # llama.cpp's: every sixth layer is global
GEMMA3_LOCAL_THETA = 10_000.0
# llama.cpp's Gemma 2: every other layer global, soft caps 50 (attention) and 30 (final)
GEMMA2_SWA_PATTERN, GEMMA2_ATTN_CAP, GEMMA2_FINAL_CAP = 2, 50.0, 30.0
SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3 (no GGUF key)


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
    if not experts or arch == "nemotron_h":  # (Nemotron 3's: `gguf_mamba._nemotron_experts`)
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
    if gguf_arch in gguf_classic.ENGINE_ARCH:  # read as the checkpoint's config.json
        return _classic_config(reader, gguf_arch)
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


def _classic_config(reader, gguf_arch: str) -> ModelConfig:
    """A `gguf_classic` family's config: its checkpoint's config.json from the file's keys,
    read as the safetensors loader reads it; the file's vocabulary, BOS and EOS ids; Gemma's
    norms as stored (1 + w)."""
    import dataclasses

    from pagoda.runtime.model.hf_loader import model_config

    p = f"{gguf_arch}."
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = int(_field(reader, p + "vocab_size", len(tokens)))
    by_name = {t.name: t for t in reader.tensors}
    cfg = gguf_classic.hf_config(lambda key, d=None: _field(reader, p + key, d), gguf_arch,
                                 set(by_name), vocab, lambda n: gguf_archs._values(by_name[n]))  # fmt: skip
    config = model_config(cfg)
    # the file's rotary scaling (linear, yarn; llama3's as `rope_freqs`) over the config's
    scaling = (None if config.architecture in gguf_gemma4.ARCHS  # (its rope_freqs: its own)
               else _rope_scaling(reader, p, config.head_dim, partial=True))  # fmt: skip
    if scaling is not None:
        partial = (config.rope_scaling or {}).get("partial_rotary_factor")
        scaling = {**scaling, "partial_rotary_factor": partial} if partial else scaling
        config = dataclasses.replace(config, rope_scaling=scaling)
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    family = config.family
    if config.architecture == "gemma":
        family = dataclasses.replace(family, norms_hold_one_plus_w=True)
    return dataclasses.replace(config, bos_token_id=int(bos) if bos is not None else None,
                               eos_token_ids=_eos_ids(reader, gguf_arch, tokens), family=family)  # fmt: skip


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
    if gguf_arch in gguf_classic.ENGINE_ARCH:
        arch = gguf_classic.engine_arch(gguf_arch, lambda key, d=None: _field(reader, p + key, d))
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
