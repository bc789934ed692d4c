"""Hugging Face model directory → (ModelConfig, tensors, Tokenizer) for Llama/Mistral/Qwen2."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.tokenizer import Tokenizer
from tokenizers import Tokenizer as HFTokenizer

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def read_config(model_dir: Path) -> ModelConfig:
    cfg = _read_json(model_dir / "config.json")
    if not cfg:
        raise ValueError(f"{model_dir} has no config.json")
    archs = cfg.get("architectures") or []
    arch = next((SUPPORTED[a] for a in archs if a in SUPPORTED), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {archs}; supported: {', '.join(SUPPORTED)}")
    gen = _read_json(model_dir / "generation_config.json")
    heads = int(cfg["num_attention_heads"])
    rope = cfg.get("rope_parameters") or {}
    rope_theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    scaling = cfg.get("rope_scaling")
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = rope
    eos = _as_ids(gen.get("eos_token_id")) or _as_ids(cfg.get("eos_token_id"))
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos,
        architecture=arch,
    )


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return weights


def read_tokenizer(model_dir: Path, config: ModelConfig) -> Tokenizer:
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise ValueError(f"{model_dir} has no tokenizer.json")
    tcfg = _read_json(model_dir / "tokenizer_config.json")
    template = tcfg.get("chat_template")
    jinja = model_dir / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    if isinstance(template, list):  # named templates: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return Tokenizer(
        HFTokenizer.from_file(str(path)),
        chat_template=template,
        bos_token_id=config.bos_token_id,
        eos_token_ids=config.eos_token_ids,
        add_bos_token=bool(tcfg.get("add_bos_token", False)),
    )


def load_hf_dir(model_dir: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    return config, read_weights(model_dir), read_tokenizer(model_dir, config)
