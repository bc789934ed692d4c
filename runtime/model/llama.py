"""Llama-family decoder over a flattened, ragged batch of tokens (no padding).

Weights are packed at load time: q/k/v into one matrix and gate/up into one, so a layer is four
matmuls. Logits are computed only for the rows the caller asks for (the last token of each
sequence that samples), which saves the vocabulary projection on every prefill token.

The other families subclass the two classes here and change only what differs (named in
`ModelConfig.family`): `qwen3` adds per-head q/k norms, `gemma3` its norms, GeGLU and scales,
`moe` swaps the MLP for a mixture of experts (`make_mlp`). Llama, Mistral (with its sliding window) and
Qwen2 are this file as it stands.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.cpu.quantized import QuantizedWeight, stack
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.ops import (
    Ops,
    build_cos_sin_cache,
    check_rope_context,
    gather_cos_sin,
)
from pagoda.runtime.model.parallel_linear import (
    column_linear,
    qkv_linear,
    row_linear,
    vocab_parallel,
)

if TYPE_CHECKING:
    from pagoda.runtime.model.fp8_linear import Fp8Linear
    from pagoda.runtime.quantization.fp8 import Fp8LinearWeights, Fp8Scheme
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


class DeviceWeights:
    """Checkpoint tensors moved to the device one at a time, as the layers are built, so the
    peak is the model plus one layer's temporaries rather than two copies of every weight."""

    def __init__(
        self,
        weights: Mapping[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        quantized: Mapping[str, QuantizedWeight],
        fp8: Fp8Scheme | None = None,
    ) -> None:
        self._w, self.device, self.dtype = weights, device, dtype
        # stored blocks serve only float32 on the CPU: there `qgemm` computes the same weights
        on_cpu_f32 = device.type == "cpu" and dtype == torch.float32
        self._q = quantized if on_cpu_f32 else {}
        self.fp8 = fp8  # the linear layers it names run in the FP8 GEMM (`fp8_weights`)

    @property
    def stored(self) -> Mapping[str, torch.Tensor]:
        """The checkpoint's tensors as stored (dtype, device), e.g. its FP8 scales."""
        return self._w

    def __contains__(self, name: str) -> bool:
        return name in self._w

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        read = getattr(self._w, "read", None)  # a GGUF's: its blocks dequantized on the device
        if read is not None:
            return read(name, self.device, self.dtype)
        t = self._w[name]
        if t.dtype == torch.float8_e4m3fn:  # an FP8 checkpoint's weight read as dense values
            return self._dequantized(name, t)
        return t.to(device=self.device, dtype=self.dtype)

    def source(self, name: str) -> torch.Tensor:
        """Matrix `name` as ``--quantization fp8`` quantizes it: as stored (on the device), or
        in float32 where the checkpoint stores it in FP8 with scales the GEMM cannot take
        (block-wise), so that it is requantized one scale per output channel."""
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        t = self._w[name]
        if t.dtype == torch.float8_e4m3fn:
            return self._dequantized(name, t, torch.float32)
        return t.to(self.device)

    def _dequantized(self, name: str, t: torch.Tensor, dtype: torch.dtype | None = None):
        """``weight · weight_scale`` (per tensor, per output channel, or per tile of a block-wise
        checkpoint, whose scales may be named ``weight_scale_inv``) in the model's dtype: how an
        FP8 checkpoint runs where its layers do not run in FP8 (a CPU, an older GPU, block-wise
        scales anywhere)."""
        from pagoda.kernels.fp8 import dequantize
        from pagoda.runtime.quantization.fp8 import dequantize_blocks

        base = name.removesuffix("weight")
        scale_name = next((base + s for s in ("weight_scale", "weight_scale_inv")
                           if base + s in self._w), base + "weight_scale")  # fmt: skip
        if not name.endswith(".weight") or scale_name not in self._w or t.dim() != 2:
            raise ValueError(f"checkpoint tensor {name} is float8_e4m3fn without a per-tensor "
                             f"or per-channel {scale_name}")  # fmt: skip
        scale = self._w[scale_name]
        block = getattr(self._w, "fp8_block", None)  # the checkpoint's tile, if block-wise
        tiles = None if block is None else tuple(-(-a // b) for a, b in zip(t.shape, block))
        if tiles is not None and tuple(scale.shape) == tiles:
            return dequantize_blocks(t.to(self.device), scale, block, dtype or self.dtype)
        scale = scale.float().reshape(-1)
        if scale.numel() not in (1, t.shape[0]):
            raise ValueError(f"{scale_name} has {scale.numel()} elements; expected 1 or "
                             f"{t.shape[0]}, or block-wise scales with the checkpoint's "
                             "weight_block_size")  # fmt: skip
        scale = scale.to(self.device).reshape(-1, 1)
        return dequantize(t.to(self.device), scale, dtype or self.dtype)

    def fp8_weights(self, names: list[str]) -> Fp8LinearWeights | None:
        """The matrices `names` (stacked: q/k/v, gate/up) as one FP8 GEMM operand when the
        engine runs them in FP8: read from an FP8 checkpoint, or quantized now from the stored
        16/32-bit values (one scale per output channel); None when they stay 16-bit."""
        if not self.runs_fp8(names):
            return None
        from pagoda.runtime.quantization import fp8

        assert self.fp8 is not None
        modules = [n.removesuffix(".weight") for n in names]
        if self.fp8.serialized:
            parts = [fp8.load_linear(self._w, m, self.fp8).to(self.device) for m in modules]
            return fp8.fuse(parts)
        return fp8.quantize_linear(torch.cat([self.source(n) for n in names]))

    def runs_fp8(self, names: list[str]) -> bool:
        """Whether the matrices `names` (one fused layer) run in the FP8 GEMM: the scheme names
        them and, for an FP8 checkpoint, it stores them in FP8 (a projection it keeps 16-bit
        runs 16-bit, whether its ignore list names it or not). All of them or none: ValueError
        when only some would."""
        if self.fp8 is None:
            return False
        wanted = [
            self.fp8.quantizes(n.removesuffix(".weight"))
            and (not self.fp8.serialized or self._stored_fp8(n))
            for n in names
        ]
        if any(wanted) and not all(wanted):
            modules = ", ".join(n.removesuffix(".weight") for n in names)
            raise ValueError(f"the FP8 checkpoint quantizes some of {modules} but not all; they "
                             "run as one fused layer")  # fmt: skip
        return all(wanted)

    def _stored_fp8(self, name: str) -> bool:
        if name not in self._w:
            return False  # reported by name when it is read
        header = getattr(self._w, "dtype_and_shape", None)  # safetensors: without reading it
        if header is not None:
            return header(name)[0] == "F8_E4M3"
        return self._w[name].dtype == torch.float8_e4m3fn

    def length(self, name: str, dim: int) -> int:
        """The size of tensor `name` along `dim`."""
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        return self._w[name].shape[dim]

    def part(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows (dim 0) or columns (dim 1) [start, stop) of `name`, cut before the move to the
        device, zero-padded past its end (a vocabulary rounded up for tensor parallelism)."""
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        t = self._w[name]
        if t.dtype == torch.float8_e4m3fn:  # with its scale, as `self[name]` reads it
            t = self._dequantized(name, t)
        have = max(0, min(stop, t.shape[dim]) - start)
        piece = t.narrow(dim, start, have).to(device=self.device, dtype=self.dtype)
        if have < stop - start:
            pad = list(piece.shape)
            pad[dim] = stop - start - have
            piece = torch.cat([piece, piece.new_zeros(pad)], dim)
        return piece.contiguous()

    def cat(self, names: list[str]) -> torch.Tensor:
        return torch.cat([self[n] for n in names])

    def biases(self, weight_names: list[str]) -> torch.Tensor | None:
        """The biases of these matrices, concatenated, where the checkpoint has them (all or
        none: q/k/v of Qwen2, a Llama's with attention_bias or mlp_bias)."""
        names = [n[: -len("weight")] + "bias" for n in weight_names]
        if not any(n in self._w for n in names):
            return None
        return self.cat(names)  # a missing one is reported by name

    def quantized(self, names: list[str]) -> list[QuantizedWeight] | None:
        """The rows of `names` as stored blocks, if all of them have some (see `quantized`)."""
        return stack([self._q.get(n) for n in names])


def linear_layer(ctx: LayerContext, w: DeviceWeights, names: list[str]) -> Linear | Fp8Linear:
    """The layer multiplying by the checkpoint matrices `names` stacked (with their biases):
    the FP8 GEMM where the engine runs them in FP8 (`DeviceWeights.fp8_weights`), else
    `ctx.linear` (`linear.Linear`)."""
    bias = w.biases(names)
    fp8 = w.fp8_weights(names)
    if fp8 is not None:
        from pagoda.runtime.model.fp8_linear import Fp8Linear

        return Fp8Linear(fp8, bias, weight_only=w.fp8.activations == "none")
    weight = w[names[0]] if len(names) == 1 else w.cat(names)  # one matrix: no copy
    return ctx.linear(weight, bias, quantized=w.quantized(names))


@dataclass(frozen=True)
class LayerContext:
    """What every layer of one model shares: its ops, attention backend and shapes."""

    ops: Ops
    backend: AttentionBackend
    rms_norm: Callable[..., Any]  # `ops.rms_norm`, or Gemma's (1 + w) variant
    act_and_mul: Callable[..., Any]  # the gated MLP's activation (`ops.silu_and_mul`, GeGLU)
    linear: Callable[..., Linear]
    eps: float
    num_heads: int  # this rank's (all of them without tensor parallelism)
    num_kv_heads: int
    head_dim: int
    batch_invariant: bool = False  # the engine's --batch-invariant (the fused-MoE kernel's too)
    tp: TPGroup | None = None  # the tensor-parallel group (model/parallel_linear.py)

    @property
    def qkv_sizes(self) -> list[int]:
        kv = self.num_kv_heads * self.head_dim
        return [self.num_heads * self.head_dim, kv, kv]


@dataclass
class Step:
    """What every layer of one forward reads besides its input."""

    meta: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    # per rotary table ("global", "local"): (positions, cache), or (None, this step's rows)
    rope: dict[str, tuple[torch.Tensor | None, torch.Tensor]]


class GatedMLP:
    """down(act(gate(x)) * up(x)), gate and up in one matmul."""

    __slots__ = ("act_and_mul", "down", "gate_up")

    def __init__(
        self,
        ctx: LayerContext,
        w: DeviceWeights,
        prefix: str,
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    ) -> None:
        gate_up = [f"{prefix}{names[0]}.weight", f"{prefix}{names[1]}.weight"]
        down = f"{prefix}{names[2]}.weight"
        if ctx.tp is None:
            self.gate_up = linear_layer(ctx, w, gate_up)
            self.down = linear_layer(ctx, w, [down])
        else:  # gate/up column-parallel, down row-parallel (model/parallel_linear.py)
            self.gate_up, self.down = column_linear(ctx, w, gate_up), row_linear(ctx, w, down)
        self.act_and_mul = ctx.act_and_mul

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act_and_mul(x=self.gate_up(x)))

    def linears(self) -> list[Linear]:
        return [self.gate_up, self.down]


class LlamaLayer:
    """x + attention(norm(x)), then + mlp(norm(x)); the residual adds are fused into the norms
    (`__call__` hands back the MLP's output and the residual it is still to be added to)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c, a = model.config, prefix + "self_attn."
        self.ctx, self.index = ctx, index
        self.attn_norm = model.norm_weight(w[prefix + "input_layernorm.weight"])
        self.mlp_norm = model.norm_weight(w[prefix + "post_attention_layernorm.weight"])
        qkv = [f"{a}{n}.weight" for n in ("q_proj", "k_proj", "v_proj")]
        o = a + "o_proj.weight"
        if ctx.tp is None:
            self.qkv, self.o_proj = linear_layer(ctx, w, qkv), linear_layer(ctx, w, [o])
        else:  # this rank's heads (model/parallel_linear.py)
            self.qkv, self.o_proj = qkv_linear(ctx, w, qkv, c), row_linear(ctx, w, o)
        self.kv_scales = model.kv_scales(w, a.rstrip("."))  # an FP8 KV cache's (k, v) scales
        self.window = c.family.window(index)  # this layer's sliding window, or None
        self.rope = model.rope_table(index)
        self.mlp = model.make_mlp(w, prefix, index, ctx)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o_proj, *self.mlp.linears()]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        if residual is None:
            residual = h
            x = norm(x=h, weight=self.attn_norm, eps=eps)
        else:
            x, residual = norm(x=h, weight=self.attn_norm, eps=eps, residual=residual)
        h = self.attention(x, step)
        x, residual = norm(x=h, weight=self.mlp_norm, eps=eps, residual=residual)
        return self.mlp(x), residual

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        ctx = self.ctx
        t, d = x.shape[0], ctx.head_dim
        q, k, v = self.qkv(x).split(ctx.qkv_sizes, dim=-1)
        q = q.reshape(t, ctx.num_heads, d)
        k = k.reshape(t, ctx.num_kv_heads, d)
        v = v.reshape(t, ctx.num_kv_heads, d)
        q, k = self.before_rotary(q, k)
        positions, rows = step.rope[self.rope]
        q, k = ctx.ops.rotary_embedding(positions=positions, q=q, k=k, cos_sin_cache=rows)
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(
            q, k, v, k_cache, v_cache, step.meta, window=self.window, kv_scales=self.kv_scales
        )
        return self.o_proj(out.reshape(t, ctx.num_heads * d))

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a family does to q [T, H, D] and k [T, Hkv, D] before rotary: nothing here."""
        return q, k


class LlamaModel:
    """Inference-only forward; every tensor lives on one device in one dtype. With `tp`, this
    rank's part of the model (`pagoda.runtime.distributed`): its heads, MLP rows and vocabulary
    rows; the forward then runs on every rank of the group together."""

    layer_class: type[LlamaLayer] = LlamaLayer

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
        tp: TPGroup | None = None,
        fp8: Fp8Scheme | None = None,
    ) -> None:
        """``fp8``: the linear layers it names run in the FP8 GEMM (`quantization.fp8`; the
        runner passes it only where the FP8 kernels run)."""
        self.config = config
        self.dtype, self.device = dtype, device
        self.backend, self.ops = backend, ops
        self.tp = tp  # stored GGUF blocks are not split: a group multiplies float matrices
        quantized = {} if tp is not None else quantized or {}
        w = DeviceWeights(weights, device, dtype, quantized, fp8)
        self.batch_invariant = batch_invariant
        linear = functools.partial(Linear, invariant=batch_invariant)
        ctx = self.layer_context(linear)
        self.rms_norm = ctx.rms_norm
        self.norm = self.norm_weight(w["model.norm.weight"])
        tied = config.tie_word_embeddings or "lm_head.weight" not in w
        head = EMBED if tied else "lm_head.weight"
        if tp is not None:
            self.embed, self.lm_head, self.vocab_size = vocab_parallel(ctx, w, EMBED, head)
        else:
            embed = w[EMBED]
            head_weight = embed if tied else w[head]
            self.lm_head = linear(head_weight, quantized=self.head_blocks(w, head))
            self.vocab_size = head_weight.shape[0]  # the logits' width
            self.embed = _lookup_table(embed, w.quantized([EMBED]), self.lm_head, head == EMBED)
        self.rope_caches = self.build_rope_caches(max_positions)
        self.layers = [
            self.layer_class(self, w, f"model.layers.{i}.", i, ctx)
            for i in range(config.num_layers)
        ]

    # -- what subclasses change --------------------------------------------------------------
    def layer_context(self, linear: Callable[..., Linear]) -> LayerContext:
        c, tp = self.config, self.tp
        heads, kv_heads = c.num_heads, c.num_kv_heads
        if tp is not None:  # this rank's (layout.py: KV heads replicated when fewer than ranks)
            heads, kv_heads = tp.layout.local_heads(heads, kv_heads)
        return LayerContext(
            ops=self.ops, backend=self.backend, rms_norm=self.ops.rms_norm,
            act_and_mul=self.ops.silu_and_mul, linear=linear, eps=c.rms_norm_eps,
            num_heads=heads, num_kv_heads=kv_heads, head_dim=c.head_dim,
            batch_invariant=self.batch_invariant, tp=tp,
        )  # fmt: skip

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """A norm's weight as `rms_norm` takes it."""
        return weight

    def head_blocks(self, w: DeviceWeights, head: str) -> list[QuantizedWeight] | None:
        """The LM head's stored blocks, for `qgemm` (float32 CPU models)."""
        return w.quantized([head])

    def kv_scales(self, w: DeviceWeights, attn: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (k_scale, v_scale) an FP8 KV cache stores layer ``attn``'s keys and values with:
        the checkpoint's calibrated ones (`quantization.fp8.checkpoint_kv_scales`), else 1.0
        (vLLM's default: E4M3 holds |x| up to 448, and K/V rarely exceed a few dozen); None
        without an FP8 cache."""
        if self.backend.kv_cache_dtype != "fp8":
            return None
        from pagoda.runtime.quantization.fp8 import checkpoint_kv_scales

        found = checkpoint_kv_scales(w.stored, attn)
        if found is None:
            one = torch.ones(1, dtype=torch.float32, device=self.device)
            return one, one
        hkv = self.config.num_kv_heads
        if any(s.numel() not in (1, hkv) for s in found):
            raise ValueError(f"{attn}: KV scales must have 1 or {hkv} elements each, got "
                             f"{found[0].numel()} and {found[1].numel()}")  # fmt: skip
        n = max(s.numel() for s in found)  # the kernels take both per tensor or both per head
        k, v = (s.expand(n).contiguous() for s in found)
        if n > 1 and self.tp is not None:  # this rank's KV heads' scales (split or replicated)
            start, stop = self.tp.layout.kv_heads(hkv)
            k, v = k[start:stop].contiguous(), v[start:stop].contiguous()
        return k.to(self.device), v.to(self.device)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        """Layer `index`'s MLP (`moe.py`'s models put experts where the family has them)."""
        return GatedMLP(ctx, w, prefix + "mlp.")

    def rope_table(self, index: int) -> str:
        """The rotary table layer `index` reads: "local" for Gemma 3's window layers."""
        f = self.config.family
        return "local" if f.local_rope_theta and f.window(index) is not None else "global"

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        c, f = self.config, self.config.family
        check_rope_context(c.rope_scaling, c.max_position_embeddings, max_positions)
        caches = {
            "global": build_cos_sin_cache(c.head_dim, c.rope_theta, c.rope_scaling, max_positions)
        }
        if f.local_rope_theta and f.sliding_window is not None:
            caches["local"] = build_cos_sin_cache(
                c.head_dim, f.local_rope_theta, None, max_positions
            )
        return {name: cache.to(self.device) for name, cache in caches.items()}

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        e = self.embed  # a table, or an object that looks rows up (`qgemm`, vocabulary-parallel)
        return F.embedding(input_ids, e) if isinstance(e, torch.Tensor) else e.rows(input_ids)

    def logits(self, x: torch.Tensor, head: HeadSampling | None) -> torch.Tensor:
        if head is not None:
            return self.lm_head.sample(x, head.scale, head.u)
        return self.lm_head(x)  # model dtype: the sampler widens only when it must

    # -----------------------------------------------------------------------------------------
    @property
    def cos_sin_cache(self) -> torch.Tensor:
        return self.rope_caches["global"]

    def linears(self) -> list[Linear]:
        """Every linear layer, layer by layer (attention, then the MLP's), then the LM head."""
        return [x for layer in self.layers for x in layer.linears()] + [self.lm_head]

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype) -> dict:
        if not self.ops.pregather_rotary:
            return {name: (positions, cache) for name, cache in self.rope_caches.items()}
        return {
            name: (None, gather_cos_sin(positions, cache, dtype))
            for name, cache in self.rope_caches.items()
        }

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
        h = self.embed_tokens(input_ids)
        step = Step(meta, kv_caches, self._rope_rows(positions, h.dtype))
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, step)
        h = h.index_select(0, logits_indices)
        residual = residual.index_select(0, logits_indices)
        x, _ = self.rms_norm(x=h, weight=self.norm, eps=self.config.rms_norm_eps, residual=residual)
        return self.logits(x, head)
