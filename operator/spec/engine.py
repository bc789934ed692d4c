"""`spec.engine`, the flags of `pagoda serve`, and `spec.autotune`, which tunes the scheduler
knobs among them per GPU product: parsed, defaulted and checked into frozen dataclasses.

The engine's choices, defaults and rules are the runtime's (`pagoda.runtime.options`,
`pagoda.runtime.option_rules`, torch-free); `engine.speculative` is read into the runtime's own
`SpeculativeConfig` (`pagoda.runtime.spec.config`, standard library only), `engine.poolerConfig`
into its `PoolerConfig` (`pagoda.runtime.pooler_config`, standard library only). What the engine
fields cannot check alone (the pod's GPUs, the model, the adapters) is `InferenceServiceSpec`'s
(spec/inference_service.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.spec.fields import (
    SpecError,
    bool_or,
    choice,
    closed_object,
    int_or,
    opt_int,
    opt_number,
    show,
)
from pagoda.runtime import options, pooler_config
from pagoda.runtime.option_rules import CRD_ENGINE_RULES, CRD_FLAG_RULES, camel
from pagoda.runtime.spec import config as spec_config  # SpeculativeConfig: standard library only

if TYPE_CHECKING:
    from pagoda.operator.spec.model_ref import LoraSpec, ModelRef

# The engine's choices and defaults are the runtime's (pagoda.runtime.options, torch-free); the
# CRD's enums and defaults equal them (test_operator_crd.py). Aliases such as "half" are the CLI's
# only: the CRD takes canonical names.
DTYPES = options.DTYPES
ATTENTION_BACKENDS = options.ATTENTION_BACKENDS
BLOCK_SIZES = options.BLOCK_SIZES
KV_CACHE_DTYPES = options.KV_CACHE_DTYPES
QUANTIZATIONS = options.QUANTIZATIONS
RUNNERS = options.RUNNERS
# engine.poolerConfig: `--pooler-config`'s keys, camelCase (poolingType, normalize, dimensions)
POOLER_KEYS = tuple(camel(k) for k in pooler_config.USER_KEYS)
POOLING_TYPES = pooler_config.POOLING_TYPES
MAX_POOLER_DIMENSIONS = 1 << 20  # the CRD's bound; the server checks the model's width at start
SPECULATIVE_KEYS = ("method", "model", "numSpeculativeTokens", "promptLookupMax", "promptLookupMin")
# spec.engine.speculative.method → the runtime's (`--speculative-config`'s "method")
SPECULATIVE_METHODS = {"ngram": "ngram", "draftModel": spec_config.DRAFT_MODEL}
NGRAM_KEYS = ("promptLookupMax", "promptLookupMin")  # n-gram drafting's only
# engine.limitMMPerPrompt: `--limit-mm-per-prompt`'s modalities the runtime serves (images)
MM_MODALITIES = ("image",)
MAX_MM_PER_PROMPT = 1 << 20  # the CRD's bound; unset: the runtime's default (999, vLLM's)
# engine.mmProcessorKwargs: `--mm-processor-kwargs`' keys, the image processor's own names: those
# some family's processor reads (each image-input module's `PROCESSOR_KWARGS`, runtime/multimodal/:
# Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's resized area; InternVL's tile grid bounds and tiling
# switch; test_mm_processor_kwargs.py checks the union); a key the served model's processor does
# not read is refused by the server at start
MM_PROCESSOR_KWARGS = ("crop_to_patches", "max_patches", "max_pixels", "min_patches", "min_pixels",
                       "resize_to_max_canvas")  # fmt: skip
MAX_PROCESSOR_PIXELS = 1 << 30  # the CRD's bound on each area
MAX_PROCESSOR_PATCHES = 1024  # the CRD's bound on each tile count

DEFAULT_TIME_BUDGET_S = 900  # `pagoda tune --time-budget 15m`
MIN_TIME_BUDGET_S, MAX_TIME_BUDGET_S = 60, 14400


@dataclass(frozen=True)
class EngineSpec:
    """Flags of `pagoda serve`; None means "the runtime's own default"."""

    dtype: str = options.DEFAULT_DTYPE
    enable_prefix_caching: bool = options.DEFAULT_ENABLE_PREFIX_CACHING
    enable_chunked_prefill: bool = options.DEFAULT_ENABLE_CHUNKED_PREFILL
    attention_backend: str = options.DEFAULT_ATTENTION_BACKEND
    block_size: int = options.DEFAULT_BLOCK_SIZE
    kv_cache_dtype: str = options.DEFAULT_KV_CACHE_DTYPE
    quantization: str | None = None  # None: the checkpoint's own (16-bit, or its FP8 format)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    max_queue_len: int | None = None
    # the largest prefill chunk of one prompt while others run or wait; 0: off (None: by device)
    long_prefill_token_threshold: int | None = None
    # speculative decoding (`--speculative-config`): n-gram or a draft model; None: off
    speculative: spec_config.SpeculativeConfig | None = None
    # method draftModel's checkpoint (`speculative.model` is its URI as written; the pods read
    # it where children/model_cache.py puts it: serve_args.draft_path)
    draft: ModelRef | None = None
    # `--runner` (generate, pooling: an embedding model, auto); None: the runtime's (auto)
    runner: str | None = None
    # `--pooler-config` (the pooling runner's pooling); None: the checkpoint's, else LAST
    pooler_config: pooler_config.PoolerConfig | None = None
    # `--limit-mm-per-prompt`'s images a prompt of a vision model (LLaVA) may hold; 0: none;
    # None: the runtime's default
    limit_mm_per_prompt: int | None = None
    # `--mm-processor-kwargs`: the image processor's settings over the checkpoint's, (key,
    # value) pairs in key order; None: the checkpoint's
    mm_processor_kwargs: tuple[tuple[str, int | bool], ...] | None = None
    # `--max-loras` and the rest with spec.adapters (spec/model_ref.py); None: their defaults
    lora: LoraSpec | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError("InvalidSpec", f"spec.engine.dtype must be one of {', '.join(DTYPES)}")
        if self.block_size not in BLOCK_SIZES:
            raise SpecError("InvalidSpec", f"spec.engine.blockSize must be one of {BLOCK_SIZES}")
        if self.pooler_config is not None and self.runner == "generate":
            raise SpecError(  # `pagoda serve` refuses the two together at start
                "InvalidSpec",
                "spec.engine.poolerConfig applies to the pooling runner only: set "
                "spec.engine.runner pooling (or auto), or drop poolerConfig",
            )
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # flag names
        for needs in CRD_FLAG_RULES:
            if not needs.holds(values):
                raise SpecError("InvalidSpec", needs.spec_error(values))
        for rule in CRD_ENGINE_RULES:  # as `pagoda serve` checks them: defaults filled in
            filled = rule.filled(values)
            if not rule.holds(filled):
                unset = " when unset" if values.get(rule.smaller) is None else ""
                raise SpecError(
                    "InvalidSpec",
                    f"spec.engine.{camel(rule.larger)} ({filled[rule.larger]}) must be >= "
                    f"{camel(rule.smaller)} ({filled[rule.smaller]}{unset})",
                )

    @classmethod
    def from_dict(
        cls,
        d: Mapping[str, Any],
        *,
        extra_args: tuple[str, ...] = (),
        lora: LoraSpec | None = None,
        draft: ModelRef | None = None,
    ) -> EngineSpec:
        """`spec.engine`, with its `extraArgs`, `lora` and the draft model (`speculative.model`)
        given parsed (`pod_fields.extra_args`, `LoraSpec.from_dict`, `model_ref.parse_draft`;
        spec/inference_service.py): this module imports no other spec module at run time, which
        keeps the operator's import chains short (test_layout.py)."""
        p = "spec.engine"
        return cls(
            dtype=choice(d, "dtype", p, DTYPES, cls.dtype),
            enable_prefix_caching=bool_or(d, "enablePrefixCaching", p, cls.enable_prefix_caching),
            enable_chunked_prefill=bool_or(
                d, "enableChunkedPrefill", p, cls.enable_chunked_prefill
            ),
            attention_backend=choice(
                d, "attentionBackend", p, ATTENTION_BACKENDS, cls.attention_backend
            ),
            block_size=choice(d, "blockSize", p, BLOCK_SIZES, cls.block_size),
            kv_cache_dtype=choice(d, "kvCacheDtype", p, KV_CACHE_DTYPES, cls.kv_cache_dtype),
            quantization=(
                choice(d, "quantization", p, QUANTIZATIONS, None)
                if d.get("quantization") is not None
                else None
            ),
            max_num_seqs=opt_int(d, "maxNumSeqs", p, 1, 4096),
            max_num_batched_tokens=opt_int(d, "maxNumBatchedTokens", p, 1, 1 << 20),
            max_model_len=opt_int(d, "maxModelLen", p, 2, 1 << 20),  # a prompt token + one out
            max_queue_len=opt_int(d, "maxQueueLen", p, 1, 1 << 20),
            long_prefill_token_threshold=opt_int(d, "longPrefillTokenThreshold", p, 0, 1 << 20),
            speculative=_speculative(d, p, draft),
            draft=draft,
            runner=choice(d, "runner", p, RUNNERS, None) if d.get("runner") is not None else None,
            pooler_config=_pooler_config(d, p),
            limit_mm_per_prompt=_images_per_prompt(d, p),
            mm_processor_kwargs=_processor_kwargs(d, p),
            lora=lora,
            extra_args=extra_args,
        )


