"""Log records held while `pagoda serve`'s start-up is checked: printed once the checks pass,
dropped when they fail, so a refused start is exactly one line (a download's progress is not
held). The API process holds its own; the engine process, where the checks run by default,
holds the checks' (`launch.checked_factory`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

LIVE_LOGGERS = ("pagoda.runtime.model.sources",)  # a download's progress is shown as it goes


@contextlib.contextmanager
def held_logs() -> Iterator[None]:
    """Hold log records while start-up is checked: printed once it passes, dropped when it
    fails, so a refused start is exactly one line (a download's progress is not held)."""
    root = logging.getLogger()
    held: list[logging.LogRecord] = []
    handlers = root.handlers

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name.startswith(LIVE_LOGGERS):
                for h in handlers:
                    if record.levelno >= h.level:
                        h.handle(record)
            else:
                held.append(record)

    root.handlers = [Hold()]
    try:
        yield
    finally:
        root.handlers = handlers
    for record in held:
        root.handle(record)
