"""FP8 linear layers from a checkpoint: which format it is, and its tensors as FP8 GEMM operands.

Two ways to an FP8 model (the model loader calls these; the GEMM is
`pagoda.kernels.fp8_matmul.fp8_linear`, the numerics `pagoda.kernels.fp8`):

* **Online** (``--quantization fp8`` on a bf16/fp16/fp32 checkpoint): every linear weight of the
  decoder blocks is quantized at load, one scale per output channel (:func:`quantize_linear`);
  activations are quantized per token at run time (dynamic). The LM head and the embeddings
  stay 16-bit, as in vLLM.
* **Serialized**: a ``config.json`` whose ``quantization_config`` describes an FP8 checkpoint
  loads as it is (:func:`scheme_from_hf_config`, :func:`load_linear`):

  - ``quant_method: "fp8"`` (vLLM / AutoFP8 / llm-compressor's ``fp8`` export, HF's FP8): tensors
    ``<layer>.weight`` (``float8_e4m3fn``), ``<layer>.weight_scale`` (one per tensor, or one per
    output channel ``[N]``/``[N, 1]``) and, with ``activation_scheme: "static"``,
    ``<layer>.input_scale`` (one element). ``ignored_layers`` / ``modules_to_not_convert`` stay
    16-bit. ``weight_block_size`` (block-wise scales, DeepSeek-V3 and Qwen3-FP8 checkpoints, the
    ``weight_scale_inv`` tensors, one per ``[bn, bk]`` tile) loads too, dequantized to the
    model's dtype at load on every device (:func:`dequantize_blocks`): the FP8 GEMM takes one
    scale per channel or per tensor, and requantizing per channel would change the numbers.
  - ``quant_method: "fbgemm_fp8"`` (HF's FBGEMM export, e.g. Meta-Llama-3.1-405B-Instruct-FP8):
    the same tensors with per-channel ``weight_scale [N, 1]`` and dynamic per-token activations
    (its ``activation_scale_ub`` clamp is not applied; ``input_scale_ub`` tensors are unread).
  - ``quant_method: "compressed-tensors"`` with ``float-quantized``/``naive-quantized`` groups of
    8-bit floats (llm-compressor's ``FP8``/``FP8_DYNAMIC``): weight strategy ``channel`` or
    ``tensor``; input activations ``token`` (dynamic), ``tensor`` (static, ``input_scale``), or
    none (weight-only: the GEMM's W8A16 mode). The ``block`` (``block_structure``) and ``group``
    (``group_size``: blocks of one row) strategies load dequantized, as block-wise ``fp8``.
    Dynamic *per-tensor* activations are run per token: a per-batch scale would make a token's
    result depend on the rest of the batch, and per-token is at least as accurate.

Per-tensor weight scales are expanded to one per output channel, so fused projections (q/k/v,
gate/up) whose parts have different scales need no requantization (:func:`fuse`). Any other
``quant_method`` (GPTQ, AWQ, bitsandbytes, ...) is refused rather than loaded as garbage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from pagoda.kernels.fp8 import FP8_DTYPE, dequantize, quantize_weight
from pagoda.runtime.options import QUANTIZATIONS

ONLINE, SERIALIZED_FP8, COMPRESSED_TENSORS = "online", "fp8", "compressed-tensors"
FBGEMM_FP8 = "fbgemm_fp8"  # HF's FbgemmFp8Config: the "fp8" tensors, activations per token
ACTIVATIONS = ("dynamic", "static", "none")  # per token | per tensor from the checkpoint | W8A16


@dataclass(frozen=True)
class Fp8Scheme:
    """How a model's linear layers run in FP8. ``targets``/``ignored``: module names (a name
    matches itself, a dotted suffix of a module's name, or a dotted prefix of it), or ``re:``
    patterns (matched from the start of the name, as compressed-tensors does); ``targets`` empty
    or ``"Linear"``: every linear layer."""

    source: str  # ONLINE, SERIALIZED_FP8 or COMPRESSED_TENSORS
    activations: str  # one of ACTIVATIONS
    ignored: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    block: tuple[int, int] | None = None  # block-wise weight scales: the [rows, cols] of a tile

    def __post_init__(self) -> None:
        if self.source not in (ONLINE, SERIALIZED_FP8, COMPRESSED_TENSORS):
            raise ValueError(f"unknown FP8 scheme source {self.source!r}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}")
        if self.source == ONLINE and self.activations != "dynamic":
            raise ValueError("online FP8 quantization has dynamic activations")
        if self.block is not None and (
            len(self.block) != 2 or not all(isinstance(b, int) and b > 0 for b in self.block)
        ):
            raise ValueError(f"an FP8 weight block must be two positive integers, got {self.block}")

    @property
    def serialized(self) -> bool:
        """The checkpoint's weights are already FP8 (load them; do not quantize)."""
        return self.source != ONLINE

    def quantizes(self, module: str) -> bool:
        """Whether the linear layer ``module`` (e.g. ``model.layers.0.mlp.down_proj``) is FP8."""
        if any(_matches(module, name) for name in self.ignored):
            return False
        targets = [t for t in self.targets if t != "Linear"]
        return not targets or any(_matches(module, t) for t in targets)


