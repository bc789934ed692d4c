"""Llama-family decoder over a flattened, ragged batch of tokens (no padding).

Weights are packed at load time: q/k/v into one matrix and gate/up into one, so a layer is four
matmuls. Logits are computed only for the rows the caller asks for (the last token of each
sequence that samples), which saves the vocabulary projection on every prefill token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.cpu.quantized import QuantizedWeight, stack
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.ops import Ops, build_cos_sin_cache, gather_cos_sin

if TYPE_CHECKING:
    from pagoda.runtime.sampling.sampler import HeadSampling


EMBED = "model.embed_tokens.weight"


def _lookup_table(
    embed: torch.Tensor, blocks: list[QuantizedWeight] | None, head: Linear, tied: bool
) -> torch.Tensor | qgemm.QGemmWeight:
    """What token embeddings are read from: where `qgemm` holds the table's GGUF blocks (float32
    on an AVX2 CPU), those blocks, the LM head's own when tied, so that no float32 copy stays
    (113 MB for the embedded model); else the float32 / bf16 table itself."""
    if tied and head.fuses_sampling:
        return head.fast
    shape = None if blocks is None or len(blocks) != 1 else (blocks[0].rows, blocks[0].cols)
    whole = shape == tuple(embed.shape)
    kernel = qgemm.load() if whole and qgemm.wanted() else None
    return embed if kernel is None else kernel.bind(blocks, None)


class _DeviceWeights:
    """Checkpoint tensors moved to the device one at a time, as the layers are built, so the
    peak is the model plus one layer's temporaries rather than two copies of every weight."""

    def __init__(
        self,
        weights: Mapping[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        quantized: Mapping[str, QuantizedWeight],
    ) -> None:
        self._w, self._device, self._dtype = weights, device, dtype
        # stored blocks serve only float32 on the CPU: there `qgemm` computes the same weights
        on_cpu_f32 = device.type == "cpu" and dtype == torch.float32
        self._q = quantized if on_cpu_f32 else {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        return self._w[name].to(device=self._device, dtype=self._dtype)

    def cat(self, names: list[str]) -> torch.Tensor:
        return torch.cat([self[n] for n in names])

    def quantized(self, names: list[str]) -> list[QuantizedWeight] | None:
        """The rows of `names` as stored blocks, if all of them have some (see `quantized`)."""
        return stack([self._q.get(n) for n in names])


class LlamaLayer:
    __slots__ = ("attn_norm", "down", "gate_up", "mlp_norm", "o_proj", "qkv")

    def __init__(
        self, w: _DeviceWeights, prefix: str, bias: bool, linear: Callable[..., Linear]
    ) -> None:
        a = prefix + "self_attn."
        self.attn_norm = w[prefix + "input_layernorm.weight"]
        self.mlp_norm = w[prefix + "post_attention_layernorm.weight"]
        qkv = [f"{a}{n}.weight" for n in ("q_proj", "k_proj", "v_proj")]
        bias_t = torch.cat([w[n[: -len("weight")] + "bias"] for n in qkv]) if bias else None
        self.qkv = linear(w.cat(qkv), bias_t, quantized=w.quantized(qkv))
        self.o_proj = linear(w[a + "o_proj.weight"], quantized=w.quantized([a + "o_proj.weight"]))
        m = prefix + "mlp."
        gate_up = [m + "gate_proj.weight", m + "up_proj.weight"]
        self.gate_up = linear(w.cat(gate_up), quantized=w.quantized(gate_up))
        self.down = linear(
            w[m + "down_proj.weight"], quantized=w.quantized([m + "down_proj.weight"])
        )


class LlamaModel:
    """Inference-only forward; every tensor lives on one device in one dtype."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        quantized: Mapping[str, QuantizedWeight] | None = None,
        dtype: torch.dtype,
        device: torch.device,
        backend: AttentionBackend,
        ops: Ops,
        max_positions: int,
        batch_invariant: bool = False,
    ) -> None:
        self.config = config
        self.dtype, self.device = dtype, device
        self.backend, self.ops = backend, ops
        w = _DeviceWeights(weights, device, dtype, quantized or {})
        linear = functools.partial(Linear, invariant=batch_invariant)
        embed = w[EMBED]
        self.norm = w["model.norm.weight"]
        head = EMBED if config.tie_word_embeddings else "lm_head.weight"
        head_weight = embed if config.tie_word_embeddings else w[head]
        self.lm_head = linear(head_weight, quantized=w.quantized([head]))
        self.vocab_size = head_weight.shape[0]  # the logits' width
        self.embed = _lookup_table(embed, w.quantized([EMBED]), self.lm_head, head == EMBED)
        self.layers = [
            LlamaLayer(w, f"model.layers.{i}.", config.attention_bias, linear)
            for i in range(config.num_layers)
        ]
        self.cos_sin_cache = build_cos_sin_cache(
            config.head_dim, config.rope_theta, config.rope_scaling, max_positions
        ).to(device)
        c = config
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

    def linears(self) -> list[Linear]:
        """Every linear layer: four per decoder layer, then the LM head."""
        names = ("qkv", "o_proj", "gate_up", "down")
        return [getattr(layer, n) for layer in self.layers for n in names] + [self.lm_head]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # int64 [T]
        positions: torch.Tensor,  # int64 [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # int64 [N] rows of the batch to project to the vocabulary
        head: HeadSampling | None = None,
    ) -> torch.Tensor:
        """The logits [N, vocab] of the rows `logits_indices`; with `head`, their tokens (int64
        [N]) drawn inside the LM head, which must fuse sampling (`Linear.fuses_sampling`)."""
        c, ops = self.config, self.ops
        e = self.embed
        h = e.rows(input_ids) if isinstance(e, qgemm.QGemmWeight) else F.embedding(input_ids, e)
        residual = None
        T = h.shape[0]
        rope_pos, rope_cache = positions, self.cos_sin_cache
        if ops.pregather_rotary:
            rope_pos, rope_cache = None, gather_cos_sin(positions, self.cos_sin_cache, h.dtype)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if residual is None:
                residual = h
                x = ops.rms_norm(x=h, weight=layer.attn_norm, eps=c.rms_norm_eps)
            else:
                x, residual = ops.rms_norm(
                    x=h, weight=layer.attn_norm, eps=c.rms_norm_eps, residual=residual
                )
            qkv = layer.qkv(x)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.reshape(T, c.num_heads, c.head_dim)
            k = k.reshape(T, c.num_kv_heads, c.head_dim)
            v = v.reshape(T, c.num_kv_heads, c.head_dim)
            q, k = ops.rotary_embedding(positions=rope_pos, q=q, k=k, cos_sin_cache=rope_cache)
            attn = self.backend.forward(q, k, v, k_cache, v_cache, meta)
            h = layer.o_proj(attn.reshape(T, self.q_size))
            x, residual = ops.rms_norm(
                x=h, weight=layer.mlp_norm, eps=c.rms_norm_eps, residual=residual
            )
            h = layer.down(ops.silu_and_mul(x=layer.gate_up(x)))
        h = h.index_select(0, logits_indices)
        residual = residual.index_select(0, logits_indices)
        x, _ = ops.rms_norm(x=h, weight=self.norm, eps=c.rms_norm_eps, residual=residual)
        if head is not None:
            return self.lm_head.sample(x, head.scale, head.u)
        return self.lm_head(x)  # model dtype: the sampler widens only when it must
