"""Does a checkpoint hold NaN or Inf? Checked on the device as the weights arrive there, so that
a broken checkpoint is refused at load (one line naming the first such tensor; `pagoda serve` and
`pagoda tune` exit 2, the offline `LLM` raises ValueError) instead of serving garbage tokens.

Each tensor is reduced where it lies, into a flag of its own (a 0-d bool: `aminmax`, whose NaN
propagates; for FP8 E4M3, the maxima of its bytes, whose two NaN patterns are the int8 and the
uint8 maximum: no temporary the size of the tensor either way); the flags are read back once,
after the last layer is built: one device→host sync per load, not one per tensor. What it
costs: docs/reliability.md; `--no-check-weights` skips it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pagoda.runtime.termination import ReasonedError

if TYPE_CHECKING:
    from pagoda.runtime.distributed.group import TPGroup

FP8_NAN = 0x7F  # E4M3FN: S.1111.111 is NaN; it has no infinities


class NonFiniteWeights(ReasonedError):
    """A checkpoint tensor holds NaN or Inf: bad input, as a checkpoint of the wrong shape is
    (`pagoda serve` exits 2 with this one line, whether the engine loads before or after the
    server listens)."""

    reason = "InvalidCheckpoint"


def non_finite(t: torch.Tensor) -> torch.Tensor:
    """A 0-d bool on t's device: whether t holds NaN or ±Inf (no sync)."""
    if t.dtype == torch.float8_e4m3fn:  # its NaNs: 0x7F (int8's maximum) and 0xFF (uint8's)
        return (t.view(torch.int8).amax() == FP8_NAN) | (t.view(torch.uint8).amax() == 0xFF)
    lo, hi = torch.aminmax(t)
    return ~(torch.isfinite(lo) & torch.isfinite(hi))


class FiniteCheck:
    """Flags of the tensors `add`ed, read back by `check` in one sync."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._names: list[str] = []
        self._flags: list[torch.Tensor] = []

    def add(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Note `t` (checkpoint tensor `name`, or what it became on the device); returns it."""
        if self.enabled and t.is_floating_point() and t.numel():
            self._names.append(name)
            self._flags.append(non_finite(t.detach()))
        return t

    def check(self, tp: TPGroup | None = None) -> None:
        """NonFiniteWeights naming the first tensor added that holds NaN or Inf (one sync);
        forgets the flags. With `tp`, the ranks agree on the first such tensor (every rank adds
        the same names in the same order, each its own shards) and rank 0 alone raises: the
        others go on and are stopped by rank 0, rather than dying first and leaving it a lost
        connection to report."""
        names, flags = self._names, self._flags
        self._names, self._flags = [], []
        if not self.enabled:
            return
        read = []
        if flags:
            device = flags[0].device
            read = torch.stack([f.to(device) for f in flags]).tolist()  # the one sync
        first = next((i for i, flag in enumerate(read) if flag), len(read))
        if tp is not None:
            first = tp.agree_min(first)
        if first < len(names) and (tp is None or tp.rank == 0):
            more = sum(read[first + 1 :])
            raise NonFiniteWeights(
                f"checkpoint tensor {names[first]} holds NaN or Inf values"
                + (f" ({more} more tensors do too)" if more else "")
                + "; the checkpoint is broken (re-download or re-convert it)"
            )
