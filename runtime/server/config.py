"""ServerConfig: the HTTP side of `pagoda serve`, validated once at start-up."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pagoda.runtime import options

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'512MiB', '2G', '1.5gb', '1048576' → bytes (K/M/G/T are powers of 1024, as for memory)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"kv_cache_memory: cannot parse size {text!r} (e.g. 512MiB, 2G)")
    scale = 1024 ** " kmgt".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * scale)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP side of `pagoda serve` (defaults from `options`, shared with the operator)."""

    model: str = options.DEFAULT_MODEL
    served_model_names: tuple[str, ...] = ()  # empty: the --model string
    host: str = options.DEFAULT_HOST
    port: int = options.DEFAULT_PORT
    api_key: str | None = None
    max_queue_len: int = options.DEFAULT_MAX_QUEUE_LEN
    max_request_bytes: int = options.DEFAULT_MAX_REQUEST_BYTES
    drain_timeout: float = options.DEFAULT_DRAIN_TIMEOUT_S
    enable_debug_endpoints: bool = False
    log_level: str = options.DEFAULT_LOG_LEVEL
    engine_args: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.served_model_names:
            object.__setattr__(self, "served_model_names", (self.model,))
        if any(not isinstance(n, str) or not n for n in self.served_model_names):
            raise ValueError("served_model_name entries must be non-empty strings")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port!r}")
        if not self.host:
            raise ValueError("host must not be empty")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty when set")
        if not isinstance(self.max_queue_len, int) or self.max_queue_len < 1:
            raise ValueError(
                f"max_queue_len must be a positive integer, got {self.max_queue_len!r}"
            )
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes < 1024:
            raise ValueError(
                f"max_request_bytes must be an integer >= 1024, got {self.max_request_bytes!r}"
            )
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout!r}")
        if self.log_level not in options.LOG_LEVELS:
            raise ValueError(f"log_level must be a logging level name, got {self.log_level!r}")

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]
