"""Attention backends: one interface, a vectorized PyTorch backend (CPU) and a Triton backend (CUDA).

The factory lives here, above both backends, so that `base.py` imports neither of them.
"""

from __future__ import annotations

import torch
from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata


def get_attention_backend(
    name: str,
    device: torch.device,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    batch_invariant: bool = False,
    kv_cache_dtype: str = "auto",
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: bool = False,
    latent: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    rel_logits: bool = False,
    image_spans: bool = False,
) -> AttentionBackend:
    """Resolve ``auto|torch|triton``: auto picks Triton on CUDA and the torch backend elsewhere.
    ``batch_invariant`` selects the Triton kernels' invariant mode (the torch backend always is).
    An int8 KV cache (``kv_cache_dtype="int8"``) is stored and read by the torch backend only,
    an FP8 one (``"fp8"``, E4M3 with per-layer scales) by the Triton backend only.
    ``sliding_window``, ``softcap``, ``sinks`` and ``latent`` (multi-head latent attention's
    one-row cache) and ``alibi_slopes`` (ALiBi: BLOOM, MPT; the kernels' ``HAS_ALIBI`` path,
    the CPU kernel's and the torch path's bias) as ``AttentionBackend`` takes them.
    ``rel_logits`` (Inkling's relative-position logits) only the torch backend adds: auto
    picks it on CUDA too, and triton is refused in one line. ``image_spans`` (a model's
    bidirectional image tokens: `base.IMAGE_SPANS`) both take: Triton's prefill kernel
    (its ``HAS_SPANS`` variant), and the torch backend's masked path (not its CPU kernel)."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention_backend must be auto, torch or triton, got {name!r}")
    if name == "auto":
        name = "triton" if device.type == "cuda" and not rel_logits else "torch"
    if kv_cache_dtype == "int8" and (name == "triton" or device.type != "cpu"):
        raise ValueError(
            "kv_cache_dtype 'int8' is a CPU feature (the torch attention backend on a CPU "
            f"device); got attention backend {name!r} on {device.type}: use kv_cache_dtype 'auto'"
        )
    if kv_cache_dtype == "fp8" and name != "triton":
        raise ValueError(
            "kv_cache_dtype 'fp8' is read by the Triton attention backend only (CUDA GPUs with "
            "FP8); use attention backend auto or triton"
        )
    if rel_logits and name == "triton":
        raise ValueError("the Triton attention backend cannot add relative-position logits "
                         "(Inkling's): use attention backend auto or torch")  # fmt: skip
    if name == "triton":
        from pagoda.runtime.attention.triton_backend import TritonAttentionBackend

        backend = TritonAttentionBackend(
            num_heads, num_kv_heads, head_dim, scale, batch_invariant,
            sliding_window=sliding_window, softcap=softcap, kv_cache_dtype=kv_cache_dtype,
            sinks=sinks, latent=latent, alibi_slopes=alibi_slopes,
        )  # fmt: skip
    else:
        from pagoda.runtime.attention.torch_backend import TorchAttentionBackend

        backend = TorchAttentionBackend(
            num_heads, num_kv_heads, head_dim, scale, kv_cache_dtype,
            sliding_window=sliding_window, softcap=softcap, sinks=sinks, latent=latent,
            alibi_slopes=alibi_slopes, rel_logits=rel_logits,
        )  # fmt: skip
    backend.image_spans = image_spans
    return backend


__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
