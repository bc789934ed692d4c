"""The attention-backend contract shared by the model, the model runner and the kernels.

A step's batch is flattened: T query tokens from B sequences laid end to end, *decodes first*
(sequences with exactly one new token), then prefill chunks. Every sequence attends, causally by
absolute position, to all of its context: the tokens already in the paged cache plus the new ones;
in a layer with a sliding window of W keys, a query at position p sees only the keys p - W + 1 .. p
(Hugging Face's definition), and a backend reads only those keys' blocks; in a layer with chunked
attention (Llama 4's rotary layers) of C keys, a query at position p sees only the keys of its own
chunk, p - p % C .. p, likewise read from that chunk's first block on. A layer with attention
sinks (gpt-oss) passes one learned logit per head that joins each softmax's denominator and
nothing else: ``p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink))``, as if a key no value reads.
A model with ALiBi (BLOOM, MPT) builds its backend with one slope per head: each score gets
``slope_h * (key_pos - query_pos)`` added (after the scale and any soft cap, before the mask).
A model with relative-position logits (Inkling) builds it with ``rel_logits`` and passes each
layer's ``rel_bias`` [T, num_heads, E]: query token i's score for a key at backward distance
``d = query_pos - key_pos`` gets ``rel_bias[i, h, d]`` added where ``d < E`` (nothing beyond),
after the scale, before the mask (the torch backend only: Triton's kernels take no such bias).

A model whose image tokens attend to each other both ways (Gemma 3) puts the step's image rows
in ``meta.aux[IMAGE_SPANS]`` before ``prepare``: a query row of an image also sees the keys of
its image's later positions (each image whole in its prefill chunk: the scheduler's rule), in
every layer, window layers too (transformers' ``token_type_ids`` mask); a backend built with
``get_attention_backend(image_spans=True)`` takes them: the torch backend's masked path, the
Triton backend's prefill kernel (`kernels.image_spans`).

KV cache layout, per layer: ``k_cache`` and ``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` (a backend may choose another layout and
element type through ``allocate_kv_cache``, as the CPU backend does); token ``t`` of a sequence lives in block
``block_tables[seq, t // block_size]`` at offset ``t % block_size``; ``slot_mapping[i]`` is
``block * block_size + offset`` for new token ``i`` (``-1``: do not write, e.g. padding).
Layers may differ in ``num_kv_heads`` and ``head_dim`` (Gemma 4's full-attention layers): each
shape has its backend (``with_geometry``) and its layers' caches; a block id names the same
positions in every layer's cache, so the pages are counted per block over all layers. A layer
that reads another layer's cache (Gemma 4's KV-shared layers) has none of its own: it passes
that layer's k/v of the step and ``store=False``.

**Latent cache** (``latent``, multi-head latent attention: DeepSeek-V2/V3): one KV head whose
row of ``head_dim`` values per token serves as both key and value, the value being its first
``latent`` columns (DeepSeek's normed latent; the rest is the shared rotary key). There is one
tensor per layer: ``allocate_kv_cache`` returns it twice (``k_cache is v_cache``), ``forward``
stores ``k`` only (``v`` is ignored) and returns ``[T, num_heads, latent]``. Scores are
``q . row`` over all ``head_dim`` columns, the output ``softmax @ row[:, :latent]``.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from pagoda.runtime.cpu.host_memory import zeros

# `meta.aux`: host NumPy int64 (rows [R], first [R], last [R]): the step's rows that are an
# image's tokens, and the first and last prompt position of that image
IMAGE_SPANS = "image_spans"


@dataclass
class AttentionMetadata:
    """Per-step batch description. Host ints come from the scheduler, so reading them never syncs."""

    num_seqs: int  # B
    num_decodes: int  # the first `num_decodes` sequences have query length 1
    num_tokens: int  # T = total new tokens in the step
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32 [B + 1], prefix sums of query lengths
    seq_lens: torch.Tensor  # int32 [B], context length including the new tokens
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq], unused entries are 0
    slot_mapping: torch.Tensor  # int64 [T]
    block_size: int = 16
    # int32 [B] each request's prompt length (longrope picks its table by it: `model/longrope.py`);
    # None (CUDA-graph decodes) reads as `seq_lens`, which decodes never fall below
    prompt_lens: torch.Tensor | None = None
    # Host copies (lists) of per-sequence lengths; backends may use them for planning only.
    query_lens_host: list[int] = field(default_factory=list)
    seq_lens_host: list[int] = field(default_factory=list)
    # Backend-private, per-step tensors (masks, gather indices, split plans) built by `prepare`.
    aux: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_host(
        cls,
        qlens,
        seq_lens,
        num_decodes: int,
        slots,
        block_size: int,
        to_device,
        cu: torch.Tensor,
        table: torch.Tensor,
    ) -> AttentionMetadata:
        """An eager step's metadata from its host arrays (NumPy: `qlens`, `seq_lens` [B],
        `slots` [T] int64), `to_device` moving them, and the query starts (int32 [B + 1]) and
        block tables already on the device (the model runner's steps and a draft model's)."""
        return cls(
            num_seqs=len(qlens),
            num_decodes=num_decodes,
            num_tokens=len(slots),
            max_query_len=int(qlens.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=cu,
            seq_lens=to_device(seq_lens.astype("int32")),
            block_tables=table,
            slot_mapping=to_device(slots),
            block_size=block_size,
            query_lens_host=qlens.tolist(),
            seq_lens_host=seq_lens.tolist(),
        )


class AttentionBackend(ABC):
    """Writes the step's new K/V into the paged cache, then attends over it."""

    name: str = "base"
    # the model's prefills may hold bidirectional image spans (`IMAGE_SPANS`; set by
    # `get_attention_backend`: the torch backend then takes its masked path, not its kernel)
    image_spans: bool = False

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        kv_cache_dtype: str = "auto",
        *,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        latent: int | None = None,
        alibi_slopes: torch.Tensor | None = None,
        rel_logits: bool = False,
    ) -> None:
        """``sliding_window``: the window of the model's window layers (None: it has none);
        ``softcap``: scores become softcap * tanh(scores / softcap) before the softmax (Gemma);
        ``sinks``: the model's layers pass attention sinks to ``forward`` (gpt-oss);
        ``latent``: a latent cache whose values are each row's first ``latent`` columns
        (module docstring; None: separate K and V); ``alibi_slopes``: float32 ``[num_heads]``
        on the model's device, each head's scores plus ``slope * (key_pos - query_pos)``
        before the softmax (ALiBi: BLOOM, MPT; None: no bias); ``rel_logits``: the model's
        layers pass relative-position logits to ``forward`` (Inkling: module docstring)."""
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.kv_cache_dtype = kv_cache_dtype  # "auto" (the model's dtype), "int8" or "fp8"
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.sinks = sinks
        if latent is not None and not (num_kv_heads == 1 and 0 < latent <= head_dim):
            raise ValueError(f"a latent cache has one KV head and values within its {head_dim} "
                             f"columns; got {num_kv_heads} KV heads, latent {latent}")  # fmt: skip
        self.latent = latent
        if alibi_slopes is not None and tuple(alibi_slopes.shape) != (num_heads,):
            raise ValueError(f"ALiBi needs one slope per head ({num_heads}), got "
                             f"{list(alibi_slopes.shape)}")  # fmt: skip
        self.alibi_slopes = alibi_slopes
        self.rel_logits = rel_logits

    @property
    def kv_tensors(self) -> int:
        """Cache tensors per layer: 2 (K and V), or 1 (a latent cache: its rows are both)."""
        return 1 if self.latent is not None else 2

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """Element type of the KV cache (the model's by default)."""
        if self.kv_cache_dtype == "fp8":
            return torch.float8_e4m3fn
        return torch.int8 if self.kv_cache_dtype == "int8" else model_dtype

    def bytes_per_token(self, model_dtype: torch.dtype) -> int:
        """Cache bytes one token takes in one layer (K and V, or a latent row); int8 adds a
        float32 scale per token and KV head to its ``head_dim`` bytes."""
        n = self.kv_tensors * self.num_kv_heads
        if self.kv_cache_dtype == "int8":
            return n * (self.head_dim + 4)
        return n * self.head_dim * self.cache_dtype(model_dtype).itemsize

    def block_bytes(self, model_dtype: torch.dtype, block_size: int) -> int:
        """Cache bytes one block takes in one layer."""
        return block_size * self.bytes_per_token(model_dtype)

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, model_dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's (k_cache, v_cache), laid out as the module docstring says (a latent
        cache: one tensor, twice)."""
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        dt = self.cache_dtype(model_dtype)
        k_cache = zeros(shape, dt, device)
        return (
            (k_cache, k_cache) if self.latent is not None else (k_cache, zeros(shape, dt, device))
        )

    def with_geometry(
        self, num_kv_heads: int, head_dim: int, num_heads: int | None = None
    ) -> AttentionBackend:
        """This backend for layers of another shape (Gemma 4's full-attention layers: their
        own head size and KV heads; DiffLlama's doubled heads), sharing everything else;
        itself where the shape is its."""
        heads = self.num_heads if num_heads is None else num_heads
        if (num_kv_heads, head_dim, heads) == (self.num_kv_heads, self.head_dim, self.num_heads):
            return self
        if heads % num_kv_heads:
            raise ValueError(f"num_heads={heads} is not a multiple of "
                             f"num_kv_heads={num_kv_heads}")  # fmt: skip
        other = copy.copy(self)
        other.num_kv_heads, other.head_dim, other.num_heads = num_kv_heads, head_dim, heads
        return other

    def write_kv(self, k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[T, Hkv, D]`` at ``slots`` (every one a real slot) in this
        layout, 16/32-bit caches (a sparse attention's own store: Kolibri 1.1's)."""
        nb, bs = k_cache.shape[:2]
        for x, cache in ((k, k_cache), (v, v_cache)):
            cache.view(nb * bs, *cache.shape[2:]).index_copy_(0, slots, x.to(cache.dtype))

    def read_kv(self, k_cache, v_cache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached k and v ``[*slots.shape, Hkv, D]`` at ``slots``, 16/32-bit caches (a
        sparse attention's gather: Kolibri 1.1's)."""
        nb, bs = k_cache.shape[:2]
        return tuple(c.view(nb * bs, *c.shape[2:])[slots] for c in (k_cache, v_cache))

    def prepare(self, meta: AttentionMetadata) -> None:  # noqa: B027 - optional hook
        """Build per-step tensors once (not once per layer); store them in ``meta.aux``."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None = None,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
        sinks: torch.Tensor | None = None,
        chunk: int | None = None,
        store: bool = True,
        rel_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim] (a latent cache: [T, num_heads, latent])
        """Store k/v at ``meta.slot_mapping`` (not with ``store`` false: a layer reading another
        layer's cache, whose k/v of this step these are, already stored: Gemma 4's KV-shared
        layers), then return attention output for every query token;
        ``window``: this layer's sliding window (the backend's ``sliding_window``), or None;
        ``kv_scales``: this layer's (k_scale, v_scale), float32, with an FP8 cache only;
        ``sinks``: this layer's attention sinks, float32 ``[num_heads]`` (or ``[T, num_heads]``, one
        per query token: Inkling 2's, the torch backend's only); ``chunk``: this
        layer's attention chunk, or None (module docstring); ``rel_bias``: this layer's
        relative-position logits [T, num_heads, E] (a backend built with ``rel_logits``)."""
