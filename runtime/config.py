"""The engine's frozen, validated settings: `CacheConfig`, `SchedulerConfig`, `EngineConfig`,
and the device and dtype they resolve to. What a checkpoint describes (`ModelConfig`,
`FamilyConfig`) is in `model_config.py`, re-exported here.

Every knob a user can set is checked once here, in ``__post_init__``, so the engine never meets a
nonsensical value at run time. Errors are ``ValueError`` naming the field. Names, choices and
defaults come from `pagoda.runtime.options` (the contract shared with the operator).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from pagoda.runtime import option_rules, options
from pagoda.runtime.lora_config import LORA_KWARGS, LoRAConfig
from pagoda.runtime.model_config import FamilyConfig, ModelConfig
from pagoda.runtime.multimodal.chat_videos import VideoIO
from pagoda.runtime.multimodal.config import parse_limits
from pagoda.runtime.options import DEFAULT_MODEL
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.pooler_config import PoolerConfig
from pagoda.runtime.spec.config import SpeculativeConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
assert ("auto", *DTYPES) == options.DTYPES
__all__ = [
    "DEFAULT_MODEL", "CacheConfig", "EngineConfig", "FamilyConfig", "ModelConfig", "SchedulerConfig",
    "SpeculativeConfig",
]  # fmt: skip


def _positive(name: str, value: int) -> None:
    """A positive integer (a bool is not one), at most `option_rules.SIZE_LIMITS[name]` if named there."""
    option_rules.check_int(name, value)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache. The block count comes from a memory budget, never a constant."""

    block_size: int = options.DEFAULT_BLOCK_SIZE
    kv_cache_memory: int | None = None  # bytes; default on CPU: 2 GiB
    gpu_memory_utilization: float = 0.9  # fraction of free GPU memory after loading weights
    enable_prefix_caching: bool = options.DEFAULT_ENABLE_PREFIX_CACHING
    num_blocks_override: int | None = None  # tests: an exact pool size
    # auto (the model's), int8 (CPU attention) or fp8 (E4M3, Triton attention on FP8 GPUs)
    kv_cache_dtype: str = options.DEFAULT_KV_CACHE_DTYPE

    def __post_init__(self) -> None:
        option_rules.check_integers(self, ("block_size",))
        option_rules.check_booleans(self, ("enable_prefix_caching",))
        if self.block_size not in options.BLOCK_SIZES:
            sizes = ", ".join(map(str, options.BLOCK_SIZES))
            raise ValueError(f"block_size must be one of {sizes}, got {self.block_size!r}")
        if self.kv_cache_memory is not None:
            _positive("kv_cache_memory", self.kv_cache_memory)
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, int | float) or not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
        if self.num_blocks_override is not None:
            _positive("num_blocks_override", self.num_blocks_override)
        alias = options.KV_CACHE_DTYPE_ALIASES.get(self.kv_cache_dtype)
        if alias is not None:  # vLLM's "fp8_e4m3" is our "fp8"
            object.__setattr__(self, "kv_cache_dtype", alias)
        if self.kv_cache_dtype not in options.KV_CACHE_DTYPES:
            choices = ", ".join(options.KV_CACHE_DTYPES)
            raise ValueError(
                f"kv_cache_dtype must be one of {choices}, got {self.kv_cache_dtype!r}"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits per step.

    `max_num_batched_tokens=None` picks the default: 2048 with chunked prefill; without it,
    max(2048, max_model_len) so that any prompt fits in one step (resolved once max_model_len is
    known; the engine replaces it with the model's context length when it was None).
    """

    max_num_seqs: int = options.DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: the model's context length
    enable_chunked_prefill: bool = options.DEFAULT_ENABLE_CHUNKED_PREFILL
    # the largest prefill chunk while other requests run or wait; 0: off; None: by device,
    # resolved by `EngineConfig.with_device_defaults` (a bare Scheduler treats None as off)
    long_prefill_token_threshold: int | None = options.DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    # set by __post_init__: the user gave no max_num_batched_tokens (so replace() re-resolves it)
    auto_batched_tokens: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        option_rules.check_booleans(self, ("enable_chunked_prefill",))
        _positive("max_num_seqs", self.max_num_seqs)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.max_num_batched_tokens is None or self.auto_batched_tokens:
            object.__setattr__(self, "auto_batched_tokens", True)
            values = self._values(options.DEFAULT_MAX_NUM_BATCHED_TOKENS)
            for rule in option_rules.ENGINE_RULES:  # the smallest default that fits every rule
                values = rule.lift(values)
            object.__setattr__(self, "max_num_batched_tokens", values["max_num_batched_tokens"])
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        cap = self.long_prefill_token_threshold
        if cap is not None:
            option_rules.check_int("long_prefill_token_threshold", cap, 0)
            rule = option_rules.CHUNK_CAP_NEEDS_CHUNKED_PREFILL
            if not rule.holds(vars(self)):
                raise ValueError(rule.error(vars(self)))
        values = self._values(self.max_num_batched_tokens)
        for rule in option_rules.ENGINE_RULES:
            if not rule.holds(values):
                raise ValueError(rule.error(values))

    def _values(self, max_num_batched_tokens: int) -> dict[str, Any]:
        """The fields by flag name, as `option_rules.ENGINE_RULES` read them."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "enable_chunked_prefill": self.enable_chunked_prefill,
        }


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the weights; built by `EngineConfig.create`."""

    model: str = DEFAULT_MODEL
    dtype: str = options.DEFAULT_DTYPE
    device: str = options.DEFAULT_DEVICE
    attention_backend: str = options.DEFAULT_ATTENTION_BACKEND
    seed: int = options.DEFAULT_SEED
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    enable_cuda_graphs: bool = True
    batch_invariant: bool = options.DEFAULT_BATCH_INVARIANT
    async_scheduling: bool | None = options.DEFAULT_ASYNC_SCHEDULING  # None: on with CUDA
    # refuse a checkpoint whose tensors hold NaN/Inf at load (pagoda.runtime.model.finite_check)
    check_weights: bool = True
    # "fp8": quantize a 16-bit checkpoint's linear layers at load (None: the checkpoint's own
    # quantization, if any; see pagoda.runtime.quantization.fp8)
    quantization: str | None = None
    # tensor parallelism: ranks, nodes, rendezvous (pagoda.runtime.distributed)
    parallel: Parallelism = field(default_factory=Parallelism)
    # speculative decoding (n-gram drafts, `pagoda.runtime.spec`): a dict or the flag's JSON
    # text is read into a SpeculativeConfig here; None: off
    speculative_config: SpeculativeConfig | None = None
    # LoRA adapters (`--enable-lora` and its flags, `pagoda.runtime.lora`); None: off
    lora: LoRAConfig | None = None
    # generate, pooling (an embedding model: `engine/pooling.py`) or auto (the checkpoint
    # decides, `pooler_config.resolve`, when the engine or the server reads it)
    runner: str = "auto"
    # the pooling runner's pooling: a dict or the flag's JSON text is read into a PoolerConfig
    pooler_config: PoolerConfig | None = None
    # images per prompt a vision model takes (vLLM's --limit-mm-per-prompt: a dict or its
    # JSON text, read into {"image": N}; None: vLLM's default, `multimodal.config`)
    limit_mm_per_prompt: Any = None
    # the image processor's settings (vLLM's --mm-processor-kwargs: a dict or its JSON text,
    # read into a dict; None: the checkpoint's); its keys are checked against the family's
    # processor where the model is read (`multimodal.processor_kwargs.apply`)
    mm_processor_kwargs: Any = None
    # how the server samples a chat request's videos (vLLM's --media-io-kwargs: a dict or its
    # JSON text, read into a `chat_videos.VideoIO`; None: 32 frames a video)
    media_io_kwargs: Any = None

    def __post_init__(self) -> None:
        option_rules.check_integers(self, ("seed",))
        object.__setattr__(self, "limit_mm_per_prompt", parse_limits(self.limit_mm_per_prompt))
        kwargs = option_rules.parse_processor_kwargs(self.mm_processor_kwargs)
        object.__setattr__(self, "mm_processor_kwargs", kwargs)
        if not isinstance(self.media_io_kwargs, VideoIO):
            media = option_rules.parse_media_io_kwargs(self.media_io_kwargs)
            object.__setattr__(self, "media_io_kwargs", VideoIO.parse(media))
        if self.runner not in options.RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(options.RUNNERS)}, got "
                             f"{self.runner!r}")  # fmt: skip
        object.__setattr__(self, "pooler_config", PoolerConfig.parse(self.pooler_config))
        spec = option_rules.parse_speculative(self.speculative_config)
        if self.runner == "pooling" and spec is not None:
            raise ValueError("speculative decoding is not supported with the pooling runner "
                             "(an embedding request generates nothing): drop --speculative-config")  # fmt: skip
        object.__setattr__(self, "speculative_config", spec)
        for problem in lora_problems(self):
            raise ValueError(problem)
        option_rules.check_booleans(
            self, ("enable_cuda_graphs", "batch_invariant", "async_scheduling", "check_weights"),
            optional=("async_scheduling",),
        )  # fmt: skip
        if self.quantization is not None and self.quantization not in options.QUANTIZATIONS:
            choices = ", ".join(options.QUANTIZATIONS)
            raise ValueError(
                f"quantization must be one of {choices} or None, got {self.quantization!r}"
            )
        if self.dtype not in options.DTYPES:
            raise ValueError(
                f"dtype must be one of {', '.join(options.DTYPES)}; got {self.dtype!r}"
            )
        if self.attention_backend not in options.ATTENTION_BACKENDS:
            choices = ", ".join(options.ATTENTION_BACKENDS)
            raise ValueError(
                f"attention_backend must be one of {choices}, got {self.attention_backend!r}"
            )
        check_device(self.device)
        for problem in fp8_problems(self):
            raise ValueError(problem)
        if self.cache.kv_cache_dtype == "int8" and (
            self.device.startswith("cuda") or self.attention_backend == "triton"
        ):
            raise ValueError(
                "kv_cache_dtype 'int8' runs on the CPU attention backend only; "
                f"got device {self.device!r}, attention_backend {self.attention_backend!r}"
            )

    @classmethod
    def create(cls, model: str = DEFAULT_MODEL, **kwargs: Any) -> EngineConfig:
        """Flat keyword arguments (as `LLM(...)` and the CLI take them) → nested config."""
        cache_keys = {f for f in CacheConfig.__dataclass_fields__}
        sched_keys = {f for f in SchedulerConfig.__dataclass_fields__} - {"auto_batched_tokens"}
        top_keys = {f for f in cls.__dataclass_fields__} - {"cache", "scheduler", "model", "lora"}
        par_keys = set(options.PARALLEL_FLAGS)  # tensor_parallel_size, nnodes, ...
        lora = {k: kwargs.pop(k) for k in LORA_KWARGS if k in kwargs}
        if "lora" in kwargs:  # a LoRAConfig itself
            lora = {"config": kwargs.pop("lora")}
        unknown = set(kwargs) - cache_keys - sched_keys - top_keys - par_keys
        if unknown:
            raise ValueError(f"unknown engine argument(s): {', '.join(sorted(unknown))}")
        cache = CacheConfig(**{k: v for k, v in kwargs.items() if k in cache_keys})
        sched = SchedulerConfig(**{k: v for k, v in kwargs.items() if k in sched_keys})
        top = {k: v for k, v in kwargs.items() if k in top_keys}
        if any(k in par_keys for k in kwargs):
            top["parallel"] = Parallelism.from_values(kwargs)
        if lora:
            top["lora"] = lora["config"] if "config" in lora else LoRAConfig.from_values(**lora)
        return cls(model=model, cache=cache, scheduler=sched, **top)

    def with_device_defaults(self) -> EngineConfig:
        """This config with the defaults that depend on the device filled in: the long-prefill
        threshold (`options.CPU_LONG_PREFILL_TOKEN_THRESHOLD`, `CUDA_...`; 0 without chunked
        prefill)."""
        sched = self.scheduler
        if sched.long_prefill_token_threshold is not None:
            return self
        cap = 0
        if sched.enable_chunked_prefill:
            cuda = self.torch_device().type == "cuda"
            cap = (
                options.CUDA_LONG_PREFILL_TOKEN_THRESHOLD
                if cuda
                else options.CPU_LONG_PREFILL_TOKEN_THRESHOLD
            )
        sched = dataclasses.replace(sched, long_prefill_token_threshold=cap)
        return dataclasses.replace(self, scheduler=sched)

    def with_max_model_len(self, max_model_len: int) -> EngineConfig:
        """This config for a context length known only later (the model's, or what the KV cache
        holds); a token budget left to its default is worked out again."""
        sched = dataclasses.replace(self.scheduler, max_model_len=max_model_len)
        return dataclasses.replace(self, scheduler=sched)

    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    def uses_async_scheduling(self) -> bool:
        """The flag, or by default on with CUDA only: on a CPU the forward runs on the host, so
        there is no device time to hide the next step's scheduling behind. With speculative
        decoding only when asked (not measured on a GPU yet: docs/runtime.md)."""
        if self.runner == "pooling":
            return False  # (pooling: no token to read back, nothing to overlap)
        if self.async_scheduling is not None:
            return self.async_scheduling
        return self.speculative_config is None and self.torch_device().type == "cuda"

    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype, self.torch_device())


def lora_problems(cfg: EngineConfig) -> list[str]:
    """Why `cfg`'s LoRA settings cannot run with its other options: one line each."""
    if cfg.lora is None:
        return []
    if not isinstance(cfg.lora, LoRAConfig):
        return [f"lora must be a LoRAConfig, got {cfg.lora!r}"]
    out = []
    if cfg.speculative_config is not None:
        out.append("LoRA adapters are not supported with speculative decoding: drop "
                   "--speculative-config or --enable-lora")  # fmt: skip
    return out


def fp8_runs_on(device: torch.device) -> bool:
    """Whether the FP8 Triton kernels (GEMM, FP8 KV cache) run on `device`: a CUDA GPU with FP8
    tensor cores (compute capability 8.9+: Ada, Hopper, later), or the CPU under
    ``TRITON_INTERPRET=1`` (Triton's interpreter: correctness tests only)."""
    from pagoda.kernels._common import interpreter_enabled
    from pagoda.kernels.fp8 import fp8_supported

    return fp8_supported(device) if device.type == "cuda" else interpreter_enabled()


def fp8_problems(cfg: EngineConfig) -> list[str]:
    """Why `cfg`'s FP8 settings (``quantization``, ``kv_cache_dtype``) cannot run here: one line
    each, empty when they can (or are not asked for)."""
    fp8_kv = cfg.cache.kv_cache_dtype == "fp8"
    if cfg.quantization != "fp8" and not fp8_kv:
        return []
    device = cfg.torch_device()
    what = " and ".join(
        w for w, on in (("quantization 'fp8'", cfg.quantization == "fp8"),
                        ("kv_cache_dtype 'fp8'", fp8_kv)) if on
    )  # fmt: skip
    if not fp8_runs_on(device):
        if device.type == "cuda" and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            where = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
        else:
            where = "a CPU" if device.type == "cpu" else f"{device}, which this machine lacks"
        verb = "need" if " and " in what else "needs"
        return [
            f"{what} {verb} a GPU with FP8 tensor cores (CUDA compute capability 8.9 or later: "
            f"Ada, Hopper, Blackwell); this is {where}. FP8 checkpoints load without "
            "--quantization (dequantized to --dtype); on a CPU, --kv-cache-dtype int8 halves "
            "the KV cache"
        ]
    backend = cfg.attention_backend
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    if fp8_kv and backend == "torch":
        return ["kv_cache_dtype 'fp8' is read by the Triton attention backend only; use "
                "--attention-backend auto or triton"]  # fmt: skip
    return []


def check_device(device: str) -> None:
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")


def resolve_device(device: str = options.DEFAULT_DEVICE) -> torch.device:
    """`--device`: auto is CUDA when there is one, else the CPU."""
    check_device(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA and on CPUs with native bf16 matmul (AMX/AVX512-BF16), else float32."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cuda":
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
