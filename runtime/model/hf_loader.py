"""Hugging Face model directory → (ModelConfig, tensors, Tokenizer, sampling defaults).

Reads `config.json` (for Gemma 3's multimodal checkpoints, its `text_config`), the safetensors
weights (`safetensors_weights`: one file or shards named by `model.safetensors.index.json`, read
lazily; without them, `pytorch_model.bin` or its shards, through `pickle_weights`), `tokenizer.json` (or a tiktoken file: `tiktoken_files`) with the chat template
(`template_files`: a processor's `chat_template.json`, `chat_template.jinja` or
`tokenizer_config.json`), and
`generation_config.json` (EOS ids, sampling defaults).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagoda.runtime import family_options
from pagoda.runtime.config import FamilyConfig, ModelConfig
from pagoda.runtime.model import (
    bpe_files,
    checkpoint_names,
    classifier_config,
    config_keys,
    family_fields,
    moe_families,
    sliding_windows,
    special_tokens,
    spm_files,
    tiktoken_files,
)
from pagoda.runtime.model import deepseek_config as deepseek
from pagoda.runtime.model import llama4_config as llama4
from pagoda.runtime.model import mamba_config as hybrid
from pagoda.runtime.model.checkpoint_check import check_checkpoint
from pagoda.runtime.model.hf_tables import (
    ANYRES_ARCHS,
    DEFAULT_ROPE,
    DEFAULTS,
    EPS,
    GPT_OSS_ROPE,
    HF_ARCHITECTURES,
    INTERNVL_ARCHS,
    NULLABLE,
    PARTIAL_ROTARY,
    PROPORTIONAL_ROTARY,
    REMOTE_CODE_TYPES,
    ROPE_KIND,
    TEXT_MODEL_TYPES,
    WRAPPER_TIES,
)
from pagoda.runtime.model.ops import rope_inv_freq, rope_kind, rotary_dim
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights, has_weight_files
from pagoda.runtime.model.template_files import read_chat_template, read_tool_template
from pagoda.runtime.model.template_files import read_json_object as _read_json
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.pooler_config import BARE_DECODERS, check_not_classifier, check_not_encoder
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    from pagoda.runtime.quantization.fp8 import Fp8Scheme

# generation_config.json keys that become a request's defaults (vLLM's set, less max_tokens)
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACTIVATIONS.update({"gelu_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh"})
_ACTIVATIONS["gelu_new"] = "gelu_tanh"  # (Phi's: the tanh approximation)
_ACTIVATIONS["gelu_fast"] = "gelu_tanh"  # (GPT-NeoX-20B's: the same formula)
_ACTIVATIONS["gelu"] = "gelu"  # exact (Falcon's ungated MLP; a gated one refuses it)
_ACTIVATIONS.update(
    {"relu2": "relu2", "xielu": "xielu", "relu": "relu"}
)  # ungated MLPs' (Arcee's, Apertus')


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def unsupported_architecture(archs: list[str]) -> str:
    """The one line for architectures none of which is served: the closest served names and
    where the whole list is (over 300 names no longer fit the 4,000 bytes of a termination
    message beside a path)."""
    found = ", ".join(archs) if archs else "none named in config.json"
    close = {m for a in archs for m in difflib.get_close_matches(a, HF_ARCHITECTURES, 3, 0.6)}
    hint = f"closest supported: {', '.join(sorted(close))}; " if close else ""
    return (f"unsupported architecture ({found}); {hint}{len(HF_ARCHITECTURES)} architectures "
            'are supported (docs/runtime.md, "Supported models")')  # fmt: skip


def architecture(cfg: Mapping[str, Any]) -> str:
    """`ModelConfig.architecture` of a config.json, or ValueError naming what is supported."""
    archs = cfg.get("architectures") or []
    check_not_classifier(archs)  # (cross-encoder rerankers: one line of their own)
    arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
    if arch is None:
        check_not_encoder(archs)  # (BERT, XLM-R, ModernBERT: one line of their own)
        raise ValueError(unsupported_architecture(archs))
    wrapper = next((a for a in archs if a in HF_ARCHITECTURES), "")
    if cfg.get("model_type") in REMOTE_CODE_TYPES:
        kind = cfg["model_type"]
        raise ValueError(f"{wrapper} of model_type {kind!r} ({REMOTE_CODE_TYPES[kind]}) is not "
                         f"supported: use a revision in transformers' format (model_type "
                         f"{arch!r})")  # fmt: skip
    if wrapper in TEXT_MODEL_TYPES:  # its text model's family
        text = cfg.get("text_config") or {}
        kinds = TEXT_MODEL_TYPES[wrapper]
        kind = text.get("model_type", next(iter(kinds))) if isinstance(text, Mapping) else None
        if kind not in kinds:
            raise ValueError(f"{wrapper} with a text_config of model_type {kind!r} is not "
                             f"supported (supported: {', '.join(kinds)})")  # fmt: skip
        return kinds[kind]
    return arch


def _family(
    cfg: Mapping[str, Any], arch: str, n: int, scaling: Mapping[str, Any] | None = None
) -> FamilyConfig:
    window = sliding_windows.sliding_window(cfg, arch)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden activation {act!r}")
    layers = sliding_windows.window_layers(cfg, arch, n, window)
    fields: dict[str, Any] = {
        "sliding_window": window,
        "window_layers": layers,
        "hidden_act": _ACTIVATIONS[act],
    }
    if arch in family_fields.FIELDS:  # what the family sets (model/family_fields.py)
        fields.update(family_fields.FIELDS[arch](cfg, arch, n, window, layers, scaling))
    fields.update(classifier_config.family_fields(cfg))  # (a decoder's `score` head)
    gated = fields.get("gated_mlp", True)  # (ungated experts: the family's own, Ergo's)
    if fields.get("num_experts") and gated and fields["hidden_act"] != "silu":  # fused MoE's
        raise ValueError(f"hidden activation {act!r} in a mixture of experts is not supported "
                         "(experts run SwiGLU: silu)")  # fmt: skip
    return FamilyConfig(**fields)


def _tied(top: Mapping[str, Any], cfg: Mapping[str, Any]) -> bool:
    """Whether the LM head is the embedding: a multimodal checkpoint's top-level flag decides
    (transformers ties by it, whatever its text_config says; by default true, EXAONE 4.5's
    false: `WRAPPER_TIES`); else the text model's (its family's default when left out)."""
    if "text_config" in top:
        return bool(top.get("tie_word_embeddings", WRAPPER_TIES.get(top.get("model_type"), True)))
    if any(a in BARE_DECODERS for a in top.get("architectures") or ()):
        return True  # no LM head stored (an embedding model's; the pooling runner never runs it)
    return bool(cfg.get("tie_word_embeddings", False))


def read_config(model_dir: Path) -> ModelConfig:
    top = _read_json(model_dir / "config.json")
    if not top:
        raise ValueError(f"{model_dir} has no config.json")
    arch = architecture(top)
    try:
        return _model_config(model_dir, top, arch)
    except KeyError as e:  # a field every checkpoint of the family has, left out
        where = "config.json's text_config" if "text_config" in top else "config.json"
        raise ValueError(f"{where} lacks {e.args[0]!r}, which a {arch} model needs") from None


def model_config(top: dict[str, Any]) -> ModelConfig:
    """The `ModelConfig` of a config.json's contents alone (no generation_config.json, no
    quantization): a GGUF's families read as their checkpoints (`gguf_classic`)."""
    return _model_config(None, top, architecture(top))


def _model_config(model_dir: Path | None, top: dict[str, Any], arch: str) -> ModelConfig:
    if model_dir is not None:
        read_quantization(model_dir)  # a quantization it cannot load fails with the metadata
    cfg = config_keys.renamed(top.get("text_config") or top, arch)  # a wrapper's: its text model
    cfg = {**DEFAULTS.get(arch, {}),
           **{k: v for k, v in cfg.items() if v is not None or k in NULLABLE.get(arch, ())}}  # fmt: skip
    cfg = config_keys.derived(cfg, arch)
    if model_dir is not None and arch in ("bert", "roberta", "modernbert"):  # (s-t's length)
        from pagoda.runtime.model.bert_config import read_side_files

        cfg.update(read_side_files(model_dir, cfg))
    if model_dir is not None:  # a decoder classifier's tokens (Qwen3-Reranker's "no", "yes")
        cfg.update(classifier_config.read_side_files(model_dir, cfg))
    if arch == "gpt_oss" and not cfg.get("rope_scaling") and not cfg.get("rope_parameters"):
        cfg["rope_scaling"] = dict(GPT_OSS_ROPE)
    if arch in DEFAULT_ROPE and not {"rope_parameters", "rope_scaling"} & set(cfg):
        # (a top-level rope_theta alone does not count: transformers takes the default's)
        cfg["rope_parameters"] = DEFAULT_ROPE[arch]
    if arch in hybrid.DEFAULTS:  # Granite 4.0's shared MLP width, Bamba's half rotary,
        cfg = {**cfg, **hybrid.overrides(cfg, arch)}  # Nemotron-H's layers from their types
    gen = {} if model_dir is None else _read_json(model_dir / "generation_config.json")
    heads = int(cfg["num_attention_heads"])
    layers = int(cfg["num_hidden_layers"])
    by_kind = ROPE_KIND.get(arch)  # the rotary of one layer kind (`rope_parameters` by kind)
    if (model_dir is not None and not family_options.tested(arch, "fp8_checkpoint")
            and read_quantization(model_dir) is not None):  # fmt: skip
        family_options.refuse(arch, "fp8_checkpoint")
    if arch == "deepseek_v4":  # its own config reading (model/dsv4_config.py)
        from pagoda.runtime.model.dsv4_config import model_config as dsv4_model_config

        ids = (gen.get("eos_token_id"), top.get("eos_token_id"), cfg.get("eos_token_id"))
        eos = tuple(dict.fromkeys(i for v in ids for i in _as_ids(v)))
        return dsv4_model_config(cfg, eos)
    rope_theta, scaling = family_fields.read_rope(cfg, by_kind, arch == "phi3")
    if arch == "llama4":  # the dense MLP's width
        cfg = {**cfg, **llama4.overrides(cfg)}
    if arch == "gemma3n":  # the wrapper's embedders of image and audio token ids
        from pagoda.runtime.model.gemma3n_config import wrapper_embedders

        cfg = {**cfg, "multimodal_embedders": wrapper_embedders(top)}
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    rope_dim = head_dim
    latent = (*deepseek.ARCHITECTURES.values(), "minicpm3", "kimi_linear", "bailing_hybrid", "glm5_next",
              "longcat_flash")  # fmt: skip
    if arch in latent:  # latent attention: one row
        head_dim, kv_heads = deepseek.head_dim(cfg, arch), 1  # per token
        # (the dims that rotate; none on GLM-5-Next's NoPE layers: the checks below as a row's)
        rope_dim = int(cfg["qk_rope_head_dim"]) or head_dim
        if arch == "dots3_note_text":  # its rotary by layer kind, 80M by default
            rope_theta, scaling = deepseek.dots3_rope(cfg)
    if arch in moe_families.ROPE:  # the family's own reading (Hunyuan's NTK alpha)
        rope_theta, scaling = moe_families.ROPE[arch](cfg, rope_theta, scaling, head_dim)
    if rope_kind(scaling) == "proportional" and arch not in PROPORTIONAL_ROTARY:
        raise ValueError(f"rope_scaling type 'proportional' is not supported for {arch} (tested "
                         f"for {', '.join(PROPORTIONAL_ROTARY)})")  # fmt: skip
    rope_inv_freq(rope_dim, rope_theta, scaling)  # an unsupported rope_scaling fails here
    rope_inv_freq(rope_dim, rope_theta, scaling, long=True)  # longrope: its long factors too
    if arch not in PARTIAL_ROTARY and rotary_dim(rope_dim, scaling) != rope_dim:
        raise ValueError(f"a partial rotary embedding (partial_rotary_factor "
                         f"{scaling['partial_rotary_factor']}) is not supported for {arch}")  # fmt: skip
    # every id that ends generation (`special_tokens`): generation_config.json's, a multimodal
    # config's own (Gemma 3's [1, 106]: <end_of_turn> too), its text_config's or the family
    # default; the tokenizer's `eos_token` joins them in `read_tokenizer`
    ids = (gen.get("eos_token_id"), top.get("eos_token_id"), cfg.get("eos_token_id"))
    eos = tuple(dict.fromkeys(i for v in ids for i in _as_ids(v)))
    vision, served = _read_vision(arch, top, model_dir)  # (served: the model built)
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get(EPS.get(arch, "rms_norm_eps"), 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=_tied(top, cfg),
        attention_bias=arch in ("qwen2", "qwen2_vl", "qwen2_5_vl", "llava_onevision", "internvl")
        or bool(cfg.get("attention_bias", cfg.get("qkv_bias", cfg.get("use_bias")))),
        bos_token_id=cfg.get("bos_token_id", top.get("bos_token_id")),
        eos_token_ids=eos,
        architecture=served,
        family=_family(cfg, arch, layers, scaling),
        vision=vision,
    )


