"""Frozen, validated configuration objects.

Every knob a user can set is checked once here, in ``__post_init__``, so the engine never meets a
nonsensical value at run time. Errors are ``ValueError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MODEL = "smollm2-135m"


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family decoder (Llama, Mistral, Qwen2, SmolLM)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q/k/v projections
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            _positive(name, getattr(self, name))
        for name in ("num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            _positive(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")

    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token through every weight, the LM head included (2 per MAC)."""
        emb_lookup = self.vocab_size * self.hidden_size
        tied_extra = 0 if self.tie_word_embeddings else emb_lookup
        return 2 * (self.num_params - tied_extra)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache. The block count comes from a memory budget, never a constant."""

    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes; default on CPU: 2 GiB
    gpu_memory_utilization: float = 0.9  # fraction of free GPU memory after loading weights
    enable_prefix_caching: bool = True
    num_blocks_override: int | None = None  # tests: an exact pool size

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(
                f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size!r}"
            )
        if self.kv_cache_memory is not None:
            _positive("kv_cache_memory", self.kv_cache_memory)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.num_blocks_override is not None:
            _positive("num_blocks_override", self.num_blocks_override)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits per step."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's context length
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            _positive(name, getattr(self, name))
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if (
            not self.enable_chunked_prefill
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len}) "
                "so that any prompt fits in one step"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the weights; built by `EngineConfig.create`."""

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    seed: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    enable_cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}"
            )
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")

    @classmethod
    def create(cls, model: str = DEFAULT_MODEL, **kwargs: Any) -> EngineConfig:
        """Flat keyword arguments (as `LLM(...)` and the CLI take them) → nested config."""
        cache_keys = {f for f in CacheConfig.__dataclass_fields__}
        sched_keys = {f for f in SchedulerConfig.__dataclass_fields__}
        top_keys = {f for f in cls.__dataclass_fields__} - {"cache", "scheduler", "model"}
        unknown = set(kwargs) - cache_keys - sched_keys - top_keys
        if unknown:
            raise ValueError(f"unknown engine argument(s): {', '.join(sorted(unknown))}")
        cache = CacheConfig(**{k: v for k, v in kwargs.items() if k in cache_keys})
        sched = SchedulerConfig(**{k: v for k, v in kwargs.items() if k in sched_keys})
        top = {k: v for k, v in kwargs.items() if k in top_keys}
        return cls(model=model, cache=cache, scheduler=sched, **top)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        """auto: bfloat16 on CUDA and on CPUs with native bf16 matmul (AMX/AVX512-BF16), else float32."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if self.torch_device().type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 natively (AMX or AVX512-BF16): bf16 is then ~4x fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags
