"""A tensor-parallel group: this rank's place in it and the collectives the model runs.

Two `torch.distributed` process groups over the same ranks:

- the *device* group (NCCL on CUDA, gloo on the CPU) carries the model's all-reduces and the
  logits' all-gather, and the step's token ids; on CUDA these are NCCL kernels on the current
  stream, so a captured CUDA graph holds them like any other kernel. Its timeout
  (``PAGODA_TP_TIMEOUT_S``, default 120 s) bounds how long a rank waits for a peer in a step;
- the *control* group (gloo, host memory) carries each step's host inputs from rank 0
  (`step_channel.py`) and start-up agreements. A worker waits on it for the next step however
  long the server stays idle, so its timeout is long; a rank that dies closes its sockets and
  the peers' gloo calls fail at once (what `executor.py`'s watch does not see first).
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from pagoda.runtime.distributed.layout import TPLayout

log = logging.getLogger(__name__)
TIMEOUT_ENV = "PAGODA_TP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0
IDLE_TIMEOUT = datetime.timedelta(days=3650)  # a worker waiting for the next step


def step_timeout() -> datetime.timedelta:
    """How long a collective inside a step may wait for a peer (env PAGODA_TP_TIMEOUT_S)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be positive, got {text!r}")
    return datetime.timedelta(seconds=seconds)


def _gather_into(out: torch.Tensor, x: torch.Tensor, group) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch < 2.13
    fn(out, x, group=group)


class TPGroup:
    """This process's rank in a tensor-parallel group of `size` (`TPLayout`), and its
    collectives. `size == 1` never gets here: a single rank runs without one."""

    def __init__(self, layout: TPLayout, device: torch.device, device_group, control_group):
        self.layout, self.device = layout, device
        self.rank, self.size = layout.rank, layout.size
        self.device_group, self.control_group = device_group, control_group

    @classmethod
    def join(cls, rank: int, size: int, address: str, port: int, device: torch.device) -> TPGroup:
        """Meet the other ranks at tcp://address:port (rank 0's store) and build both groups."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(
            backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=size,
            timeout=step_timeout(), **kwargs,
        )  # fmt: skip
        try:
            control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        except BaseException:  # a peer gone mid-rendezvous: leave, so that a new start can join
            leave(broken=True)
            raise
        log.info("tensor-parallel rank %d of %d joined (%s)", rank, size, backend)
        return cls(TPLayout(rank, size), device, dist.group.WORLD, control)

    # -- in the model's forward (capturable on CUDA) ----------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x`, in place."""
        dist.all_reduce(x, group=self.device_group)
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """[M, n] per rank → [M, size * n]: rank r's columns at r * n (the logits' shards)."""
        m, n = x.shape
        out = torch.empty((self.size * m, n), dtype=x.dtype, device=x.device)
        _gather_into(out, x.contiguous(), self.device_group)
        return out.view(self.size, m, n).transpose(0, 1).reshape(m, self.size * n)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank (device group), in place."""
        dist.broadcast(x, 0, group=self.device_group)
        return x

    # -- on the host (control group) ----------------------------------------------------------
    def broadcast_host(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU tensor `x` on every rank, in place."""
        dist.broadcast(x, 0, group=self.control_group)
        return x

    def agree_min(self, value: int) -> int:
        """The smallest `value` of all ranks (e.g. the KV blocks every rank can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control_group)
        return int(t.item())

    def close(self, *, broken: bool = False) -> None:
        """Leave the group (`leave`); `broken`: a rank is gone, or the start failed midway."""
        leave(broken=broken)


def leave(*, broken: bool = False) -> None:
    """Tear down this process's groups, so that a later start in the same process (a second
    `LLM(...)` after a failed one) can join a new group. A `broken` group (a rank gone, a start
    failed midway), or one whose shutdown fails, is aborted: that waits on no peer (a NCCL
    shutdown could), and leaves no default group behind either."""
    if not dist.is_initialized():
        return
    if not broken:
        try:
            dist.destroy_process_group()
        except Exception:  # a dead peer's group cannot always be shut down cleanly
            log.debug("destroying the process group failed; aborting it", exc_info=True)
    if dist.is_initialized():
        try:
            c10d._abort_process_group()  # every group of this process
        except Exception:
            log.warning("the tensor-parallel process group could not be torn down; a new "
                        "group in this process will fail to start", exc_info=True)  # fmt: skip
