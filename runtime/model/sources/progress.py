"""Download progress: a log line at the start and one at the end; between them, on a terminal
(stderr is a TTY: `pagoda download` by hand) a tqdm bar redrawn in place, else (a pod's log, a
file, a pipe) one line every `interval_s`, so a log holds a few lines, not carriage-return bars."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

from pagoda.runtime.model.sources.cache import human

PROGRESS_INTERVAL_S = 10.0
BAR_INTERVAL_S = 0.5
log = logging.getLogger("pagoda.runtime.model.sources")


class Progress:
    """Bytes of one download: counted (`add`, from a client's callback) or measured (`measure`,
    a function that returns the bytes on disk so far). Thread-safe."""

    def __init__(
        self,
        uri: str,
        total_bytes: int,
        total_files: int,
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
        measure: Callable[[], int] | None = None,
        bar: bool | None = None,
    ) -> None:
        """`bar` None: a bar when stderr is a terminal."""
        self.uri, self.total, self.files = uri, total_bytes, total_files
        self.bar = _is_terminal() if bar is None else bar
        self.interval_s = BAR_INTERVAL_S if self.bar else interval_s
        self.measure = measure
        self.done = 0
        self.files_done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread: threading.Thread | None = None

    def add(self, n: int) -> None:
        with self._lock:
            self.done += int(n)

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1

    def __enter__(self) -> Progress:
        log.info(
            "%s: downloading %d file%s, %s",
            self.uri, self.files, "" if self.files == 1 else "s", human(self.total),
        )  # fmt: skip
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            took = time.monotonic() - self._started
            log.info("%s: downloaded %s in %.1f s", self.uri, human(self.total), took)

    def _bytes(self) -> int:
        if self.measure is not None:
            try:
                return self.measure()
            except OSError:
                return self.done
        return self.done

    def line(self) -> str:
        done = min(self._bytes(), self.total) if self.total else self._bytes()
        took = max(time.monotonic() - self._started, 1e-6)
        pct = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        files = f", {self.files_done}/{self.files} files" if self.measure is None else ""
        return (
            f"{self.uri}: downloaded {human(done)} of {human(self.total)}{pct}, "
            f"{human(done / took)}/s{files}"
        )

    def _run(self) -> None:
        if not self.bar:
            while not self._stop.wait(self.interval_s):
                log.info("%s", self.line())
            return
        from tqdm import tqdm

        with tqdm(total=self.total or None, desc=self.uri, unit="B", unit_scale=True,
                  unit_divisor=1024, file=sys.stderr, leave=False) as bar:  # fmt: skip
            while not self._stop.wait(self.interval_s):
                bar.update(max(0, min(self._bytes(), self.total or 1 << 62) - bar.n))


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False