def _pooler_config(engine: Mapping[str, Any], path: str) -> pooler_config.PoolerConfig | None:
    """`spec.engine.poolerConfig` → the runtime's own frozen `PoolerConfig` (vLLM's
    `--pooler-config` keys, camelCase here); None when absent or null, `PoolerConfig()` (the
    checkpoint's pooling, rendered `{}`) for an empty object."""
    p = f"{path}.poolerConfig"
    value = closed_object(engine, "poolerConfig", path, POOLER_KEYS)
    if value is None:
        return None
    kind = value.get("poolingType")
    normalize = value.get("normalize")
    return pooler_config.PoolerConfig(
        pooling_type=None if kind is None else choice(value, "poolingType", p, POOLING_TYPES, None),
        normalize=None if normalize is None else bool_or(value, "normalize", p, True),
        dimensions=opt_int(value, "dimensions", p, 1, MAX_POOLER_DIMENSIONS),
    )


def _images_per_prompt(engine: Mapping[str, Any], path: str) -> int | None:
    """`spec.engine.limitMMPerPrompt` (vLLM's `--limit-mm-per-prompt` as an object, e.g.
    `{image: 4}`) → the images a prompt may hold; None when absent, null or without `image`.
    Another modality (video, audio: not served) or a count out of range is InvalidSpec."""
    value = closed_object(engine, "limitMMPerPrompt", path, MM_MODALITIES)
    if value is None:
        return None
    return opt_int(value, "image", f"{path}.limitMMPerPrompt", 0, MAX_MM_PER_PROMPT)


