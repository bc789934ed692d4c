"""LoRA's flags read once into a frozen config: NAME=PATH and vLLM's JSON form, defaults,
refusals in one line (flags without --enable-lora, bad sizes, options LoRA does not run with)."""

from __future__ import annotations

import dataclasses

import pytest
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.lora_config import LoRAConfig, LoRARequest
from pagoda.runtime.server.cli import build_parser, server_config


def test_flags_parse_into_one_config():
    args = build_parser().parse_args([
        "--enable-lora", "--max-loras", "3", "--max-lora-rank", "32", "--lora-modules",
        "sql=/a/sql", '{"name": "chat", "path": "/a/chat", "base_model_name": "m"}',
    ])  # fmt: skip
    cfg = server_config(args).lora
    assert cfg == LoRAConfig(3, 32, 3, (LoRARequest("sql", 1, "/a/sql"),
                                        LoRARequest("chat", 2, "/a/chat", "m")))  # fmt: skip
    from pagoda.runtime import options

    engine = EngineConfig.create("m", **options.engine_kwargs(vars(args)))
    assert engine.lora == cfg  # the engine and the server read the same adapters and ids
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_loras = 4  # type: ignore[misc]
    assert server_config(build_parser().parse_args([])).lora is None
    assert EngineConfig.create("m", enable_lora=True).lora == LoRAConfig(1, 16, 1, ())


NGRAM = {"method": "ngram", "num_speculative_tokens": 2}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"lora_modules": ["a=/p"]}, "--lora-modules given without --enable-lora"),
        ({"enable_lora": True, "lora_modules": ["a/p"]}, "expected NAME=PATH"),
        ({"enable_lora": True, "lora_modules": ['{"name": "a"}']}, "JSON needs name and path"),
        ({"enable_lora": True, "lora_modules": ["a=/p", "a=/q"]}, "given twice: a"),
        ({"enable_lora": True, "max_lora_rank": 0}, "max_lora_rank must be an integer"),
        ({"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2}, "at least max_loras"),
        ({"enable_lora": True, "quantization": "fp8"}, "not supported with --quantization fp8"),
        ({"enable_lora": True, "speculative_config": NGRAM}, "not supported with speculative"),
    ],
)
def test_refused_in_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words) as e:
        EngineConfig.create("m", **kwargs)
    assert "\n" not in str(e.value)


def test_tensor_parallelism_takes_adapters():
    """(tests/runtime/lora/test_lora_tp.py runs it.)"""
    cfg = EngineConfig.create("m", enable_lora=True, tensor_parallel_size=2)
    assert cfg.lora == LoRAConfig() and cfg.parallel.tensor_parallel_size == 2


def test_lora_request_checks_its_fields():
    assert LoRARequest("a", 1, "/p").adapter_id == 1
    for bad in [("", 1, "/p"), ("a", 0, "/p"), ("a", True, "/p"), ("a", 1, "")]:
        with pytest.raises(ValueError):
            LoRARequest(*bad)


def test_model_families_refused_in_one_line():
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.lora_config import check_model

    mc = ModelConfig(300, 64, 128, 2, 4, 2, 16, architecture="llama")
    check_model(mc)
    for arch in ("gemma2", "mixtral", "qwen3_moe"):
        with pytest.raises(ValueError, match=f"not supported for '{arch}' models"):
            check_model(dataclasses.replace(mc, architecture=arch))
