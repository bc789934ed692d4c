"""The weights' bytes as the engine will hold them, from the checkpoint's metadata alone.

A checkpoint's file size is not what its weights take once loaded: the loader dequantizes a GGUF's
Q4/Q8/K-quant tensors and casts every tensor to the engine's dtype (the embedded 94 MB Q4_1 GGUF
holds 310 MiB as bfloat16 on a CPU, its tied LM head's packed copy included), a float32 checkpoint served as bfloat16 takes half its file, a bfloat16
one served as float32 twice (unless the CPU's quantized GEMM reads it in place), an FP8 one keeps
one byte per weight only where the FP8 kernels run. `pagoda serve` counts the weights here before
it loads anything (`memory.check`, `fit.check`), by applying the loader's own rules to each
tensor's name, stored type and shape (a GGUF's tensor table through `gguf_reader.open_reader`, the
safetensors headers, or a pickle's tensors, through `SafetensorsWeights`; no tensor data is read):

* the tensors the model reads (the loader's names), no others: not a GGUF's ``rope_freqs``, a
  checkpoint's rotary ``inv_freq`` or vision tower, nor the LM head of a tied model; FP8 scales
  go with their weights;
* each in the engine's dtype (`EngineConfig.torch_dtype`: ``auto`` is float32 on a CPU without
  native bf16), Gemma's norms in float32 (their 1 + w), Cohere's LayerNorm weights too, and
  Gemma 4's unweighted norms (v's, its router's) as the float32 ones made at load;
* on a CPU in float32, the matrices `qgemm` multiplies in place (`model.device_weights`: GGUF
  blocks of the kinds `quantized.readable` names, 16-bit matrices of a safetensors checkpoint,
  every part of a fused q/k/v or gate/up layer or none) as its packed layout (`qgemm.pack`: rows
  padded to 16 per run of one kind), a tied embedding read from the LM head's blocks;
* on a CPU the `Linear` layers hold a packed copy (`linear._pack`), so a tied LM head is a second
  copy of the embedding table beside the table itself; on CUDA they share it;
* projections that run in FP8 (`quantization.fp8.engine_scheme`: an FP8 checkpoint where the FP8
  kernels run, or ``--quantization fp8``) at one byte a weight plus a float32 scale per output
  row (Qwen2-MoE's shared expert too); the embedding, LM head, routers and experts stay in the
  dtype;
* with tensor parallelism, one rank's share (`distributed.layout`): q by its heads, k and v by
  its KV heads (replicated when there are fewer than ranks), o and down by input columns (their
  biases, and FP8 scales, whole), gate/up and the experts by rows, the vocabulary padded to a
  multiple of the ranks; norms and the router whole on every rank (Cohere's per-head q/k norms
  by heads);
* gpt-oss's stacked experts (`model/gpt_oss.py`) as the engine holds them: dequantized from
  MXFP4 (`*_blocks`, `*_scales`; a GGUF's `experts.{gate,up,down}`) or transposed from
  [E, hidden, 2I], one `Linear` per expert (never `qgemm`'s blocks), their attention sinks and
  norms in float32.

Transformers' pickled ``pytorch_model*.bin`` checkpoints count the same way: their tensors' dtypes
and shapes come from the pickle memory-mapped with ``torch.load(weights_only=True, mmap=True)``
(`model/pickle_weights.py`; no tensor data is read); a directory without weight files (a
config.json alone) counts from the model's shapes (`weights_from_shapes.from_shapes`, which
`fit.Plan` also uses for the plans it suggests). The families' stored-to-held rewrites are in
`held_forms.py`, the bytes of a family's own tensors in `held_families.py`, one rank's
share of a tensor in `rank_share.py`; the checkpoint's tensor table and which of its tensors the
model reads in `checkpoint_table.py`, the bytes of the tensors that are no `Linear`'s matrix in
`held_apart.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.server.checkpoint_table import read_by_model, read_checkpoint
from pagoda.runtime.server.held_apart import held_apart
from pagoda.runtime.server.held_forms import _HELD, as_held
from pagoda.runtime.server.placement import (
    Placement,
    dense_bytes,
    packed_bytes,
    placement,
)
from pagoda.runtime.server.rank_share import (
    _LAYER,
    EMBED,
    HEAD,
    _local,
    _row_parallel,
)
from pagoda.runtime.server.stored import Checkpoint, Stored
from pagoda.runtime.server.weights_from_shapes import from_shapes

if TYPE_CHECKING:
    from pagoda.runtime.quantization.fp8 import Fp8Scheme

_FUSED = ((re.compile(r"\blinear_attn\.[qkvgba]_proj\b"), "linear_attn.in_proj"),  # OLMo Hybrid's
          # Zaya's q, k and delayed values: the conv's inputs in one matrix (model/zaya.py)
          (re.compile(r"\bqkv_proj\.([qk]_proj|v_proj_delayed)\b"), "qkv_proj.cca"),
          # xLSTM's mLSTM: q, k, v and the output gate in one matrix, the two gates in another
          (re.compile(r"\bmlstm_layer\.(q|k|v|ogate_preact)\b"), "mlstm_layer.qkvo"),
          (re.compile(r"\bmlstm_layer\.[if]gate_preact\b"), "mlstm_layer.gates"),
          # Kimi Linear's KDA: q, k, v, f_a, g_a and b in one matrix (model/kimi_linear.py)
          (re.compile(r"\bself_attn\.(f_a|g_a|b)_proj\b"), "self_attn.qkv_proj"),
          # MiniMax-Text-01's lightning layers: q/k/v and the output gate in one matrix
          (re.compile(r"\bself_attn\.output_gate\b"), "self_attn.qkv_proj"),
          # RecurrentGemma's RG-LRU: linear_y and linear_x in one matrix (model/recurrent_gemma.py;
          # apart, a rank's halves were each padded to oneDNN's row block: 8 KiB a layer more)
          (re.compile(r"\btemporal_block\.linear_[yx]\b"), "temporal_block.linear_yx"),
          # Inkling's relative states: with q, k and v in one matrix (model/inkling.py)
          (re.compile(r"\bself_attn\.r_proj\b"), "self_attn.qkv_proj"),
          (re.compile(r"\b[qkv]_proj\b"), "qkv_proj"), (re.compile(r"\b(gate|up)_proj\b"),
          "gate_up_proj"), (re.compile(r"\bw[13]\b"), "w13"),
          # a GGUF's experts (`gguf_archs`: `experts.gate`/`.up`) and GraniteMoE's
          # `input_linear.gate`/`.up`: one gate_up `Linear` per expert (`moe.SparseMoE`), padded
          # as one where the packing pads rows (bf16 on AVX-512 without AMX: to 64)
          (re.compile(r"\b(experts|input_linear)\.(gate|up)\b"), r"\1.gate_up"),
          (re.compile(r"\b(q_a_proj|kv_a_proj_with_mqa)\b"), "qkv_proj"),
          # Qwen3-Next's and Qwen3.5's DeltaNet projections: one matrix (model/qwen3_next.py)
          (re.compile(r"\bin_proj_(qkvz|ba|qkv|z|b|a)\b"), "in_proj"))  # fmt: skip
# BailingHybrid's KDA gates, f_proj and g_proj: in the layer's one in_proj (model/bailing_hybrid.py)
_BAILING_KDA_GATES = re.compile(r"\bself_attn\.[fg]_proj\b")
# DeepSeek's latent attention (model/deepseek.py): q_a (or q) with kv_a as one matmul, q_b, kv_b
_PROJECTIONS = re.compile(r"(self_attn\.(([qkvo]|qkv|q_a|q_b|kv_b|gate)_proj|kv_a_proj_with_mqa)|"
                          r"mlp\.((gate|up|gate_up|down)_proj|c_fc|c_proj))\.weight$")  # fmt: skip
_KIND = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


@dataclass(frozen=True)
class Weights:
    """The weights' bytes on one rank and how they were counted (for messages)."""

    bytes: int
    how: str
    in_place: bool = False  # some matrices kept as stored, read by the quantized GEMM

    def __str__(self) -> str:
        return f"{gib(self.bytes)} {self.how}"