def _read_vision(arch: str, top: dict[str, Any], model_dir: Path | None) -> tuple[Any, str]:
    """(the image side of a vision-language checkpoint, or None: read text-only; the
    architecture of the model built): each family's reader in `multimodal/`, imported only
    for its family."""
    vision, served = None, arch
    pixtral = (top.get("vision_config") or {}).get("model_type") == "pixtral"
    if pixtral and arch in ("llava", "mistral") and model_dir is not None:  # Pixtral's images
        from pagoda.runtime.multimodal.pixtral_config import read_pixtral

        vision = read_pixtral(top, model_dir)  # (Mistral 3's, LLaVA's: model/pixtral.py)
        if vision is not None and arch == "mistral":  # Mistral 3 with its images
            served = "mistral3"
            if read_quantization(model_dir) is not None:
                family_options.refuse(served, "fp8_checkpoint")
    elif arch == "llava":  # the image side: the tower, projector, processor (multimodal/config.py)
        from pagoda.runtime.multimodal.config import read_llava

        vision = read_llava(top, model_dir)
    elif arch in ("qwen2_vl", "qwen2_5_vl"):  # (multimodal/qwen2_vl_config.py)
        from pagoda.runtime.multimodal.qwen2_vl_config import read_qwen2_vl

        vision = read_qwen2_vl(arch, top, model_dir)
    elif arch in ("qwen3_vl", "qwen3_vl_moe"):  # (multimodal/qwen3_vl_config.py)
        from pagoda.runtime.multimodal.qwen3_vl_config import read_qwen3_vl

        vision = read_qwen3_vl(top, model_dir)
    elif arch == "idefics3":  # Idefics3's, SmolVLM's (multimodal/idefics3_config.py)
        from pagoda.runtime.multimodal.idefics3_config import read_idefics3

        vision = read_idefics3(top, model_dir)
    elif arch == "llama4" and model_dir is not None:  # (multimodal/llama4_vision_config.py)
        from pagoda.runtime.multimodal.llama4_vision_config import read_llama4_vision

        vision = read_llama4_vision(top, model_dir)
    elif arch in INTERNVL_ARCHS:  # (multimodal/internvl_config.py)
        from pagoda.runtime.multimodal.internvl_config import read_internvl

        vision = read_internvl(top, model_dir)
    elif arch in ANYRES_ARCHS:  # (multimodal/anyres_config.py)
        from pagoda.runtime.multimodal.anyres_config import read_anyres

        vision = read_anyres(ANYRES_ARCHS[arch], top, model_dir)
    if arch == "llama4" and vision is not None:  # (Llama 4 reading images: its own row)
        served = "llama4_vision"
    gemma3_images = "vision_config" in top and model_dir is not None
    if gemma3_images and top.get("architectures", [None])[0] == "Gemma3ForConditionalGeneration":
        from pagoda.runtime.multimodal.gemma3 import read_gemma3

        vision = read_gemma3(top, model_dir)  # its SigLIP tower (model/gemma3_mm.py)
    return vision, served


