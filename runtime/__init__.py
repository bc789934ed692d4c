"""Pagoda's inference runtime: paged KV cache, continuous batching, OpenAI-compatible server.

Attributes load lazily so that light users of the package (the `pagoda` CLI dispatcher, the
operator image without torch) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "pagoda.runtime.engine.llm",
    "CompletionOutput": "pagoda.runtime.engine.outputs",
    "RequestOutput": "pagoda.runtime.engine.outputs",
    "SamplingParams": "pagoda.runtime.sampling.params",
    "Logprob": "pagoda.runtime.engine.outputs",
    "TextPrompt": "pagoda.runtime.engine.llm",
    "TokensPrompt": "pagoda.runtime.engine.llm",
    "LoRARequest": "pagoda.runtime.lora_config",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pagoda.runtime' has no attribute {name!r}")
