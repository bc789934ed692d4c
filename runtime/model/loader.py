"""Resolve `--model` (a built-in name, a GGUF file, an HF directory, hf:// or s3://) and load it.

What each format and architecture covers: docs/runtime.md, "Supported models".
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.cpu.quantized import QuantizedWeight
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.options import BUILTIN_MODELS

if TYPE_CHECKING:
    from pagoda.runtime.quantization.fp8 import Fp8Scheme

__all__ = ["BUILTIN_MODELS", "LoadedModel", "load_model", "read_model_config", "read_tokenizer"]


@dataclass
class LoadedModel:
    name: str
    path: str
    config: ModelConfig
    weights: Mapping[str, torch.Tensor]  # GGUF: dequantized when read (`GGUFWeights`)
    tokenizer: Tokenizer
    # raw GGUF blocks of the weights `qgemm` can read in place (float32 CPU models use them)
    quantized: Mapping[str, QuantizedWeight] = field(default_factory=dict)  # read lazily
    # generation_config.json's sampling fields: defaults for requests that leave them out
    sampling_defaults: Mapping[str, float | int] = field(default_factory=dict)
    # the checkpoint's own FP8 format (config.json's quantization_config), None: 16/32-bit
    fp8_scheme: Fp8Scheme | None = None


def builtin_model_path(name: str) -> Path:
    """Path of an embedded model file shipped inside a Python package (no downloads)."""
    package, filename = BUILTIN_MODELS[name].package, BUILTIN_MODELS[name].filename
    # find_spec locates the package without importing it (its __init__ pulls in llm/llama_cpp)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"built-in model {name!r} needs the PyPI package {package.replace('_', '-')}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / filename


def resolve_model_path(model: str) -> Path:
    if model in BUILTIN_MODELS:
        return builtin_model_path(model)
    if model.startswith(("hf://", "s3://")):  # the download dir's copy, fetched if missing
        from pagoda.runtime.model.sources.fetch import resolve_model

        return Path(resolve_model(model))
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(BUILTIN_MODELS)
        raise ValueError(
            f"model {model!r} is neither a built-in name ({known}) nor an existing path"
        )
    return path


def read_model_config(model: str) -> ModelConfig:
    """The model's config without its weights (a start-up check: seconds faster than loading).

    Any failure becomes a ValueError with one readable line naming the model.
    """
    path = resolve_model_path(model)
    try:
        if path.is_file() and path.suffix == ".gguf":
            from pagoda.runtime.model.gguf_loader import read_config as read_gguf_config
            from pagoda.runtime.model.gguf_reader import open_reader

            return read_gguf_config(open_reader(path))  # parsed once, shared with later reads
        if path.is_dir():
            from pagoda.runtime.model.hf_loader import check_weights, untie_a_distinct_head
            from pagoda.runtime.model.hf_loader import read_config as read_hf_config

            config = read_hf_config(path)
            weights = check_weights(path, config)  # the safetensors headers against config.json
            return untie_a_distinct_head(config, weights)
    except ValueError as e:
        raise ValueError(f"model {model!r}: {e}") from e
    except Exception as e:  # a truncated or foreign file: any parser error
        raise ValueError(f"model {model!r}: cannot read {path}: {type(e).__name__}: {e}") from e
    raise ValueError(f"model path {path} must be a .gguf file or a Hugging Face directory")


def read_tokenizer(model: str) -> Tokenizer:
    """The tokenizer `load_model(model)` loads, without the weights: what the API process of
    `pagoda serve` reads while the engine process loads the model (~0.1 s for a GGUF)."""
    path = resolve_model_path(model)
    if path.is_file() and path.suffix == ".gguf":
        from pagoda.runtime.model import gguf_loader
        from pagoda.runtime.model.gguf_reader import take_reader

        reader = take_reader(path)  # the checks' reader, if shared: the last read of the file
        return gguf_loader.read_tokenizer(reader, gguf_loader.read_config(reader))
    if path.is_dir():
        from pagoda.runtime.model import hf_loader

        return hf_loader.read_tokenizer(path, hf_loader.read_config(path))
    raise ValueError(f"model path {path} must be a .gguf file or a Hugging Face directory")


def load_model(model: str) -> LoadedModel:
    path = resolve_model_path(model)
    if path.is_file() and path.suffix == ".gguf":
        from pagoda.runtime.model.gguf_loader import load_gguf

        config, weights, tokenizer, quantized = load_gguf(path)
        defaults: Mapping[str, float | int] = {}
        scheme = None
    elif path.is_dir():
        from pagoda.runtime.model.hf_loader import load_hf_dir, read_quantization

        config, weights, tokenizer, defaults = load_hf_dir(path)
        quantized = weights.blocks()  # 16-bit matrices, read in place by float32 CPU models
        scheme = read_quantization(path)
    else:
        raise ValueError(f"model path {path} must be a .gguf file or a Hugging Face directory")
    return LoadedModel(
        name=model,
        path=str(path),
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        quantized=quantized,
        sampling_defaults=defaults,
        fp8_scheme=scheme,
    )
