"""ServerConfig: the HTTP side of `pagoda serve`, validated once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.runtime import options


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
