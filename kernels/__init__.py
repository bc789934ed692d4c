"""Pagoda's Triton kernels: one keyword-only launcher each, a torch reference beside them.

Launchers (import needs Triton; the references in ``pagoda.kernels.reference`` do not):
``linear`` (batch-invariant matmul), ``paged_attention``, ``write_kv_cache``, ``rms_norm``,
``rotary_embedding``, ``silu_and_mul``, ``fused_experts`` (mixture-of-experts MLP; its reference is
``pagoda.kernels.fused_moe_reference``), ``fp8_linear`` (batch-invariant FP8 GEMM) and
``quantize_fp8`` (per-token FP8 activations); the FP8 references and math are in
``pagoda.kernels.fp8``.
They are loaded lazily so ``import pagoda.kernels.reference`` works on machines without Triton.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAUNCHERS = {
    "linear": "pagoda.kernels.matmul",
    "paged_attention": "pagoda.kernels.attention",
    "write_kv_cache": "pagoda.kernels.kv_cache",
    "rms_norm": "pagoda.kernels.norm",
    "rotary_embedding": "pagoda.kernels.rotary",
    "silu_and_mul": "pagoda.kernels.activation",
    "fused_experts": "pagoda.kernels.fused_moe",
    "fp8_linear": "pagoda.kernels.fp8_matmul",
    "quantize_fp8": "pagoda.kernels.fp8_quant",
}

__all__ = sorted(_LAUNCHERS)


def __getattr__(name: str) -> Any:
    module = _LAUNCHERS.get(name)
    if module is None:
        raise AttributeError(f"module 'pagoda.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAUNCHERS])
