"""Tensor-parallel layers: column- and row-parallel linears, the vocabulary-parallel embedding
and LM head (Megatron-LM's, as vLLM's `VocabParallelEmbedding` / `RowParallelLinear`).

Each is a plain `Linear` over this rank's slice of the checkpoint's matrix (`layout.py` says
which), plus at most one collective:

- column-parallel (q/k/v, gate/up): rows of W, output columns stay on their rank, no
  communication; the biases' rows go with them;
- row-parallel (o, down): columns of W, each rank's partial product summed by an all-reduce;
  the bias is added once, after it;
- vocabulary-parallel embedding: each rank looks up the ids in its rows (zeros for the others),
  summed by an all-reduce (exact: one term is non-zero);
- LM head: each rank's logits for its vocabulary rows, all-gathered into [M, vocab] on every
  rank (the sampler runs on rank 0; an all-gather is one collective that CUDA graphs capture).

Without a group (one rank) `column_linear` and `row_linear` build exactly the layers
`Linear` always built, stored GGUF blocks included (`qgemm`); with one, float matrices only.

FP8 (where the engine runs the projections in the FP8 GEMM, `quantization.fp8`): a split layer
is an `Fp8Linear` over this rank's part of the layer TP = 1 would build (`fp8.shard`):

- column-parallel: its rows with their per-output-channel scales; ``--quantization fp8``
  quantizes just those rows (a row's scale is its own amax, so they are the same codes);
- row-parallel: its input columns under the whole matrix's scales, unchanged (quantized from
  the whole rows, then cut), so the partial products sum to the unsplit product. What is not
  the same as one rank: with dynamic activations each rank scales its slice of a token by that
  slice's own amax (as vLLM does), so the sum differs from TP = 1 in rounding, not in math.

An FP8 checkpoint where the FP8 kernels do not run is dequantized at load (`DeviceWeights`) and
split as 16-bit matrices. The embedding, LM head and MoE experts stay 16-bit, as with one rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.model.linear import Linear

if TYPE_CHECKING:
    from pagoda.runtime.model.device_weights import DeviceWeights
    from pagoda.runtime.model.fp8_linear import Fp8Linear
    from pagoda.runtime.model.llama import LayerContext
    from pagoda.runtime.quantization.fp8 import Fp8LinearWeights


def _bias(name: str) -> str:
    return name[: -len("weight")] + "bias"


def column_linear(
    ctx: LayerContext,
    w: DeviceWeights,
    names: list[str],
    parts: Sequence[tuple[int, int]] | None = None,
) -> Linear | Fp8Linear:
    """The matrices `names` stacked (q/k/v, gate/up), this rank's rows of each: `parts[i]`
    of `names[i]`, or an even share."""
    tp = ctx.tp
    if tp is None:
        return ctx.linear(w.cat(names), w.biases(names), quantized=w.quantized(names))
    if parts is None:
        parts = [tp.layout.even(w.length(n, 0)) for n in names]
    bias = None
    if any(_bias(n) in w for n in names):  # all or none, a missing one named by `part`
        bias = torch.cat([w.part(_bias(n), 0, *p) for n, p in zip(names, parts)])
    fp8 = fp8_rows(w, names, parts)
    if fp8 is not None:
        return _fp8_linear(w, fp8, bias)
    weight = torch.cat([w.part(n, 0, *p) for n, p in zip(names, parts)])
    return ctx.linear(weight, bias)


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def _fp8_linear(
    w: DeviceWeights, weights: Fp8LinearWeights, bias: torch.Tensor | None
) -> Fp8Linear:
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    assert w.fp8 is not None
    return Fp8Linear(weights, bias, weight_only=w.fp8.activations == "none")


def fp8_rows(
    w: DeviceWeights, names: list[str], parts: Sequence[tuple[int, int]]
) -> Fp8LinearWeights | None:
    """Rows `parts[i]` of each of `names`, stacked, as one FP8 operand with their scales; None
    where the engine does not run these projections in FP8 (module docstring)."""
    from pagoda.runtime.quantization import fp8

    if not w.runs_fp8(names):
        return None
    assert w.fp8 is not None
    pieces = []
    for n, (start, stop) in zip(names, parts):
        if w.fp8.serialized:
            whole = fp8.load_linear(w.stored, _module(n), w.fp8)
            piece = fp8.shard(whole, 0, start, stop).to(w.device)
            w.finite.add(n, piece.weight)  # load_linear refused non-finite scales
            pieces.append(piece)
        else:  # one scale per row: these rows' codes are the whole matrix's
            rows = w.source(n).narrow(0, start, stop - start)
            pieces.append(fp8.quantize_linear(rows))
    return fp8.fuse(pieces)


def fp8_columns(w: DeviceWeights, name: str, start: int, stop: int) -> Fp8LinearWeights | None:
    """Input columns [start, stop) of `name` under the whole matrix's per-row scales; None
    where it does not run in FP8."""
    from pagoda.runtime.quantization import fp8

    if not w.runs_fp8([name]):
        return None
    whole = w.fp8_weights([name])  # quantized (or read) whole: the scales of entire rows
    assert whole is not None
    return fp8.shard(whole, 1, start, stop)


def qkv_linear(
    ctx: LayerContext, w: DeviceWeights, names: list[str], c: ModelConfig
) -> Linear | Fp8Linear:
    """q, k and v stacked: this rank's query heads and its KV heads (shared or replicated)."""
    if ctx.tp is None:
        return column_linear(ctx, w, names)
    rows = ctx.tp.layout.qkv_rows(c.num_heads, c.num_kv_heads, c.head_dim)
    return column_linear(ctx, w, names, rows)