def _processor_kwargs(
    engine: Mapping[str, Any], path: str
) -> tuple[tuple[str, int | bool], ...] | None:
    """`spec.engine.mmProcessorKwargs` (vLLM's `--mm-processor-kwargs` as an object, e.g.
    `{min_pixels: 200704, max_pixels: 1003520}`, `{max_patches: 6}`) → its (key, value) pairs
    set, in key order; None when absent, null or empty. A key no family's processor reads, a
    value out of range or of another type, or a lower bound over its upper one is InvalidSpec."""
    p = f"{path}.mmProcessorKwargs"
    value = closed_object(engine, "mmProcessorKwargs", path, MM_PROCESSOR_KWARGS)
    if value is None:
        return None
    pairs: dict[str, int | bool | None] = {}
    for k in MM_PROCESSOR_KWARGS:
        if k in ("crop_to_patches", "resize_to_max_canvas"):
            flag = value.get(k)
            if flag is not None and not isinstance(flag, bool):
                raise SpecError("InvalidSpec", f"{p}.{k} must be true or false, got {show(flag)}")
            pairs[k] = flag
        else:
            hi = MAX_PROCESSOR_PATCHES if k.endswith("patches") else MAX_PROCESSOR_PIXELS
            pairs[k] = opt_int(value, k, p, 1, hi)
    for unit in ("pixels", "patches"):
        lo, hi = pairs[f"min_{unit}"], pairs[f"max_{unit}"]
        if lo is not None and hi is not None and lo > hi:
            raise SpecError("InvalidSpec",
                            f"{p}.min_{unit} ({lo}) must be <= max_{unit} ({hi})")  # fmt: skip
    return tuple((k, v) for k, v in pairs.items() if v is not None) or None