ONLINE_SCHEME = Fp8Scheme(ONLINE, "dynamic", ignored=("lm_head",))


def _matches(module: str, name: str) -> bool:
    if name.startswith("re:"):
        return re.match(name[3:], module) is not None
    return module == name or module.endswith("." + name) or module.startswith(name + ".")


def _architectures(hf_config: Mapping) -> set[str]:
    archs = hf_config.get("architectures")
    return set(archs) if isinstance(archs, list) else set()


def _quantization_config(hf_config: Mapping) -> Mapping | None:
    qc = hf_config.get("quantization_config")
    if qc is None and isinstance(hf_config.get("text_config"), Mapping):
        qc = hf_config["text_config"].get("quantization_config")
    if qc is not None and not isinstance(qc, Mapping):
        raise ValueError(f"quantization_config must be an object, got {type(qc).__name__}")
    return qc


def scheme_from_hf_config(hf_config: Mapping) -> Fp8Scheme | None:
    """The FP8 scheme a Hugging Face ``config.json`` declares; None without a
    ``quantization_config``; ``ValueError`` (one line, saying what is supported) for any
    quantization this runtime does not load."""
    qc = _quantization_config(hf_config)
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == SERIALIZED_FP8 and _architectures(hf_config) & {"DeepseekV4ForCausalLM"}:
        return None  # its block-wise FP8 and FP4 experts: dequantized at load (dsv4_quant.py)
    if method == SERIALIZED_FP8:
        return _fp8_scheme(qc)
    if method == FBGEMM_FP8:  # Meta's Llama 3.1 405B FP8: per-channel weights, dynamic rows
        ignored = qc.get("modules_to_not_convert") or ()
        return Fp8Scheme(SERIALIZED_FP8, "dynamic", ignored=tuple(ignored))
    if method == COMPRESSED_TENSORS:
        return _compressed_tensors_scheme(qc)
    if method == "mxfp4" and _architectures(hf_config) & {"GptOssForCausalLM"}:
        return None  # gpt-oss's MXFP4 experts: dequantized at load (model/mxfp4.py)
    if method == "bitnet" and _architectures(hf_config) & {"BitNetForCausalLM"}:
        return None  # BitNet's ternary layers (model/bitnet_config.py reads the rest)
    raise ValueError(
        f"checkpoint quantization {method!r} is not supported: Pagoda loads FP8 checkpoints "
        "(quant_method 'fp8', 'fbgemm_fp8' or 'compressed-tensors' with 8-bit float weights), "
        "gpt-oss's 'mxfp4' experts and BitNet's 'bitnet' layers, and quantizes 16-bit ones "
        "with --quantization fp8"
    )


def _block(value, what: str) -> tuple[int, int]:
    """A block size from the config ([rows, cols]), or a one-line ValueError."""
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ValueError(f"{what} must be two positive integers [rows, cols], got {value!r}")
    return int(value[0]), int(value[1])


def _fp8_scheme(qc: Mapping) -> Fp8Scheme:
    block = qc.get("weight_block_size")
    block = None if block is None else _block(block, "weight_block_size")
    fmt = qc.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):  # (torch's name for it: MiniMax-M2's config)
        raise ValueError(f"FP8 checkpoint format {fmt!r} is not supported (only e4m3)")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"activation_scheme must be 'dynamic' or 'static', got {scheme!r}")
    ignored = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or ()
    return Fp8Scheme(SERIALIZED_FP8, scheme, ignored=tuple(ignored), block=block)