def read_quantization(model_dir: Path) -> Fp8Scheme | None:
    """The FP8 format config.json's `quantization_config` declares (None: a 16/32-bit
    checkpoint); ValueError, one line, for a quantization this runtime does not load."""
    from pagoda.runtime.quantization.fp8 import scheme_from_hf_config

    return scheme_from_hf_config(_read_json(model_dir / "config.json"))


def read_sampling_defaults(model_dir: Path) -> dict[str, float | int]:
    """generation_config.json's sampling fields (`SAMPLING_DEFAULTS`) that are set, for the
    requests that leave them out (as vLLM's `generation_config="auto"`)."""
    gen = _read_json(model_dir / "generation_config.json")
    out: dict[str, float | int] = {}
    for key in SAMPLING_DEFAULTS:
        value = gen.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(value) if key == "top_k" else float(value)
    if out.get("top_k") == 0:  # transformers' "off"
        out["top_k"] = -1
    return out


def read_weights(model_dir: Path) -> SafetensorsWeights:
    return SafetensorsWeights.open(model_dir)


def read_tokenizer(model_dir: Path, config: ModelConfig) -> Tokenizer:
    """tokenizer.json, else a tiktoken BPE file with known tokenizer code (`tiktoken_files`:
    Kimi K2, Moonlight), else GPT-2's vocab.json and merges.txt (`bpe_files`: OPT's), else a
    SentencePiece `tokenizer.model` (`spm_files`: Llama 2, InternLM3); ValueError, one line,
    for a directory with none of them."""
    path = model_dir / "tokenizer.json"
    tcfg = _read_json(model_dir / "tokenizer_config.json")
    sort_tool_keys = spm = False
    if path.exists():
        hf_tok = HFTokenizer.from_file(str(path))
    elif (model_dir / tiktoken_files.TIKTOKEN_FILE).exists():
        hf_tok = tiktoken_files.read_tiktoken_dir(model_dir, tcfg)
        sort_tool_keys = tiktoken_files.sorts_tool_keys(model_dir, tcfg)
    elif bpe_files.has_bpe_files(model_dir):  # GPT-2's vocab.json + merges.txt (OPT's)
        hf_tok = bpe_files.read_bpe_dir(model_dir, tcfg)
    elif spm := (model_dir / spm_files.SPM_FILE).exists():
        hf_tok = spm_files.read_spm_dir(model_dir, tcfg)
    else:
        raise ValueError(f"{model_dir} has no tokenizer.json (nor {tiktoken_files.TIKTOKEN_FILE}, "
                         f"{bpe_files.VOCAB} with {bpe_files.MERGES}, or {spm_files.SPM_FILE})")  # fmt: skip
    template = read_chat_template(model_dir, tcfg)  # a processor's file first, as vLLM
    return Tokenizer(
        hf_tok,
        chat_template=template,
        tool_chat_template=read_tool_template(model_dir, tcfg),
        bos_token_id=config.bos_token_id,
        eos_token_ids=special_tokens.stop_ids(config.eos_token_ids, tokenizer=hf_tok, tcfg=tcfg),
        # transformers' Llama tokenizer (and InternLM3's) add BOS unless told not to
        add_bos_token=bool(tcfg.get("add_bos_token", True))
        if spm
        else _adds_bos(hf_tok, config.bos_token_id, tcfg),
        add_eos_token=spm and bool(tcfg.get("add_eos_token", False)),
        sort_tool_keys=sort_tool_keys,
        template_tokens=special_tokens.template_tokens(tcfg),
    )