def fused_gate_up(ctx: LayerContext, w: DeviceWeights, name: str) -> Linear | Fp8Linear:
    """One stored gate_up matrix [2 I, in] (gate rows first: xLSTM's, MiniMax-M3's, families
    not run in FP8): whole, or this rank's rows of each half (`even` of I)."""
    if ctx.tp is None:
        return column_linear(ctx, w, [name])
    half = w.length(name, 0) // 2
    r0, r1 = ctx.tp.layout.even(half)
    return column_linear(ctx, w, [name, name], [(r0, r1), (half + r0, half + r1)])


class RowParallelLinear:
    """x (this rank's input columns) @ W[:, columns].T, summed over ranks, + bias."""

    __slots__ = ("bias", "inner", "tp")
    fast = None  # no stored-block kernel (`model_build.log_quantized_layers` asks)

    def __init__(self, inner: Linear | Fp8Linear, bias: torch.Tensor | None, tp: TPGroup) -> None:
        self.inner, self.bias, self.tp = inner, bias, tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(self.inner(x))
        return y if self.bias is None else y + self.bias


def row_linear(ctx: LayerContext, w: DeviceWeights, name: str) -> Linear | RowParallelLinear:
    """o_proj / down_proj: this rank's input columns, summed across ranks."""
    tp = ctx.tp
    if tp is None:
        return ctx.linear(w[name], w.biases([name]), quantized=w.quantized([name]))
    cols = tp.layout.even(w.length(name, 1))
    bias = w.biases([name])  # added once, after the sum
    fp8 = fp8_columns(w, name, *cols)
    inner = ctx.linear(w.part(name, 1, *cols)) if fp8 is None else _fp8_linear(w, fp8, None)
    return RowParallelLinear(inner, bias, tp)


class VocabParallelEmbedding:
    """Rows [start, start + n) of the (padded) embedding table; a lookup is summed over ranks."""

    def __init__(self, table: torch.Tensor, start: int, tp: TPGroup) -> None:
        self.table, self.start, self.tp = table, start, tp

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.table.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.table)
        out.masked_fill_(outside.unsqueeze(1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead:
    """This rank's vocabulary rows of the LM head; the logits are all-gathered, padding cut."""

    fast = None
    fuses_sampling = False  # the sampler needs every rank's logits

    def __init__(self, inner: Linear, vocab_size: int, tp: TPGroup) -> None:
        self.inner, self.vocab_size, self.tp = inner, vocab_size, tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.tp.gather_columns(self.inner(x))
        if logits.shape[1] == self.vocab_size:
            return logits
        return logits[:, : self.vocab_size].contiguous()

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(-1)


def vocab_parallel(
    ctx: LayerContext, w: DeviceWeights, embed: str, head: str
) -> tuple[VocabParallelEmbedding, ParallelLMHead, int]:
    """(embedding, LM head, vocabulary size) of this rank; `head == embed` when tied."""
    tp = ctx.tp
    assert tp is not None
    start, stop = tp.layout.vocab(w.length(embed, 0))
    table = w.part(embed, 0, start, stop)  # zero rows past the vocabulary
    vocab = w.length(head, 0)
    head_rows = table if head == embed else w.part(head, 0, *tp.layout.vocab(vocab))
    return (
        VocabParallelEmbedding(table, start, tp),
        ParallelLMHead(ctx.linear(head_rows), vocab, tp),
        vocab,
    )