def _compressed_tensors_scheme(qc: Mapping) -> Fp8Scheme:
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors quantization_config has no config_groups")
    found, blocks = set(), set()
    targets: list[str] = []
    for name, group in groups.items():
        fmt = group.get("format") or qc.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise ValueError(f"compressed-tensors group {name!r}: format {fmt!r} is not supported "
                             "(FP8 checkpoints are float-quantized)")  # fmt: skip
        weights = group.get("weights") or {}
        found.add(_group_activations(name, weights, group.get("input_activations")))
        blocks.add(_group_block(name, weights))
        targets += group.get("targets") or []
    if len(found) != 1 or len(blocks) != 1:
        what = sorted(found) if len(found) != 1 else sorted(map(str, blocks))
        raise ValueError(f"compressed-tensors groups mix FP8 schemes {what}; one scheme per "
                         "model is supported")  # fmt: skip
    return Fp8Scheme(COMPRESSED_TENSORS, found.pop(), tuple(qc.get("ignore") or ()),
                     tuple(targets), block=blocks.pop())  # fmt: skip


def _group_block(name: str, weights: Mapping) -> tuple[int, int] | None:
    """The weight tile of a ``block`` (``block_structure``) or ``group`` (``group_size``: one
    row by that many columns) strategy; None for per-channel and per-tensor scales."""
    where = f"compressed-tensors group {name!r}"
    strategy = weights.get("strategy")
    if strategy == "block":
        return _block(weights.get("block_structure"), f"{where}: block_structure")
    if strategy == "group":
        size = weights.get("group_size")
        return _block([1, size], f"{where}: [1, group_size]")
    return None


def _group_activations(name: str, weights: Mapping, inputs: Mapping | None) -> str:
    """'dynamic' | 'static' | 'none' for one compressed-tensors group, or why it is refused."""
    where = f"compressed-tensors group {name!r}"
    if weights.get("num_bits") != 8 or weights.get("type") != "float":
        raise ValueError(f"{where}: weights must be 8-bit floats, got {weights.get('num_bits')}-bit "
                         f"{weights.get('type')}")  # fmt: skip
    strategy = weights.get("strategy")
    if (
        strategy not in ("channel", "tensor", "block", "group")
        or weights.get("dynamic")
        or not weights.get("symmetric", True)
    ):
        raise ValueError(f"{where}: weights must be static, symmetric, per channel, per tensor "
                         "or block-wise")  # fmt: skip
    if inputs is None:
        return "none"
    if inputs.get("num_bits") != 8 or inputs.get("type") != "float":
        raise ValueError(f"{where}: input activations must be 8-bit floats")
    if strategy in ("block", "group"):  # dequantized at load: activations stay 16-bit
        return "dynamic"
    if inputs.get("strategy") not in ("token", "tensor"):
        raise ValueError(f"{where}: input activation strategy {inputs.get('strategy')!r} is not "
                         "supported (token or tensor)")  # fmt: skip
    return "dynamic" if inputs.get("dynamic") else "static"