def _adds_bos(tok: HFTokenizer, bos: int | None, tcfg: Mapping[str, Any]) -> bool:
    """Whether a prompt's text gets BOS first: what tokenizer.json's post-processor does (Llama
    3, Gemma), as transformers 5 decides with a tokenizer.json; else tokenizer_config.json's
    add_bos_token."""
    if bos is not None and tok.post_processor is not None:
        with_special = tok.encode("a", add_special_tokens=True).ids
        if len(with_special) > len(tok.encode("a", add_special_tokens=False).ids):
            return with_special[0] == bos
    return bool(tcfg.get("add_bos_token", False))


def check_weights(
    model_dir: Path, config: ModelConfig, weights: SafetensorsWeights | None = None
) -> SafetensorsWeights | None:
    """`checkpoint_check.check_checkpoint` on the directory's safetensors headers (or its
    pickles' tensors, memory-mapped): ValueError, one line, where the weights do not match
    config.json. Returns the opened weights; None for a directory without weight files (a
    config alone: what is checked before loading)."""
    if weights is None:
        if not has_weight_files(model_dir):
            return None
        weights = read_weights(model_dir)
    try:
        _split_and_check(model_dir, config, weights)
    except ValueError as e:  # the tensors as the files name them (GPT-style names, Falcon's, ...)
        raise ValueError(weights.in_stored_names(str(e))) from e
    return weights


