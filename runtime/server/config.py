"""ServerConfig: the HTTP side of `pagoda serve`, validated once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.runtime import options
from pagoda.runtime.lora_config import LoRAConfig
from pagoda.runtime.option_rules import check_int, check_seconds


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP side of `pagoda serve` (defaults from `options`, shared with the operator)."""

    model: str = options.DEFAULT_MODEL
    served_model_names: tuple[str, ...] = ()  # empty: the --model string
    host: str = options.DEFAULT_HOST
    port: int = options.DEFAULT_PORT
    api_key: str | None = None
    max_queue_len: int = options.DEFAULT_MAX_QUEUE_LEN
    max_seqs_per_request: int = options.DEFAULT_MAX_SEQS_PER_REQUEST
    max_request_bytes: int = options.DEFAULT_MAX_REQUEST_BYTES
    max_connections: int = options.DEFAULT_MAX_CONNECTIONS
    header_timeout: float = options.DEFAULT_HEADER_TIMEOUT_S
    body_timeout: float = options.DEFAULT_BODY_TIMEOUT_S
    send_timeout: float = options.DEFAULT_SEND_TIMEOUT_S
    drain_timeout: float = options.DEFAULT_DRAIN_TIMEOUT_S
    enable_debug_endpoints: bool = False
    log_level: str = options.DEFAULT_LOG_LEVEL
    engine_process: bool = options.DEFAULT_ENGINE_PROCESS
    tool_call_parser: str = options.DEFAULT_TOOL_CALL_PARSER
    reasoning_parser: str | None = None  # None: the thinking stays in `content`
    allow_chat_special_tokens: bool = False  # content's special-token text: control tokens
    grammar_compile_timeout: float = options.DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S
    grammar_cache_bytes: int = options.parse_size(options.DEFAULT_GRAMMAR_CACHE_SIZE)
    # --enable-lora and its flags (the engine's too): the adapters `model` may name
    lora: LoRAConfig | None = None

    def __post_init__(self) -> None:
        if not self.served_model_names:
            object.__setattr__(self, "served_model_names", (self.model,))
        if any(not isinstance(n, str) or not n for n in self.served_model_names):
            raise ValueError("served_model_name entries must be non-empty strings")
        check_int("port", self.port, 0, 65535)
        if not self.host:
            raise ValueError("host must not be empty")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty when set")
        check_int("max_queue_len", self.max_queue_len, 1, 1 << 24)
        check_int("max_seqs_per_request", self.max_seqs_per_request, 1, 1 << 24)
        check_int(
            "max_request_bytes", self.max_request_bytes, 1024, options.MAX_REQUEST_BYTES_LIMIT
        )
        check_int("max_connections", self.max_connections, 1, options.MAX_CONNECTIONS_LIMIT)
        check_seconds("header_timeout", self.header_timeout, 0.01)
        check_seconds("body_timeout", self.body_timeout, 0.01)
        check_seconds("send_timeout", self.send_timeout, 0.01)
        check_seconds("drain_timeout", self.drain_timeout)
        if self.log_level not in options.LOG_LEVELS:
            raise ValueError(f"log_level must be a logging level name, got {self.log_level!r}")
        if self.tool_call_parser not in options.TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(options.TOOL_CALL_PARSERS)}"
            )
        if (
            self.reasoning_parser is not None
            and self.reasoning_parser not in options.REASONING_PARSERS
        ):
            raise ValueError(
                f"reasoning_parser must be one of {', '.join(options.REASONING_PARSERS)}"
            )
        if self.tool_call_parser == "openai" and self.reasoning_parser != "openai_gptoss":
            raise ValueError(
                "tool_call_parser openai (gpt-oss's harmony calls) needs reasoning_parser "
                "openai_gptoss, which reads the channels"
            )
        if not self.grammar_compile_timeout > 0:
            raise ValueError(
                f"grammar_compile_timeout must be > 0, got {self.grammar_compile_timeout!r}"
            )
        if self.grammar_cache_bytes < 0:
            raise ValueError(f"grammar_cache_size must be >= 0, got {self.grammar_cache_bytes!r}")

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]
