"""What each model family is tested with, declared once: the serving options a family is *not*
tested with, each with its reason, refused in one line before anything loads.

The options (`OPTIONS`): tensor parallelism (`--tensor-parallel-size` > 1), FP8 weights
quantized at load (`--quantization fp8`), an FP8 checkpoint (config.json's
`quantization_config`), an FP8 or int8 KV cache (`--kv-cache-dtype` other than auto) and
`--dtype float16`. A family (`ModelConfig.architecture`, a key of `registry.MODEL_CLASSES`)
without a row in `UNTESTED` is refused none of them for being that family (tensor parallelism
still needs sizes its shapes divide, `distributed/layout.py`; FP8 a device that runs it). Adding
a family that is not tested with an option is one row here, not a new check. (Torch-free, at the
top of the package beside `model_config.py`: `distributed/` and `model/` both read it.)

Who reads it: `engine/start_checks.check_dtype` (the dtype, FP8 weights and KV-cache flags; `pagoda
serve`'s preflight and the engine), `distributed/layout.check` (tensor parallelism), the HF
loader (an FP8 checkpoint) and `server/fit.py` (which fixes it may suggest). The rows are
checked against the model registry when it is imported (`check_registered`); docs/runtime.md's
"Options tested per family" table is checked against them (tests/docs/test_doc_tables.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

# option -> the one-line refusal: the option, the architecture, the reason, what to use instead
MESSAGES: Mapping[str, str] = MappingProxyType(
    {
        "tensor_parallel": "--tensor-parallel-size {size} is not supported for a {arch} model "
        "({reason}); serve it on one device",
        "fp8": "--quantization fp8 is not supported for a {arch} model ({reason}); serve it in "
        "16 or 32 bits",
        "fp8_checkpoint": "an FP8 {arch} checkpoint is not supported ({reason}); serve a 16-bit one",
        "kv_cache": "--kv-cache-dtype {kv} is not supported for a {arch} model ({reason}); use "
        "--kv-cache-dtype auto",
        "float16": "a {arch} model does not run in float16 ({reason}); use --dtype bfloat16 or "
        "float32",
    }
)
OPTIONS = tuple(MESSAGES)  # (the order the checks ask in)


@dataclass(frozen=True)
class Untested:
    """The options one family is not tested with: each field the reason ("" = tested)."""

    tensor_parallel: str = ""
    fp8: str = ""
    fp8_checkpoint: str = ""
    kv_cache: str = ""
    float16: str = ""

    def __post_init__(self) -> None:
        reasons = [getattr(self, o) for o in OPTIONS]
        if not any(reasons):
            raise ValueError("a family row must name an option it is not tested with")
        for reason in reasons:
            if reason != reason.strip() or "\n" in reason or reason.endswith((".", ";")):
                raise ValueError(f"a reason is one bare line: {reason!r}")

    @property
    def options(self) -> tuple[str, ...]:
        """The options refused, in `OPTIONS` order."""
        return tuple(o for o in OPTIONS if getattr(self, o))


if tuple(f.name for f in fields(Untested)) != OPTIONS:  # (a row's fields are the options)
    raise ImportError("family_options: Untested's fields and MESSAGES name other options")

_FLOAT16 = "its activations overflow it: numerical instability"  # (vLLM refuses them too)
_DSA_FP8 = "DeepSeek Sparse Attention: its indexer is not tested in FP8"
_DSA_KV = "DeepSeek Sparse Attention writes its own cache rows, in the model's dtype"
_SHORT_CONV, _MAMBA1 = "short_conv layers", "mamba1 layers"  # (LFM2's, Mamba-1's: not run
_DELTANET = "gated_deltanet layers"  # in the FP8 GEMM; split over ranks, as Gated DeltaNet's)

# BERT's, RoBERTa's (model/bert.py) and ModernBERT's (model/modernbert.py): an encoder's
# attention runs outside the paged backend (split by heads as a decoder's)
_ENCODER = Untested(
    fp8="not tested",
    fp8_checkpoint="not tested",
    kv_cache="an encoder keeps no keys or values: its attention reads the step's own",
)

UNTESTED: Mapping[str, Untested] = MappingProxyType(
    {
        "gemma2": Untested(float16=_FLOAT16),
        "gemma3": Untested(float16=_FLOAT16),
        "vaultgemma": Untested(float16=_FLOAT16),
        "gemma4": Untested(
            fp8="its FP8 GEMM is not tested",
            fp8_checkpoint="not tested",
            float16=_FLOAT16,
        ),
        "gemma4_unified": Untested(
            fp8="its FP8 GEMM is not tested",
            fp8_checkpoint="not tested",
            float16=_FLOAT16,
        ),
        "gemma3n": Untested(
            fp8="its FP8 GEMM is not tested",
            fp8_checkpoint="not tested",
            float16=_FLOAT16,
        ),
        "laguna": Untested(fp8="its gate and per-layer heads' FP8 GEMM is not tested"),
        "mimo_v2_flash": Untested(
            fp8="not tested",
            fp8_checkpoint="not tested",
        ),
        "minicpm5_moe": Untested(
            fp8="its gated q_proj's FP8 GEMM is not tested", fp8_checkpoint="not tested"
        ),
        "granite_swa": Untested(fp8="not tested"),
        "granitemoe_swa": Untested(fp8="not tested"),
        "kolibri1": Untested(fp8="not tested"),
        "kolibri1_1": Untested(  # (rank 0 selects the indexed layers' keys for every rank)
            fp8="not tested",
            kv_cache="its indexed layers' keys and values are rounded to NVFP4 in the cache",
        ),
        "aria_text": Untested(fp8_checkpoint="its stacked experts are not read in FP8"),
        "axk1": Untested(fp8="not tested"),
        "longcat_flash": Untested(fp8="not tested"),
        **dict.fromkeys(("bert", "roberta", "modernbert"), _ENCODER),
        **dict.fromkeys(
            ("qwen2_vl", "qwen2_5_vl"),
            Untested(
                fp8="its vision tower is not quantized",
                fp8_checkpoint="its vision tower is not quantized",
            ),
        ),
        **dict.fromkeys(
            ("qwen3_vl", "qwen3_vl_moe"),
            Untested(
                fp8="its vision tower is not quantized",
                fp8_checkpoint="its vision tower is not quantized",
            ),
        ),
        **dict.fromkeys(
            ("llava", "llava_next", "llava_next_mistral", "llava_onevision"),
            Untested(
                fp8="its vision tower and projector are not quantized",
                fp8_checkpoint="its vision tower and projector are not quantized",
            ),
        ),
        "idefics3": Untested(
            fp8="its vision tower and connector are not quantized",
            fp8_checkpoint="its vision tower and connector are not quantized",
        ),
        "mistral3": Untested(  # (Mistral 3 with its images: model/pixtral.py)
            fp8="its vision tower and projector are not quantized",
            fp8_checkpoint="its vision tower and projector are not quantized",
        ),
        **dict.fromkeys(
            ("internvl", "internvl_qwen3", "internvl_qwen3_moe"),
            Untested(
                fp8="its vision tower and projector are not quantized",
                fp8_checkpoint="its vision tower and projector are not quantized",
            ),
        ),
        # (an FP8 Llama 4 checkpoint is read text-only, `llama4`: model/hf_loader.py)
        "llama4_vision": Untested(fp8="its vision tower and projector are not quantized"),
        "bitnet": Untested(fp8="its layers are ternary already: BitLinear"),  # (split as Llama's)
        "jetmoe": Untested(fp8="its routed attention projections' FP8 GEMM is not tested"),
        "deepseek_v32": Untested(fp8=_DSA_FP8, kv_cache=_DSA_KV),
        "glm_moe_dsa": Untested(fp8=_DSA_FP8, kv_cache=_DSA_KV),
        "axk2": Untested(fp8=_DSA_FP8, fp8_checkpoint="not tested", kv_cache=_DSA_KV),
        "hy_v4": Untested(
            fp8=_DSA_FP8,
            fp8_checkpoint="not tested",
            kv_cache=_DSA_KV,
        ),
        "dots3_note_text": Untested(fp8=_DSA_FP8, fp8_checkpoint="not tested", kv_cache=_DSA_KV),
        "deepseek_v4": Untested(
            fp8="its FP8 GEMM is not tested",
            kv_cache="its compressed entries and window slots are kept in the model's dtype",
            float16="not tested: float32 is tested against transformers, bfloat16 runs",
        ),
        "beam": Untested(
            fp8="its gated attention's FP8 GEMM is not tested",
            fp8_checkpoint="not tested",
        ),
        "lfm2": Untested(fp8=_SHORT_CONV),  # (its short convs split by channels)
        "lfm2_moe": Untested(fp8=_SHORT_CONV),
        "lfm3": Untested(fp8=_SHORT_CONV),
        "mamba": Untested(fp8=_MAMBA1),  # (its Mamba-1 mixers split by channels)
        "falcon_mamba": Untested(fp8=_MAMBA1),  # (as Mamba's)
        "jamba": Untested(fp8=_MAMBA1),  # (its Mamba-1 mixers split by channels)
        "qwen3_next": Untested(fp8=_DELTANET),
        "qwen3_5": Untested(fp8=_DELTANET),
        "qwen3_5_moe": Untested(fp8=_DELTANET),
        "lara_mini": Untested(fp8=_DELTANET),
        "qwen4_exp": Untested(  # (its hyper-connections, PLE and QSA indexer whole a rank)
            fp8=_DELTANET,
            fp8_checkpoint="not tested",
            kv_cache="its QSA indexer is tested with 16/32-bit caches only",
            float16="tested in bfloat16 and float32 only",
        ),
        "olmo_hybrid": Untested(fp8=_DELTANET),
        "kimi_linear": Untested(fp8="kda layers"),
        "bailing_hybrid": Untested(fp8="kda layers"),
        "glm5_next": Untested(
            fp8="kda layers",
            fp8_checkpoint="not tested",
            kv_cache="tested with 16/32-bit caches only",
            float16="tested in bfloat16 and float32 only",
        ),
        "minimax": Untested(fp8="lightning layers"),
        "zamba2": Untested(fp8="its shared blocks' adapters"),  # (split with their blocks)
        "zamba": Untested(fp8="its shared block and mamba1 layers"),  # (split by heads)
        "recurrent_gemma": Untested(fp8="rglru layers"),  # (its RG-LRU split by gate blocks)
        "rwkv": Untested(fp8="wkv layers"),  # (its time-mix split by channels)
        "xlstm": Untested(fp8="mlstm layers"),  # (its mLSTM split by heads)
        "dory": Untested(fp8="its FP8 GEMM is not tested"),  # (its L2 norms' sums all-reduced)
        "doge": Untested(  # (its dynamic mask's dt_proj summed over the ranks' KV heads)
            fp8="its FP8 GEMM is not tested",
            kv_cache="the dynamic mask's key biases ride in the keys' cache columns",
        ),
        "minimax_m3": Untested(  # (its fused gate_up split by each half's rows)
            fp8="its FP8 GEMM is not tested",
            fp8_checkpoint="its FP8 weights' scales are not read: MiniMax-M3-MXFP8's per-expert "
            "w1/w2/w3 with UE8M0 scales of 1x32 blocks, or block-wise FP8",
            kv_cache="its sparse layers' block attention reads 16/32-bit caches only",
        ),
        "hrm_text": Untested(fp8="its FP8 GEMM is not tested"),
        "ergo": Untested(fp8="its FP8 GEMM is not tested"),  # (its experts split by expert)
        "zaya": Untested(  # (its conv state split by heads, the delayed values whole)
            fp8="its conv-fed attention and router MLP's FP8 GEMM is not tested",
        ),
        "inkling": Untested(  # (its k/v convs split by KV heads, the output convs whole)
            fp8="its FP8 GEMM is not tested",
            kv_cache="its relative logits are tested over a KV cache in the model's dtype only",
        ),
        "inkling2": Untested(  # (as Inkling's; its dynamic taps by KV heads, sinks by heads)
            fp8="its FP8 GEMM is not tested",
            kv_cache="its relative logits are tested over a KV cache in the model's dtype only",
        ),
    }
)


def tested(architecture: str, option: str) -> bool:
    """Whether `architecture` is tested with `option` (one of `OPTIONS`)."""
    if option not in MESSAGES:
        raise ValueError(f"unknown option {option!r}; one of {', '.join(OPTIONS)}")
    row = UNTESTED.get(architecture)
    return row is None or not getattr(row, option)


def refusal(architecture: str, option: str, **values: object) -> str | None:
    """The one-line refusal of `option` for `architecture` (None where it is tested); `values`
    fill the message (`size`: the tensor-parallel size, `kv`: the KV-cache dtype)."""
    if tested(architecture, option):
        return None
    reason = getattr(UNTESTED[architecture], option)
    return MESSAGES[option].format(arch=architecture, reason=reason, **values)


def refuse(architecture: str, option: str, **values: object) -> None:
    """ValueError with `refusal`'s line where `architecture` is not tested with `option`."""
    line = refusal(architecture, option, **values)
    if line is not None:
        raise ValueError(line)


def check_registered(architectures: Iterable[str]) -> None:
    """Every row names a registered architecture (a row for a renamed or removed family would
    silently refuse nothing)."""
    unknown = set(UNTESTED) - set(architectures)
    if unknown:
        raise ValueError(f"family_options rows for no registered architecture: {sorted(unknown)}")
