"""Triton attention backend: the CUDA path (also runs on CPU under ``TRITON_INTERPRET=1``).

Two launches per layer and step (more with SDPA prompt rows, below): the KV-cache scatter and
``paged_attention``. Both decide everything from shapes and the metadata's host ints, so a decode
step can be captured in a CUDA graph and replayed with new tensor contents. The kernels read
``query_start_loc``/``seq_lens``/``block_tables`` directly; ``prepare`` builds one tensor only,
for a step with bidirectional image spans (`base.IMAGE_SPANS`, Gemma 3's images): the prefill
kernel's int32 ``[T, 2]`` spans (`kernels.image_spans`), copied to the device once a step,
asynchronously. Such a step's prompt rows run in the prefill kernel's ``HAS_SPANS`` variant
(never SDPA), in every layer, window layers too; a step without images runs the kernels as
before. Which kernel runs which rows:

* ``batch_invariant`` (the default): every row, decodes included, in our FlashAttention-2-style
  Triton prefill kernel with fixed configs (see ``paged_attention``), so a row's bits never
  depend on the batch;
* non-invariant (``--no-batch-invariant``): decodes in the split-KV decode kernel; the prompt
  rows through torch's ``scaled_dot_product_attention`` (its FlashAttention kernel on CUDA;
  ``sdpa_prefill``), one call per prefill sequence, for up to ``sdpa_prefill.MAX_SDPA_SEQS``
  of them; with more, or in a layer with a sliding window, chunked attention, a logit softcap,
  attention sinks or ALiBi (which SDPA's fused kernels cannot express), in the Triton prefill
  kernel. Decode-only steps, the ones CUDA
  graphs capture, take the decode kernel as before.

A latent cache (`base.py`, DeepSeek's MLA) needs no kernel of its own: the kernels take the one
tensor as both caches (one KV head, head size kv_lora_rank + qk_rope_head_dim), so each output
row is ``p @ row``, of which the first ``latent`` columns are the answer (the rest, ``p`` times
the rotary keys, is dropped). The price is the value width's padding in the kernels (576 → 1024
lanes) and 64 columns of wasted ``p @ V``; no memory.
"""

from __future__ import annotations

import torch
from pagoda.runtime.attention import sdpa_prefill
from pagoda.runtime.attention.base import IMAGE_SPANS, AttentionBackend, AttentionMetadata

SPANS = "triton_image_spans"  # `meta.aux`: the step's spans as the prefill kernel reads them


class TritonAttentionBackend(AttentionBackend):
    """Paged attention for mixed decode/prefill batches with the kernels of ``pagoda.kernels``."""

    name = "triton"

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        batch_invariant: bool = False,
        *,
        sliding_window: int | None = None,
        softcap: float | None = None,
        kv_cache_dtype: str = "auto",
        sinks: bool = False,
        latent: int | None = None,
        alibi_slopes: torch.Tensor | None = None,
    ) -> None:
        if kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"the Triton backend stores KV as auto or fp8, not {kv_cache_dtype!r}")
        super().__init__(
            num_heads, num_kv_heads, head_dim, scale, kv_cache_dtype,
            sliding_window=sliding_window, softcap=softcap, sinks=sinks, latent=latent,
            alibi_slopes=alibi_slopes,
        )  # fmt: skip
        self.batch_invariant = batch_invariant
        # Imported here so that choosing the torch backend never needs Triton installed.
        from pagoda.kernels import paged_attention, write_kv_cache

        self._paged_attention = paged_attention
        self._write_kv_cache = write_kv_cache

    def prepare(self, meta: AttentionMetadata) -> None:
        """The step's image spans on the device (`kernels.image_spans.span_table`), once for
        every layer and geometry; nothing for a step without images."""
        spans = meta.aux.get(IMAGE_SPANS)
        if spans is None or SPANS in meta.aux:
            return
        from pagoda.kernels.image_spans import span_table

        table = torch.from_numpy(span_table(*spans, meta.num_tokens))
        device = meta.query_start_loc.device
        if device.type == "cuda":  # through pinned memory, asynchronously (no sync)
            table = table.pin_memory().to(device, non_blocking=True)
        meta.aux[SPANS] = table

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
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Store k/v at ``meta.slot_mapping`` (-1 skipped; not with ``store`` false: base.py),
        then attend causally over the cache
        (over the last ``window`` keys of each query when given, or over its own ``chunk``'s:
        the kernels read only those).
        An FP8 cache is written and read with this layer's ``kv_scales``; ``sinks`` (float32
        [num_heads]) join each head's softmax denominator. A latent cache (``self.latent``):
        ``k_cache`` is ``v_cache``, ``k`` is stored (with the K scale) and read as both, and
        the output is the first ``latent`` columns of the kernels' (a view, no copy).
        Relative-position logits (``rel_bias``) the kernels cannot add: refused
        (`get_attention_backend` gives them to the torch backend)."""
        if rel_bias is not None:
            raise ValueError("the Triton attention backend cannot add relative-position logits")
        if self.latent is not None:
            scale = None if kv_scales is None else (kv_scales[0], kv_scales[0])
            out = self._attend(q, k, k, k_cache, k_cache, meta, window, scale, sinks, chunk,
                               store)  # fmt: skip
            return out[..., : self.latent]
        return self._attend(q, k, v, k_cache, v_cache, meta, window, kv_scales, sinks, chunk,
                            store)  # fmt: skip

    def _attend(
        self, q, k, v, k_cache, v_cache, meta, window, kv_scales, sinks, chunk, store=True
    ) -> torch.Tensor:
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
        if store:
            self._write_kv_cache(
                k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=meta.slot_mapping,
                k_scale=k_scale, v_scale=v_scale,
            )  # fmt: skip
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        spans = meta.aux.get(SPANS)  # (bidirectional image rows: the prefill kernel's)
        extra = sinks is not None or self.alibi_slopes is not None or spans is not None
        supported = sdpa_prefill.supports(meta, window, self.softcap, extra, chunk)
        if not self.batch_invariant and supported:
            nd = meta.num_decodes
            if nd:  # the decode rows (the first nd) in the decode kernel, as in a decode step
                n = meta.query_lens_host[:nd]
                self._paged_attention(
                    q=q[: sum(n)], k_cache=k_cache, v_cache=v_cache,
                    block_tables=meta.block_tables[:nd], seq_lens=meta.seq_lens[:nd],
                    query_start_loc=meta.query_start_loc[: nd + 1], max_query_len=1,
                    max_seq_len=max(meta.seq_lens_host[:nd]), scale=self.scale,
                    out=out[: sum(n)], num_decodes=nd, k_scale=k_scale, v_scale=v_scale,
                )  # fmt: skip
            return sdpa_prefill.sdpa_prefill(
                q, k, v, k_cache, v_cache, meta, self.scale, out, k_scale, v_scale
            )
        return self._paged_attention(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            block_tables=meta.block_tables,
            seq_lens=meta.seq_lens,
            query_start_loc=meta.query_start_loc,
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            scale=self.scale,
            out=out,
            num_decodes=meta.num_decodes,
            batch_invariant=self.batch_invariant,
            sliding_window=window,
            softcap=self.softcap,
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=sinks,
            attention_chunk=chunk,
            alibi_slopes=self.alibi_slopes,
            image_spans=spans,
        )
