"""Where a steady step's device time goes: torch.profiler over a window of engine steps.

The per-phase clock of `gpu_throughput.py` says a full-batch decode step's forward takes ~2x
the memory floor; this says which kernels that time is made of (matmuls by shape family,
attention, norms, sampling), per step, so the next change aims at the largest one. On CPU
(the smoke run) it ranks the CPU operators instead.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile


class KernelProfile:
    """Profile engine steps [start, start + steps); `top()` ranks the kernels seen."""

    def __init__(self, start: int, steps: int, device: torch.device) -> None:
        self.start, self.steps, self.device = start, steps, device
        self._prof: profile | None = None
        self.profiled = 0  # steps inside the window

    def before_step(self, i: int) -> None:
        if i == self.start:
            acts = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                acts.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=acts)
            self._prof.__enter__()

    def after_step(self, i: int) -> None:
        """Close the window after its last step (or at the end of the run: `i` = -1)."""
        if self._prof is None or self.profiled < 0:
            return
        if i >= self.start:
            self.profiled = i - self.start + 1
        if i == self.start + self.steps - 1 or i < 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # async scheduling: the last step's work
            self._prof.__exit__(None, None, None)
            self.steps, self.profiled = self.profiled, -1

    def top(self, n: int = 15) -> list[dict]:
        """The `n` kernels (operators on CPU) with the most self time, ms per profiled step."""
        if self._prof is None or self.steps <= 0:
            return []
        cuda = self.device.type == "cuda"
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for e in self._prof.key_averages():
            us = e.self_device_time_total if cuda else e.self_cpu_time_total
            if us > 0 and (not cuda or e.device_type.name == "CUDA"):
                totals[e.key][0] += us
                totals[e.key][1] += e.count
        whole = sum(us for us, _ in totals.values()) or 1.0
        ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
        return [
            {
                "kernel": name,
                "ms_per_step": us / 1e3 / self.steps,
                "calls_per_step": count / self.steps,
                "share": us / whole,
            }
            for name, (us, count) in ranked
        ]


def print_top(rows: list[dict], steps: int, where: str) -> None:
    """A short table: share, ms per step, calls per step, kernel name (cut to 90 characters)."""
    if not rows:
        print(f"kernel profile: nothing recorded ({where})")
        return
    total = sum(r["ms_per_step"] for r in rows)
    print(f"kernel profile, {where}: top {len(rows)} by self time over {steps} steps "
          f"({total:.2f} ms/step among them)")  # fmt: skip
    for r in rows:
        print(
            f"  {100 * r['share']:5.1f}%  {r['ms_per_step']:7.3f} ms  "
            f"{r['calls_per_step']:6.1f} calls  {r['kernel'][:90]}"
        )