def gib(n: float) -> str:
    """Bytes as a short human string (binary units, like --kv-cache-memory)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def estimate(
    mc: ModelConfig,
    cfg: EngineConfig,
    path: Path,
    tp: int | None = None,
    device: torch.device | None = None,
) -> Weights:
    """The bytes one rank of `cfg` (on `device`, default its own) holds for the weights of the
    checkpoint at `path` (module docstring), read from its metadata."""
    tp = cfg.parallel.tensor_parallel_size if tp is None else tp
    ckpt = read_checkpoint(Path(path), mc.architecture)
    place = placement(cfg, Path(path), tp, device)
    if ckpt.form == "file":  # unparsed: its size
        what = "the file (no tensor table read)"
        return Weights(-(-ckpt.file_bytes // tp), f"(the size of {what}{_ranks(tp)})")
    name = str(place.dtype).removeprefix("torch.")
    if ckpt.form == "":  # config.json alone: the shapes
        held = from_shapes(mc, place.dtype, place.fp8 is not None, tp)
        return Weights(held, f"as {name} (from the config's shapes: no weight "
                       f"files{_ranks(tp)})")  # fmt: skip
    total, notes = resident(ckpt, mc, place)
    stored = f"{gib(ckpt.file_bytes)} {ckpt.kinds()} {ckpt.form}"
    if "blocks" in notes:
        what = "blocks" if ckpt.form == "GGUF" else "16-bit matrices"
        target, verb = f"float32 and the quantized GEMM's packed {what}", " read in place"
    else:
        target = f"FP8 projections + {name}" if "fp8" in notes else name
        quantized = ckpt.form == "GGUF" and any(t.kind not in ("F32", "F16", "BF16")
                                                 for t in ckpt.tensors.values())  # fmt: skip
        quantized = quantized or any(n.endswith("_blocks") for n in ckpt.tensors)  # MXFP4
        same = {t.kind for t in ckpt.tensors.values()} == {_KIND.get(place.dtype)}
        verb = " dequantized" if quantized else " as stored" if same else " converted"
    extra = "".join(f"; {v}" for k, v in notes.items() if k not in ("blocks", "fp8"))
    how = f"as {target} ({stored}{verb}{extra}{_ranks(tp)})"
    return Weights(total, how, "blocks" in notes)


def _ranks(tp: int) -> str:
    return f"; one rank's share of {tp}" if tp > 1 else ""


def resident(ckpt: Checkpoint, mc: ModelConfig, p: Placement) -> tuple[int, dict[str, str]]:
    """Bytes one rank holds (module docstring), and notes on how: "blocks", "fp8", extras."""
    from pagoda.runtime.distributed.layout import TPLayout

    lay = TPLayout(0, p.tp)
    if mc.family.dsv4 is not None:  # DeepSeek-V4: its tensors as a rank holds them, whatever
        # the files store (released FP8 / FP4 dequantized to the dtype: model/dsv4_shard.py)
        from pagoda.runtime.model.dsv4_shard import held_bytes

        return held_bytes(mc.family.dsv4, p.dtype, lay), {}
    tensors = {n: t for n, t in ckpt.tensors.items() if read_by_model(n, mc)}
    tensors = as_held(tensors, mc)
    tied = mc.tie_word_embeddings or HEAD not in ckpt.tensors
    total, note = _embedding_and_head(tensors, mc, p, lay, tied)
    if mc.architecture == "ergo" and EMBED in tensors:  # its table in float32 (model/ergo.py;
        rows, cols = _local(EMBED, tensors[EMBED].shape, mc, lay)  # a rank's vocabulary rows)
        total += rows * cols * (4 - p.dtype.itemsize)
    if mc.family.positions == "sinusoidal":  # XGLM's table, computed (model/positions.py)
        rows = mc.max_position_embeddings + mc.family.position_offset
        total += rows * mc.hidden_size * p.dtype.itemsize
    notes = {"tied": note} if note else {}
    groups: dict[str, list[Stored]] = {}  # the matrices of one Linear (q/k/v, gate/up fused)
    for name, t in tensors.items():
        if name in (EMBED, HEAD):
            continue
        held = held_apart(name, t, mc, lay, p)
        if held is None:
            groups.setdefault(_group(name, mc), []).append(t)
        else:
            total += held
    fp8_layers = blocks = 0
    for parts in groups.values():
        held = _bound(parts) if p.blocks and parts[0].kind != _HELD else None
        if held is not None:
            total, blocks = total + held, blocks + 1
        elif p.fp8 is not None and _runs_in_fp8(parts[0].name, p.fp8, mc):
            for t in parts:  # E4M3 values and a float32 scale per output row
                rows, cols = _local(t.name, t.shape, mc, lay)
                whole_rows = t.shape[0] if _row_parallel(t.name) else rows
                total += rows * cols + 4 * whole_rows
            fp8_layers += 1
        else:
            total += dense_bytes(parts, mc, lay, p)
    if mc.vision is not None:  # a vision tower and projector (LLaVA's), held in the dtype
        total += mc.vision.num_params(mc.hidden_size) * p.dtype.itemsize
    if blocks:
        notes["blocks"] = str(blocks)
    if fp8_layers:
        notes["fp8"] = str(fp8_layers)
    return total, notes


# Qwen2-MoE's shared expert, DeepSeek's shared_experts
_HYBRID_FP8 = re.compile(r"(mamba\.(in|out)_proj|shared_mlp\.(input|output)_linear|"
                         r"feed_forward\.(gate|up|down)_proj|mlp\.experts\.\d+\.(up|down)_proj|"
                         r"mlp\.fc[12]_latent_proj)\.weight$")  # fmt: skip
_SHARED_EXPERT = re.compile(
    r"(mlp\.(shared_experts?|shared_mlp)\.(gate|up|down)_proj|"
    r"shared_mlp\.(input|output)_linear)\.weight$"
)  # GraniteMoeShared's


def _runs_in_fp8(name: str, scheme: Fp8Scheme, mc: ModelConfig | None = None) -> bool:
    """A dense layer's projection the FP8 scheme names (`llama.linear_layer`): not the router,
    the experts, the embedding or the LM head; Qwen2-MoE's shared expert is a dense MLP
    (`moe.SharedExpertMoE`); a hybrid's Mamba2 projections, Granite 4.0's shared MLP, Bamba's
    and Falcon-H1's `feed_forward`, and Nemotron-H's experts (each its own linear layer)."""
    dense = _PROJECTIONS.search(name) or _SHARED_EXPERT.search(name)
    hybrid = mc is not None and mc.family.mamba is not None and _HYBRID_FP8.search(name)
    return bool(dense or hybrid) and scheme.quantizes(name.removesuffix(".weight"))


def _embedding_and_head(tensors: dict[str, Stored], mc: ModelConfig, p: Placement, lay,
                        tied: bool) -> tuple[int, str]:  # fmt: skip
    """The embedding table and the LM head (`llama._lookup_table`, `LlamaModel.__init__`):
    bytes, and a note when a tied head holds its own copy."""
    from pagoda.runtime.cpu.quantized import readable

    embed = tensors.get(EMBED)
    head = embed if tied else tensors.get(HEAD)
    if embed is None or head is None:
        return 0, ""
    rows, cols = _local(EMBED, embed.shape, mc, lay)
    table = rows * cols * p.dtype.itemsize
    head_rows, head_cols = _local(HEAD, head.shape, mc, lay)
    dense_head = dense_bytes([Stored(HEAD, head.kind, (head_rows * lay.size, head_cols), 0)],
                        mc, lay, p)  # fmt: skip
    note = "with the tied LM head's packed copy"
    if not p.blocks:  # a CPU Linear packs its own copy; on CUDA the head multiplies the table
        if tied:
            return (table + dense_head, note) if p.packs else (table, "")
        return table + dense_head, ""

    def blocks(t: Stored) -> int | None:
        if not readable(t.kind, t.shape[-1]) or len(t.shape) != 2:
            return None
        return packed_bytes([(t.kind, t.shape[0])], t.shape[1])

    # LlamaModel.head_blocks: a soft-capped or scaled head stays dense
    head_blocks = None if mc.family.transforms_logits else blocks(head)
    if tied and head_blocks is not None:  # the lookups read the head's blocks
        return head_blocks, ""
    held = dense_head if head_blocks is None else head_blocks
    lookup = blocks(embed)  # `_lookup_table`: the table's own blocks, else the float32 table
    if lookup is None:
        lookup = 0 if tied and not p.packs else table
    return lookup + held, note if tied and head_blocks is None else ""


def _group(name: str, mc: ModelConfig | None = None) -> str:
    if mc is not None and mc.architecture == "inkling2":
        return _inkling2_group(name, mc)
    m = None if mc is None or mc.architecture != "bailing_hybrid" else _LAYER.match(name)
    if m and mc.family.mamba.layers[int(m.group(1))]:  # its KDA gates in the one in_proj (its
        name = _BAILING_KDA_GATES.sub("self_attn.qkv_proj", name)  # attention's g_proj apart)
    for pattern, fused in _FUSED:
        name = pattern.sub(fused, name)
    return name


# Inkling 2's q input's matrices: one Linear (`model/inkling2.py`)
_INKLING2_Q = re.compile(r"\bself_attn\.(q_proj\.linear|o_proj\.gate_proj|sink_proj|"
                         r"relative_position_bias\.linear)\b")  # fmt: skip


def _inkling2_group(name: str, mc: ModelConfig) -> str:
    """Inkling 2's Linears (`model/inkling2.py`): q, the output gate, the sinks and the relative
    states one; a window layer's k and v one; a full layer's k, v and their taps each apart."""
    name = _INKLING2_Q.sub("self_attn.q_inputs", name)
    m = _LAYER.match(name)
    if m and mc.family.mamba.inkling2.sliding[int(m.group(1))]:
        return re.sub(r"\bself_attn\.[kv]_proj\.linear\b", "self_attn.kv_proj.linear", name)
    return name


def _bound(parts: list[Stored]) -> int | None:
    """Bytes `qgemm` holds for one layer's matrices (float32 CPU), or None where a part is in
    a form it does not read (the layer then is a float32 `Linear`)."""
    from pagoda.runtime.cpu.quantized import readable

    if not all(readable(t.kind, t.shape[-1]) for t in parts):
        return None
    if len({t.shape[:-2] for t in parts}) != 1:
        return None
    experts = parts[0].shape[0] if len(parts[0].shape) == 3 else 1
    return experts * packed_bytes([(t.kind, t.shape[-2]) for t in parts], parts[0].shape[-1])
