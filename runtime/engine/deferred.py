"""Engine-loop work that waits on something running off the engine thread (a LoRA adapter read,
`lora/slots.LoRASlots.start_read`), so that the loop keeps stepping meanwhile.

- `Deferred`: the answer of a `run_in_engine` call that is not ready yet (`EngineCore.load_lora`):
  the loop holds it until `wait` is done, then calls `finish(core)` on the engine thread and
  answers with its result or error;
- `Parked`: what a loop holds until its futures are done (a request naming an adapter being
  read, a `Deferred`), in arrival order; the engine thread's loop is woken when one finishes.

The engine process's loop (`core_proc.py`) keeps requests waiting on a read with those waiting
on their grammar's compile (one wait for both); the engine thread's (`engine_thread.py`) parks
both kinds here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Deferred:
    wait: Future
    finish: Callable[[Any], Any]  # (core) -> the call's answer, on the engine thread


def all_done(futures) -> bool:
    return all(f is None or f.done() for f in futures)


class Parked:
    """Payloads by key, each held until its futures are done (`ready`)."""

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        """`wake`: called (from the finishing thread) when a future is done."""
        self.items: dict[Any, tuple[tuple[Future, ...], Any]] = {}
        self.wake = wake

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, key: Any, futures: tuple[Future, ...], payload: Any) -> None:
        self.items[key] = (futures, payload)
        if self.wake is not None:
            for f in futures:
                f.add_done_callback(lambda _: self.wake())

    def drop(self, key: Any) -> bool:
        return self.items.pop(key, None) is not None

    def ready(self) -> list[tuple[Any, Any]]:
        """(key, payload) of those whose futures are all done, in arrival order, no longer
        held."""
        keys = [k for k, (futures, _) in self.items.items() if all_done(futures)]
        return [(k, self.items.pop(k)[1]) for k in keys]
