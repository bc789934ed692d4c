"""Per-phase wall time of engine steps (schedule, prepare, forward, sample, ...), for benchmarks.

Off by default: the engine and the runner hold `clock = None` and skip every mark. On CUDA the
clock synchronises the device at each mark, so phases are attributed where the work happens
(this serialises the step: use it to find costs, not to measure throughput).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable


class StepClock:
    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.totals: dict[str, float] = defaultdict(float)  # phase → seconds, summed over steps
        self.steps = 0
        self._sync = sync
        self._last = time.perf_counter()

    def start(self) -> None:
        """Begin a step: time until the next mark belongs to its first phase."""
        self.steps += 1
        if self._sync is not None:
            self._sync()
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Close `phase`: the time since the previous mark is added to it."""
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        self.totals[phase] += now - self._last
        self._last = now

    def reset(self) -> None:
        self.totals.clear()
        self.steps = 0

    def per_step_ms(self) -> dict[str, float]:
        n = max(1, self.steps)
        return {k: 1e3 * v / n for k, v in self.totals.items()}
