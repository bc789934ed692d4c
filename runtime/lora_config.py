"""`LoRARequest` (vLLM's: which adapter a request runs with) and `LoRAConfig` (the engine's
adapter settings: ``--enable-lora``, ``--lora-modules``, ``--max-loras``, ``--max-lora-rank``,
``--max-cpu-loras``), frozen and validated once; which model families take adapters
(`check_model`). The rest of LoRA is `pagoda.runtime.lora`.

Standard library only: the configs and the server read these without torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagoda.runtime.model_config import ModelConfig

DEFAULT_MAX_LORAS = 1  # adapters resident in one batch (vLLM's default)
DEFAULT_MAX_LORA_RANK = 16  # vLLM's default
MAX_LORA_RANK_LIMIT = 512  # vLLM's largest
MAX_LORAS_LIMIT = 256


@dataclass(frozen=True)
class LoRARequest:
    """vLLM's ``LoRARequest(lora_name, lora_int_id, lora_path)``: a PEFT adapter directory and
    the id the engine keys it by (>= 1; 0 is the base model). Requests naming the same id run
    the same adapter; its weights are read from `lora_path` when it is first needed."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        i = self.lora_int_id
        if not isinstance(i, int) or isinstance(i, bool) or i < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {i!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora {self.lora_name!r}: lora_path must be a directory path")

    # vLLM's shorter names
    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


def parse_lora_module(text: str, int_id: int) -> LoRARequest:
    """One ``--lora-modules`` word: ``NAME=PATH`` or vLLM's JSON
    ``{"name": ..., "path": ..., "base_model_name": ...}``; ValueError naming what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"--lora-modules: expected NAME=PATH or JSON, got {text!r}")
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ValueError(f"--lora-modules: invalid JSON {text!r} ({e})") from None
        if not isinstance(obj, dict) or set(obj) - {"name", "path", "base_model_name"}:
            raise ValueError(f"--lora-modules: JSON keys are name, path, base_model_name; got "
                             f"{text!r}")  # fmt: skip
        if "name" not in obj or "path" not in obj:
            raise ValueError(f"--lora-modules: JSON needs name and path, got {text!r}")
        return LoRARequest(obj["name"], int_id, obj["path"], obj.get("base_model_name"))
    name, eq, path = text.partition("=")
    if not eq or not name or not path:
        raise ValueError(f"--lora-modules: expected NAME=PATH, got {text!r}")
    return LoRARequest(name, int_id, path)


@dataclass(frozen=True)
class LoRAConfig:
    """`max_loras`: distinct adapters in one batch (the device holds that many slots);
    `max_lora_rank`: the largest rank an adapter may have (the slots' width); `max_cpu_loras`:
    adapters kept read in host memory (LRU; default `max_loras`); `lora_modules`: the adapters
    served by name (`--lora-modules`, ids 1..n in order)."""

    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_cpu_loras: int | None = None
    lora_modules: tuple[LoRARequest, ...] = ()

    def __post_init__(self) -> None:
        _check_int("max_loras", self.max_loras, MAX_LORAS_LIMIT)
        _check_int("max_lora_rank", self.max_lora_rank, MAX_LORA_RANK_LIMIT)
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        _check_int("max_cpu_loras", self.max_cpu_loras, 1 << 16)
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                             f"({self.max_loras})")  # fmt: skip
        modules = tuple(
            m if isinstance(m, LoRARequest) else parse_lora_module(m, i + 1)
            for i, m in enumerate(self.lora_modules)
        )
        object.__setattr__(self, "lora_modules", modules)
        names = [m.lora_name for m in modules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"--lora-modules: adapter name(s) given twice: {', '.join(dup)}")

    @classmethod
    def from_values(
        cls,
        enable_lora: bool = False,
        lora_modules: Sequence[Any] | None = None,
        max_loras: int | None = None,
        max_lora_rank: int | None = None,
        max_cpu_loras: int | None = None,
    ) -> LoRAConfig | None:
        """The flags' values (None: left out) → a config, or None without ``--enable-lora``
        (ValueError where another LoRA flag is given without it)."""
        if not enable_lora:
            given = [f for f, v in (("--lora-modules", lora_modules), ("--max-loras", max_loras),
                                    ("--max-lora-rank", max_lora_rank),
                                    ("--max-cpu-loras", max_cpu_loras)) if v]  # fmt: skip
            if given:
                raise ValueError(f"{', '.join(given)} given without --enable-lora")
            return None
        kw = {"max_loras": max_loras, "max_lora_rank": max_lora_rank,
              "max_cpu_loras": max_cpu_loras}  # fmt: skip
        return cls(lora_modules=tuple(lora_modules or ()),
                   **{k: v for k, v in kw.items() if v is not None})  # fmt: skip


LORA_KWARGS = ("enable_lora", "lora_modules", "max_loras", "max_lora_rank", "max_cpu_loras")


def _check_int(name: str, value: Any, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
        raise ValueError(f"{name} must be an integer in 1..{high}, got {value!r}")


# model_type → what LoRA is tested with there (tests/runtime/lora: peft as the oracle)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def check_model(mc: ModelConfig) -> None:
    """ValueError, one line, for a model whose layers do not all run through the wrapped
    linears (docs/runtime.md, "LoRA adapters")."""
    if mc.architecture not in FAMILIES or mc.family.num_experts:
        raise ValueError(f"LoRA adapters are not supported for {mc.architecture!r} models "
                         f"(dense {', '.join(FAMILIES)} only): drop --enable-lora")  # fmt: skip