def _speculative(
    engine: Mapping[str, Any], path: str, draft: ModelRef | None
) -> spec_config.SpeculativeConfig | None:
    """`spec.engine.speculative` → the runtime's own frozen `SpeculativeConfig` (vLLM's
    `--speculative-config` keys), with the runtime's bounds (the CRD's equal them) and camelCase
    names in every message; None when absent or null. Method draftModel takes `model` (parsed
    as `draft`) and none of n-gram's keys; ngram (the default) takes no `model`."""
    p = f"{path}.speculative"
    value = closed_object(engine, "speculative", path, SPECULATIVE_KEYS)
    if value is None:
        return None
    tokens = opt_int(value, "numSpeculativeTokens", p, 1, spec_config.MAX_SPECULATIVE_TOKENS)
    if tokens is None:
        raise SpecError("InvalidSpec", f"{p}.numSpeculativeTokens is required")
    method = choice(value, "method", p, tuple(SPECULATIVE_METHODS), "ngram")
    if method == "draftModel":
        if draft is None:
            raise SpecError("InvalidSpec", f"{p}.model is required with method draftModel")
        if asked := [k for k in NGRAM_KEYS if value.get(k) is not None]:
            raise SpecError(
                "InvalidSpec",
                f"{p}.{' and '.join(asked)}: n-gram drafting's, not for method draftModel",
            )
        return spec_config.SpeculativeConfig(
            num_speculative_tokens=tokens, method=spec_config.DRAFT_MODEL, model=draft.uri
        )
    if value.get("model") is not None:
        raise SpecError(
            "InvalidSpec",
            f"{p}.model is the draft checkpoint of method draftModel: set method draftModel, "
            "or drop model",
        )
    hi = opt_int(value, "promptLookupMax", p, 1, spec_config.MAX_PROMPT_LOOKUP)
    lo = opt_int(value, "promptLookupMin", p, 1, spec_config.MAX_PROMPT_LOOKUP)
    if hi is not None and lo is not None and lo > hi:
        raise SpecError(
            "InvalidSpec", f"{p}.promptLookupMin ({lo}) must be <= promptLookupMax ({hi})"
        )
    return spec_config.SpeculativeConfig(  # fills an unset bound as `pagoda serve` does
        num_speculative_tokens=tokens,
        method=SPECULATIVE_METHODS[method],
        prompt_lookup_max=hi,
        prompt_lookup_min=lo,
    )


@dataclass(frozen=True)
class AutotuneSpec:
    """`spec.autotune`: whether and how the operator tunes the nodes this service runs on. The
    targets default to `pagoda tune`'s own (pagoda.runtime.options), so services that do not set
    them share one profile per GPU product."""

    enabled: bool = False
    time_budget_seconds: int = DEFAULT_TIME_BUDGET_S
    ttft_target_s: float = options.DEFAULT_TTFT_TARGET_S
    itl_target_s: float = options.DEFAULT_ITL_TARGET_S

    def __post_init__(self) -> None:
        if not MIN_TIME_BUDGET_S <= self.time_budget_seconds <= MAX_TIME_BUDGET_S:
            raise SpecError(
                "InvalidSpec",
                f"spec.autotune.timeBudgetSeconds must be between {MIN_TIME_BUDGET_S} and "
                f"{MAX_TIME_BUDGET_S}, got {self.time_budget_seconds}",
            )
        if self.ttft_target_s <= 0 or self.itl_target_s <= 0:
            raise SpecError("InvalidSpec", "spec.autotune targets must be positive")

    @classmethod
    def from_dict(cls, d: Any) -> AutotuneSpec:
        p = "spec.autotune"
        if not isinstance(d, Mapping):
            raise SpecError("InvalidSpec", f"{p} must be an object, got {show(d)}")
        targets = {} if d.get("targets") is None else d["targets"]
        if not isinstance(targets, Mapping):
            raise SpecError("InvalidSpec", f"{p}.targets must be an object, got {show(targets)}")
        ttft = opt_number(targets, "ttftSeconds", f"{p}.targets", 0.001)
        itl = opt_number(targets, "itlSeconds", f"{p}.targets", 0.0001)
        return cls(
            enabled=bool_or(d, "enabled", p, False),
            time_budget_seconds=int_or(
                d,
                "timeBudgetSeconds",
                p,
                MIN_TIME_BUDGET_S,
                MAX_TIME_BUDGET_S,
                DEFAULT_TIME_BUDGET_S,
            ),
            ttft_target_s=options.DEFAULT_TTFT_TARGET_S if ttft is None else ttft,
            itl_target_s=options.DEFAULT_ITL_TARGET_S if itl is None else itl,
        )
