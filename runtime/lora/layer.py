"""`LoRALinear`: a model's linear layer plus the batch's adapters, applied in tensors.

Every adapter resident on the device sits in a slot of preallocated stacked tensors (slot 0: no
adapter, zeros): a layer's A is [max_loras + 1, parts x R, in] (a fused projection's parts, q/k/v
or gate/up, stacked along the rank) and each part's B [max_loras + 1, out_part, R], B already
scaled (alpha / r). The step's per-token slot index (`LoRAStep.index`, built once per step by
`slots.LoRASlots.prepare`) picks each token's adapter:

    y = base(x);  y[:, part] += (x @ A[idx]^T)[:, part's ranks] @ B_part[idx]^T

Three ways to compute it (`LoRAStep.mode`; benchmarks/lora_adapters.py measures them):

- "dense" (the default): every slot's shrink at once, x @ [A_1; ...; A_S]^T (one matmul of
  S x parts x R columns), each token's other slots' columns zeroed by its one-hot row, then one
  matmul by [B_1 ... B_S] per part (K = S x R). Both matmuls are `linear.Linear`s over the slot
  tensors (repacked when an adapter is loaded), so each row's bits do not depend on the row count,
  as the base layers' (greedy output stays batch-invariant); no gathers. It multiplies S times
  the adapters' arithmetic, small while S = --max-loras + 1 is.
- "bgmv" (punica's gathered matmul): each token's A and B gathered by its slot, a batched matmul.
- "sgmv" (grouped by slot): the rows of each adapter of the step through its matrices (a loop
  over the step's adapters, never over sequences).

A step whose tokens all run the base model skips the adapters entirely (`LoRAStep.index` None),
so base rows are the base model's bits.

Tensor parallelism (`Shard`, as vLLM's and punica's sharded LoRA layers): a column-parallel
layer's rank holds A whole and its rows of each part's B, so its output columns are the whole
product's; a row-parallel layer's rank holds its input columns of A and B whole, and its
wrapper sits inside the base layer, before the all-reduce: (sum_i x_i A_i^T) B^T =
sum_i (x_i A_i^T B^T), so adding each rank's x_i A_i^T B^T to its partial product is the exact
product with no collective of its own (an all-reduce of the [T, R] shrink would be one more per
layer, two per decoder layer, for the same sum). Every mode computes the same thing on its
rank's slices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MODES = ("dense", "bgmv", "sgmv")
# the default: the cheapest of the three at decode batch 8 and 32 and in the engine on the CPU
# measured (docs/benchmarks.md, "LoRA adapters"), and batch-invariant
MODE = "dense"


@dataclass(frozen=True)
class Shard:
    """A tensor-parallel rank's part of an adapter on one layer, as the base layer is split
    (`model/parallel_linear.py`): a column-parallel layer (q/k/v, gate/up) takes A whole and
    `rows[p]`, [start, stop) of part p's B (the part's rows of the base matrix); a row-parallel
    one (o, down) takes `cols`, A's input columns [start, stop), and B whole: its product is a
    partial sum, added to the base layer's partial product before that layer's all-reduce."""

    rows: tuple[tuple[int, int], ...] | None = None
    cols: tuple[int, int] | None = None


@dataclass
class LoRAStep:
    """What every wrapped layer reads in one step, set by the runner before the forward."""

    index: torch.Tensor | None = None  # int64 [T]: each token's slot; None: no adapter this step
    onehot: torch.Tensor | None = None  # dense: [T, slots, 1] in the model's dtype, 1 at the slot
    # sgmv: (slot, int64 rows of the tokens running it) per adapter in the step
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    mode: str = MODE


class LoRALinear:
    """`base(x)` plus each token's adapter on the output columns of each part (`parts`: the
    module names and widths the base's output is stacked from, in order)."""

    __slots__ = ("a", "b", "base", "bounds", "cols", "linear", "packed", "parts", "rank", "rows",
                 "step")  # fmt: skip

    def __init__(
        self,
        base,
        parts: list[tuple[str, int]],
        in_features: int,
        num_slots: int,
        rank: int,
        step: LoRAStep,
        dtype: torch.dtype,
        device: torch.device,
        linear=None,
        shard: Shard | None = None,
    ) -> None:
        """`linear`: how the model makes its `linear.Linear`s (its --batch-invariant), for the
        dense mode's matmuls over the slots. `shard`: a tensor-parallel rank's part of each
        adapter (`Shard`); `parts`' widths and `in_features` are then this rank's."""
        self.base, self.parts, self.rank, self.step = base, parts, rank, step
        self.linear, self.packed = linear, None
        self.rows = None if shard is None else shard.rows
        self.cols = None if shard is None else shard.cols
        self.a = torch.zeros(num_slots, len(parts) * rank, in_features, dtype=dtype, device=device)
        self.b = [torch.zeros(num_slots, w, rank, dtype=dtype, device=device) for _, w in parts]
        bounds, start = [], 0
        for _, w in parts:
            bounds.append((start, start + w))
            start += w
        self.bounds = bounds

    def __getattr__(self, name: str):  # `fast`, `fuses_sampling`, ...: the base layer's
        return getattr(self.base, name)

    def load(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put an adapter's matrices (by module name; a part it does not target: zeros) in
        `slot`, rank r <= R padded with zeros."""
        r_max = self.rank
        self.packed = None  # the dense mode's matmuls: repacked at the next call
        self.a[slot].zero_()
        for p, (name, _) in enumerate(self.parts):
            self.b[p][slot].zero_()
            ab = weights.get(name)
            if ab is None:
                continue
            a, b = ab
            if self.cols is not None:  # row-parallel: this rank's input columns of A
                a = a[:, self.cols[0] : self.cols[1]]
            if self.rows is not None:  # column-parallel: this rank's rows of each part's B
                b = b[self.rows[p][0] : self.rows[p][1]]
            r = a.shape[0]
            self.a[slot, p * r_max : p * r_max + r].copy_(a)
            self.b[p][slot, :, :r].copy_(b)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.step
        if step.index is None:
            return y
        if step.mode == "dense":
            return self._dense(x, y, step.onehot)
        if step.mode == "sgmv":
            return self._grouped(x, y, step.groups)
        return self._gathered(x, y, step.index)

    def _pack(self) -> list:
        """The dense mode's matmuls over the slots as they are now: [A_1; ...; A_S] and, per
        part, [B_1 ... B_S] (out x S*R)."""
        from pagoda.runtime.model.linear import Linear

        make = self.linear or Linear
        s, pr, fin = self.a.shape
        out = [make(self.a.reshape(s * pr, fin).contiguous())]
        for b in self.b:  # [S, out, R] -> [out, S*R]
            out.append(make(b.permute(1, 0, 2).reshape(b.shape[1], s * self.rank).contiguous()))
        self.packed = out
        return out

    def _dense(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """dense: every slot's product, each token's own kept by its one-hot row."""
        packed = self.packed or self._pack()
        t, s, r = x.shape[0], self.a.shape[0], self.rank
        h = packed[0](x.to(self.a.dtype)).view(t, s, len(self.parts), r)
        for p, (lo, hi) in enumerate(self.bounds):
            hm = (h[:, :, p, :] * onehot).reshape(t, s * r)  # other slots' ranks: zeros
            y[:, lo:hi] += packed[1 + p](hm).to(y.dtype)
        return y

    def _gathered(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """bgmv: every token's own A and B, gathered by its slot (slot 0's are zeros)."""
        xa = x.to(self.a.dtype).unsqueeze(2)  # [T, in, 1]
        h = torch.bmm(self.a.index_select(0, idx), xa)  # [T, P*R, 1]
        r = self.rank
        for p, (lo, hi) in enumerate(self.bounds):
            b = self.b[p].index_select(0, idx)  # [T, out_p, R]
            delta = torch.bmm(b, h[:, p * r : (p + 1) * r])  # [T, out_p, 1]
            y[:, lo:hi] += delta.squeeze(2).to(y.dtype)
        return y

    def _grouped(self, x: torch.Tensor, y: torch.Tensor, groups) -> torch.Tensor:
        """sgmv: per adapter of the step, its tokens' rows through its A and B."""
        r = self.rank
        for slot, rows in groups:
            h = x.index_select(0, rows).to(self.a.dtype) @ self.a[slot].T  # [n, P*R]
            for p, (lo, hi) in enumerate(self.bounds):
                delta = h[:, p * r : (p + 1) * r] @ self.b[p][slot].T  # [n, out_p]
                y[:, lo:hi].index_add_(0, rows, delta.to(y.dtype))
        return y
