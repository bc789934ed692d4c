"""Which part of a hybrid's Mamba2 mixers one tensor-parallel rank holds (vLLM's `MambaMixer2`,
pure arithmetic). Rank r of N holds

- heads ``[r H/N, (r+1) H/N)``: their rows of in_proj's z, x and dt parts, their x channels of
  the conv, their A, D and dt_bias, their channels of the gated norm's weight, and those input
  columns of out_proj (row-parallel: the partial products summed by an all-reduce);
- the B/C groups its heads read: ``[r G/N, (r+1) G/N)`` when N divides G, else (N a multiple of
  G) the one group ``r G / N``, *replicated* on the N / G ranks whose heads it serves (vLLM
  replicates a single group so; it refuses the other cases, as `layout.mamba_problem` does).
  Their rows of in_proj's B and C parts and their channels of the conv go with them.

Each rank's state slots hold its heads and its channels only (`local`). The gated norm runs
over groups of ``d_inner / G`` channels: whole on a rank when N divides G; when a group spans
``norm_ranks`` = N / G ranks, its sum of squares is gathered from them (`Mamba2Mixer`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.runtime.distributed.layout import TPLayout
from pagoda.runtime.recurrent_configs import MambaConfig


@dataclass(frozen=True)
class MambaShard:
    full: MambaConfig
    local: MambaConfig  # this rank's heads and groups (the mixer's and its state's shapes)
    heads: tuple[int, int]  # [start, stop) of the full model's heads
    groups: tuple[int, int]  # [start, stop) of its B/C groups
    norm_ranks: int  # the ranks one norm group spans (1: this rank's groups are whole)

    def in_proj_rows(self) -> list[tuple[int, int]]:
        """This rank's rows of in_proj's z, x, B, C and dt parts, in the full matrix."""
        f = self.full
        (h0, h1), (g0, g1), p, n = self.heads, self.groups, f.head_dim, f.d_state
        gn = f.n_groups * n
        return [(h0 * p, h1 * p), (f.d_inner + h0 * p, f.d_inner + h1 * p),
                (2 * f.d_inner + g0 * n, 2 * f.d_inner + g1 * n),
                (2 * f.d_inner + gn + g0 * n, 2 * f.d_inner + gn + g1 * n),
                (2 * f.d_inner + 2 * gn + h0, 2 * f.d_inner + 2 * gn + h1)]  # fmt: skip

    def conv_rows(self) -> list[tuple[int, int]]:
        """This rank's channels of the conv (x, B, C), in the full conv."""
        d = self.full.d_inner
        return [(a - d, b - d) for a, b in self.in_proj_rows()[1:4]]

    def head_channels(self) -> tuple[int, int]:
        """This rank's channels of d_inner (the norm's weight, out_proj's columns)."""
        return self.in_proj_rows()[0]


def whole(m: MambaConfig) -> MambaShard:
    """The one rank's: everything."""
    return MambaShard(m, m, (0, m.n_heads), (0, m.n_groups), 1)


def shard(m: MambaConfig, layout: TPLayout | None) -> MambaShard:
    """Rank `layout.rank`'s part (module docstring); `problem` is None for its size."""
    if layout is None or layout.size == 1:
        return whole(m)
    n = layout.size
    heads = layout.even(m.n_heads)
    if m.n_groups % n == 0:
        groups, norm_ranks = layout.even(m.n_groups), 1
    else:  # n a multiple of n_groups: the group this rank's heads read, replicated
        g = layout.rank * m.n_groups // n
        groups, norm_ranks = (g, g + 1), n // m.n_groups
    return MambaShard(m, m.on_ranks(n), heads, groups, norm_ranks)


def local(m: MambaConfig | None, tp: int) -> MambaConfig | None:
    """The mixers' shapes on one of `tp` ranks (every rank holds as many heads and groups)."""
    return None if m is None else m.on_ranks(tp)