def resolve_scheme(quantization: str | None, hf_config: Mapping | None) -> Fp8Scheme | None:
    """What to run: a checkpoint's own FP8 format wins (with or without ``--quantization fp8``);
    else ``quantization="fp8"`` quantizes online; else None (16-bit)."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    found = scheme_from_hf_config(hf_config) if hf_config else None
    if found is not None:
        return found
    return ONLINE_SCHEME if quantization == "fp8" else None


def check_checkpoint_form(quantization: str | None, path: str) -> None:
    """ValueError, one line, for ``quantization="fp8"`` on a GGUF file: its weights carry their
    own quantization (Q4/Q8/K-quants), and quantizing their dequantized values again would
    compound the two errors; vLLM refuses the pair too. FP8 quantizes 16/32-bit safetensors."""
    if quantization == "fp8" and str(path).endswith(".gguf"):
        raise ValueError(f"quantization 'fp8' quantizes 16/32-bit safetensors checkpoints; "
                         f"{path} is a GGUF file (its own quantization): serve it without "
                         "--quantization")  # fmt: skip


def engine_scheme(
    quantization: str | None, checkpoint: Fp8Scheme | None, fp8_runs: bool
) -> Fp8Scheme | None:
    """The scheme the model's linear layers run in the FP8 GEMM with, or None (16-bit).

    ``checkpoint``: the checkpoint's own format (it wins, as in :func:`resolve_scheme`);
    ``fp8_runs``: whether the FP8 kernels run on the engine's device. Where they do not, an FP8
    checkpoint is dequantized to the model's dtype at load (correct, and FP8 checkpoints load
    everywhere), while ``quantization="fp8"`` (a request for FP8 compute) is refused. A
    block-wise checkpoint is dequantized at load on every device; with ``quantization="fp8"``
    where FP8 runs, its weights are then requantized per output channel (online)."""
    scheme = checkpoint or (ONLINE_SCHEME if quantization == "fp8" else None)
    if scheme is not None and scheme.block is not None:  # block-wise scales: dequantized at
        # load (`dequantize_blocks`), then with the flag requantized one scale per channel
        scheme = ONLINE_SCHEME if quantization == "fp8" else None
    if scheme is None or fp8_runs:
        return scheme
    if quantization == "fp8":
        raise ValueError("quantization 'fp8' needs a GPU with FP8 tensor cores (CUDA compute "
                         "capability 8.9 or later)")  # fmt: skip
    return None


@dataclass(frozen=True)
class Fp8LinearWeights:
    """One linear layer's `fp8_linear` operands: E4M3 ``weight [N, K]``, float32
    ``weight_scale [N]``, and the static activation scale (one element) or None."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.weight.shape[0] if self.weight.dim() == 2 else -1
        if self.weight.dtype != FP8_DTYPE or n < 0:
            raise ValueError(f"weight must be 2-D float8_e4m3fn, got {tuple(self.weight.shape)} "
                             f"{self.weight.dtype}")  # fmt: skip
        if self.weight_scale.dtype != torch.float32 or self.weight_scale.shape != (n,):
            raise ValueError(
                f"weight_scale must be float32 [{n}], got {tuple(self.weight_scale.shape)}"
            )
        if self.input_scale is not None and (
            self.input_scale.dtype != torch.float32 or self.input_scale.shape != (1,)
        ):
            raise ValueError("input_scale must be float32 with one element")

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight as ``dtype`` values (e.g. for a device without FP8 tensor cores)."""
        return dequantize(self.weight, self.weight_scale[:, None], dtype)

    def to(self, device: torch.device | str) -> Fp8LinearWeights:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Fp8LinearWeights(move(self.weight), move(self.weight_scale), move(self.input_scale))


def quantize_linear(weight: torch.Tensor) -> Fp8LinearWeights:
    """Online quantization of a 16/32-bit ``[N, K]`` weight: one scale per output channel."""
    q, scale = quantize_weight(weight)
    return Fp8LinearWeights(q, scale)


def _scale(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.dtype.is_floating_point or t.dtype == FP8_DTYPE:
        raise ValueError(f"{name} must be a float tensor, got {t.dtype}")
    scale = t.detach().float().reshape(-1)
    if not (torch.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"{name} must be finite and positive")
    return scale


def load_linear(
    tensors: Mapping[str, torch.Tensor], prefix: str, scheme: Fp8Scheme
) -> Fp8LinearWeights:
    """``<prefix>.weight`` and its scales from a serialized FP8 checkpoint (a mapping of tensor
    names, e.g. a safetensors file's). One-element weight scales become one per row."""
    if not scheme.serialized:
        raise ValueError(
            "load_linear reads FP8 checkpoints; quantize 16-bit weights with quantize_linear"
        )
    name = f"{prefix}.weight"
    if name not in tensors:
        raise ValueError(f"FP8 checkpoint: {name} is missing")
    weight = tensors[name]
    if weight.dtype != FP8_DTYPE or weight.dim() != 2:
        raise ValueError(f"FP8 checkpoint: {name} is {tuple(weight.shape)} {weight.dtype}, "
                         "expected a 2-D float8_e4m3fn tensor")  # fmt: skip
    if f"{prefix}.weight_scale" not in tensors:
        extra = (
            " (weight_scale_inv: block-wise scales, not supported)"
            if f"{prefix}.weight_scale_inv" in tensors
            else ""
        )
        raise ValueError(f"FP8 checkpoint: {prefix}.weight_scale is missing{extra}")
    scale = _scale(tensors[f"{prefix}.weight_scale"], f"{prefix}.weight_scale")
    n = weight.shape[0]
    if scale.numel() == 1:
        scale = scale.expand(n).contiguous()
    elif scale.numel() != n:
        raise ValueError(f"FP8 checkpoint: {prefix}.weight_scale has {scale.numel()} elements; "
                         f"expected 1 (per tensor) or {n} (per output channel)")  # fmt: skip
    input_scale = None
    if scheme.activations == "static":
        key = f"{prefix}.input_scale"
        if key not in tensors:
            raise ValueError(f"FP8 checkpoint with static activations: {key} is missing")
        input_scale = _scale(tensors[key], key)
        if input_scale.numel() != 1:
            raise ValueError(f"{key} must have one element, got {input_scale.numel()}")
    return Fp8LinearWeights(weight.contiguous(), scale.to(weight.device), input_scale)


def quantizes_all(scheme: Fp8Scheme | None, modules: Sequence[str]) -> bool:
    """Whether the projections ``modules`` (fused into one layer: q/k/v, gate/up) run in FP8:
    all of them or none; ``ValueError`` when the scheme names only some."""
    if scheme is None:
        return False
    wanted = [scheme.quantizes(m) for m in modules]
    if any(wanted) and not all(wanted):
        raise ValueError(f"the FP8 checkpoint quantizes some of {', '.join(modules)} but not "
                         "all; they run as one fused layer")  # fmt: skip
    return all(wanted)


def shard(weights: Fp8LinearWeights, dim: int, start: int, stop: int) -> Fp8LinearWeights:
    """One tensor-parallel rank's part of a layer (`model.parallel_linear`): output rows
    ``[start, stop)`` with their per-output-channel scales (``dim=0``, column-parallel), or input
    columns ``[start, stop)`` under the unchanged scales (``dim=1``, row-parallel: each scale
    covers a whole output row, so the ranks' partial products still sum to the full one). The
    static input scale is per tensor: every rank keeps it. Exact: the codes are not touched, so
    a rank's part equals that slice of the unsharded layer bit for bit. (Block-wise scales never
    get here: :func:`load_linear` refuses them whatever the rank count.)"""
    if dim not in (0, 1) or not 0 <= start < stop <= weights.weight.shape[dim]:
        raise ValueError(f"cannot take [{start}, {stop}) of dim {dim} of an FP8 weight "
                         f"{tuple(weights.weight.shape)}")  # fmt: skip
    weight = weights.weight.narrow(dim, start, stop - start).contiguous()
    scale = weights.weight_scale
    if dim == 0:
        scale = scale[start:stop].contiguous()
    return Fp8LinearWeights(weight, scale, weights.input_scale)


def fuse(parts: Sequence[Fp8LinearWeights]) -> Fp8LinearWeights:
    """Projections sharing an input (q/k/v, gate/up) as one layer: rows and row scales stacked;
    static input scales replaced by their largest (the shared input then saturates nowhere)."""
    if not parts:
        raise ValueError("fuse needs at least one layer")
    statics = [p.input_scale for p in parts]
    if any(s is None for s in statics) and not all(s is None for s in statics):
        raise ValueError("fused layers mix static and dynamic activation scales")
    input_scale = None if statics[0] is None else torch.stack(statics).amax(dim=0)
    return Fp8LinearWeights(
        torch.cat([p.weight for p in parts]),
        torch.cat([p.weight_scale for p in parts]),
        input_scale,
    )


def dequantize_blocks(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    """``weight [N, K]`` (E4M3) times its block-wise ``scale [ceil(N/bn), ceil(K/bk)]`` (each
    tile's own scale; the last row and column of tiles may be partial), in ``dtype``."""
    (n, k), (bn, bk) = weight.shape, block
    want = (-(-n // bn), -(-k // bk))
    if scale.dim() != 2 or tuple(scale.shape) != want:
        raise ValueError(f"block-wise FP8 scales of a {n}x{k} weight in {bn}x{bk} tiles must be "
                         f"{want[0]}x{want[1]}, got {tuple(scale.shape)}")  # fmt: skip
    w = torch.nn.functional.pad(weight.float(), (0, want[1] * bk - k, 0, want[0] * bn - n))
    tiles = w.view(want[0], bn, want[1], bk)  # one float32 copy of the weight, scaled in place
    tiles.mul_(scale.float().to(weight.device)[:, None, :, None])
    return w[:n, :k].to(dtype)


def checkpoint_kv_scales(
    tensors: Mapping[str, torch.Tensor], attn_prefix: str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A layer's calibrated KV-cache scales if the checkpoint has them: vLLM's
    ``<attn>.k_scale``/``<attn>.v_scale``, compressed-tensors' ``<attn>.k_proj.output_scale``/
    ``<attn>.v_proj.output_scale``, or the one ``<attn>.kv_scale`` of older AutoFP8 exports,
    for both, as vLLM reads it (``attn_prefix`` e.g. ``model.layers.0.self_attn``); float32,
    one element or one per KV head each, for `pagoda.kernels.write_kv_cache`."""
    for k_name, v_name in (("k_scale", "v_scale"), ("k_proj.output_scale", "v_proj.output_scale"),
                           ("kv_scale", "kv_scale")):  # fmt: skip
        k_key, v_key = f"{attn_prefix}.{k_name}", f"{attn_prefix}.{v_name}"
        if k_key in tensors and v_key in tensors:
            return _scale(tensors[k_key], k_key), _scale(tensors[v_key], v_key)
    return None
