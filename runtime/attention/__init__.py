"""Attention backends: one interface, a vectorized PyTorch backend (CPU) and a Triton backend (CUDA)."""

from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata, get_attention_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