def _split_and_check(model_dir: Path, config: ModelConfig, weights: SafetensorsWeights) -> None:
    checkpoint_names.list_as_read(weights, config)  # the family's renames and splits
    if config.family.falcon_qkv:  # the fused query_key_value, by layout (falcon.py)
        from pagoda.runtime.model.falcon import split_qkv

        split_qkv(weights, config)
    scheme = read_quantization(model_dir)
    weights.fp8_block = None if scheme is None else scheme.block  # block-wise FP8 scales' tile
    headers = {name: weights.dtype_and_shape(name) for name in weights}
    try:
        check_checkpoint(config, headers, weights.fp8_block)
    except ValueError as e:  # (LongCat-Flash's sublayers' names: the files' own)
        if config.architecture != "longcat_flash":
            raise
        from pagoda.runtime.model.longcat_flash_config import stored_names

        raise ValueError(stored_names(str(e))) from e


def untie_a_distinct_head(config: ModelConfig, weights: SafetensorsWeights | None) -> ModelConfig:
    """`config` untied where it ties the LM head to the embedding but the checkpoint holds a
    head of its own that differs (as transformers 5 loads it, and `LlamaModel` builds it):
    Mistral-Small-3.1/3.2's config.json leaves tie_word_embeddings out (Mistral3Config's
    default: true) beside a distinct `lm_head.weight`. The first rows are compared (a few KiB
    read): the model compares the whole tensors at load, where rows alike further on tie it."""
    if weights is None or not config.tie_word_embeddings:
        return config
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    if head not in weights or embed not in weights:
        return config
    if weights.dtype_and_shape(head) != weights.dtype_and_shape(embed):
        return config  # (check_checkpoint refuses a head of another shape)
    import torch

    rows = min(16, weights.dtype_and_shape(head)[1][0])
    if torch.equal(weights.rows(head, rows), weights.rows(embed, rows)):
        return config
    return dataclasses.replace(config, tie_word_embeddings=False)


def load_hf_dir(
    model_dir: str | Path,
) -> tuple[ModelConfig, SafetensorsWeights, Tokenizer, dict[str, float | int]]:
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    weights = check_weights(model_dir, config, read_weights(model_dir))
    config = untie_a_distinct_head(config, weights)
    tokenizer = read_tokenizer(model_dir, config)
    config = dataclasses.replace(config, eos_token_ids=tokenizer.eos_token_ids)  # + its eos_token
    return config, weights, tokenizer, read_sampling_defaults(model_dir)
