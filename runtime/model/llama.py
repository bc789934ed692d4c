"""Llama-family decoder over a flattened, ragged batch of tokens (no padding).

Weights are packed at load time: q/k/v into one matrix and gate/up into one, so a layer is four
matmuls. Logits are computed only for the rows the caller asks for (the last token of each
sequence that samples), which saves the vocabulary projection on every prefill token.

The other families subclass the two classes here and change only what differs (named in
`ModelConfig.family`): `qwen3` adds per-head q/k norms, `gemma2` Gemma's norms, GeGLU, scales
and soft caps (`gemma3`: with Qwen3's q/k norms), `moe` swaps the MLP for a mixture of experts
(`make_mlp`). Llama, Mistral (with its sliding window), Qwen2 and Phi-3 (its fused matrices
split at load, `phi3.py`) are this file as it stands; a partial rotary turns the first dims of
each head only, and longrope reads one of two rotary tables per sequence (`longrope.py`).
SmolLM3 is too, some of its layers without rotary (`FamilyConfig.rope_layers`), and GLM, its
rotary in the interleaved layout (`ops.rotary_interleaved`); GLM-4 (`glm4.py`), OLMo 3
(`olmo2.py`) and Cohere (`cohere.py`) change the layer. Mistral 3's text model, Ministral and
Seed-OSS are this file too; Ministral 3 (`ministral3.py`), EXAONE 4 (`exaone4.py`), ERNIE 4.5
(`ernie4_5.py`), StarCoder2 (`starcoder2.py`), Apertus (`apertus.py`) and Arcee (an ungated MLP,
`ungated_mlp.py`) change it; so do Nemotron and Jais 2 (`nemotron.py`), Phi (`phi.py`), OLMo
(`olmo.py`), MiniCPM3 (`minicpm3.py`), Falcon and GPT-NeoX (`falcon.py`), StableLM
(`stablelm.py`), Helium (`helium.py`), HyperCLOVA X (`granite.py`), Hunyuan (`hunyuan.py`: q/k
norms in `after_rotary`), Gemma v1 and VaultGemma (`gemma2.py`), while EXAONE 3, InternLM3 and
CWM are this file (EXAONE's tensors renamed at read).
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
from pagoda.runtime.cpu.quantized import QuantizedWeight
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.model import longrope
from pagoda.runtime.model.classifier_head import decoder_head
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.ops import (
    Ops,
    build_cos_sin_cache,
    check_rope_context,
    gather_cos_sin,
    gelu_and_mul,
    gelu_tanh_and_mul,
    relu2_and_mul,
    rotary_interleaved,
)
from pagoda.runtime.model.parallel_linear import (
    column_linear,
    qkv_linear,
    row_linear,
    vocab_parallel,
)

if TYPE_CHECKING:
    from pagoda.runtime.model.fp8_linear import Fp8Linear
    from pagoda.runtime.quantization.fp8 import Fp8Scheme
    from pagoda.runtime.sampling.sampler import HeadSampling


EMBED = "model.embed_tokens.weight"
# `meta.aux`: int64 [B, n] each sequence's n tokens before the step's first (-1: before the
# sequence), for a model whose `token_history` is n (Qwen4-Exp's n-grams: model/qwen4_exp.py)
TOKEN_HISTORY = "token_history"
# `meta.aux`: a model's per-sequence state for the step (`LlamaModel.sequence_state`'s
# `device_step`: DeepSeek-V4's open-window slots, model/dsv4_engine.py)
SEQUENCE_STATE = "sequence_state"
# `LlamaModel.forward`'s `head` for the pooling runner (`engine/pooling.py`): the rows'
# final-norm hidden states come back, the LM head is not run
HIDDEN_STATES = "hidden_states"
# `meta.aux`: (rows int64 [R], features [R, hidden]) the step's image placeholder rows and
# the images' features that replace their token embeddings (`worker/mm_encoder.py`)
IMAGE_EMBEDS = "image_embeds"


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
    shortcut: torch.Tensor | None = None  # LongCat-Flash's MoE output between two sublayers


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

    sinks: torch.Tensor | None = None  # attention sinks, float32 [heads] (gpt_oss.py)

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c, a = model.config, prefix + "self_attn."
        self.ctx, self.index = ctx, index
        pre = prefix + "input_layernorm.weight"  # none in OLMo 2 (olmo2.py: norms after)
        self.attn_norm = model.read_norm(w, pre) if pre in w else None
        post = prefix + "post_attention_layernorm.weight"  # none in Cohere's (one norm a layer)
        self.mlp_norm = model.read_norm(w, post) if post in w else None
        qkv = [f"{a}{n}.weight" for n in self.projections(model, index)]
        o = a + "o_proj.weight"
        if ctx.tp is None:
            self.qkv, self.o_proj = linear_layer(ctx, w, qkv), linear_layer(ctx, w, [o])
        else:  # this rank's heads (model/parallel_linear.py)
            self.qkv, self.o_proj = self.split_qkv(model, w, qkv), row_linear(ctx, w, o)
        self.kv_scales = model.kv_scales(w, a.rstrip("."))  # an FP8 KV cache's (k, v) scales
        self.window = c.family.window(index)  # this layer's sliding window, or None
        self.chunk = c.family.chunk(index)  # this layer's attention chunk (Llama 4), or None
        self.rope = model.rope_table(index)
        # halves (the ops' kernels), or pairs (GLM's and Cohere's interleaved layout)
        self.rotary = rotary_interleaved if c.family.rope_interleaved else ctx.ops.rotary_embedding
        self.mlp = model.make_mlp(w, prefix, index, ctx)

    def projections(self, model: LlamaModel, index: int) -> tuple[str, ...]:
        """The projections `qkv` stacks, in order (Kolibri 1.1's KV-shared layers: q alone)."""
        return ("q_proj", "k_proj", "v_proj")

    def split_qkv(self, model: LlamaModel, w: DeviceWeights, names: list[str]) -> Linear:
        """q/k/v stacked on a tensor-parallel rank: its query heads and KV heads (a family
        whose layers have their own shapes takes its rows: MiMo-V2-Flash's)."""
        return qkv_linear(self.ctx, w, names, model.config)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o_proj, *self.mlp.linears()]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)
        h = self.attention(x, step)
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        return self.mlp(x), residual

    def attention_input(
        self, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention's input, the residual stream): `h`, the last layer's output, added to the
        stream (it starts the stream at the first layer) and normalised."""
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        if residual is None:
            return norm(x=h, weight=self.attn_norm, eps=eps), h
        return norm(x=h, weight=self.attn_norm, eps=eps, residual=residual)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k and v [T, KV heads, D] of the input `x` [T, hidden]."""
        ctx = self.ctx
        t, d = x.shape[0], ctx.head_dim
        q, k, v = self.qkv(x).split(ctx.qkv_sizes, dim=-1)
        return (
            q.reshape(t, ctx.num_heads, d),
            k.reshape(t, ctx.num_kv_heads, d),
            v.reshape(t, ctx.num_kv_heads, d),
        )

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        ctx = self.ctx
        t, d = x.shape[0], ctx.head_dim
        q, k, v = self.rotated_qkv(x, step)
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(
            q, k, v, k_cache, v_cache, step.meta, window=self.window, kv_scales=self.kv_scales,
            sinks=self.sinks, chunk=self.chunk,
        )  # fmt: skip
        return self.o_proj(self.attention_output(x, out.reshape(t, ctx.num_heads * d)))

    def rotated_qkv(
        self, x: torch.Tensor, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of `x` in `step` as attention reads them: `step_qkv`, then the hooks and
        the rotary at the tokens' positions (the sparse attentions' own paths use it too)."""
        q, k, v = self.step_qkv(x, step)
        q, k = self.before_rotary(q, k)
        if self.rope is not None:  # None: a layer without positions (`FamilyConfig.rope_layers`)
            positions, rows = step.rope[self.rope]
            r = rows.shape[-1]  # the rotating dims: all of them, or a partial rotary's first ones
            rotate = self.rotary
            if r == self.ctx.head_dim:
                q, k = rotate(positions=positions, q=q, k=k, cos_sin_cache=rows)
            else:  # in place on the first r dims of each head (every op rotates in place)
                rotate(positions=positions, q=q[..., :r], k=k[..., :r], cos_sin_cache=rows)
        return (*self.after_rotary(q, k), v)

    def step_qkv(
        self, x: torch.Tensor, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of `x` in `step`: `qkv_heads` (Zaya's convolve them over earlier tokens,
        read from the step's state slots)."""
        return self.qkv_heads(x)

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """What a family does to attention's output [T, H * D] (of the input `x`) before o_proj
        (AfMoE's sigmoid gate): nothing here."""
        return out

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a family does to q [T, H, D] and k [T, Hkv, D] before rotary: nothing here."""
        return q, k

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a family does to the rotated q and k (Hunyuan's q/k norms): nothing here."""
        return q, k


class LlamaModel:
    """Inference-only forward; every tensor lives on one device in one dtype. With `tp`, this
    rank's part of the model (`pagoda.runtime.distributed`): its heads, MLP rows and vocabulary
    rows; the forward then runs on every rank of the group together."""

    layer_class: type[LlamaLayer] = LlamaLayer
    # A family's RMSNorm for 16-bit models where it is not `ops.rms_norm` (which rounds the
    # normalised rows, then scales): `ops.gemma_rms_norm` scales the float32 rows, rounds once.
    # In float32 the two are one, and `ops.rms_norm` (native on the CPU) serves.
    rms_norm_16bit: Callable[..., Any] | None = None
    token_history = 0  # the tokens before each sequence's step it reads (`TOKEN_HISTORY`)

    @property
    def image_feature_width(self) -> int:
        """A vision model's image feature row (`IMAGE_EMBEDS`; the step channel's width)."""
        return self.config.hidden_size

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
        check_weights: bool = True,
    ) -> None:
        """``fp8``: the linear layers it names run in the FP8 GEMM (`quantization.fp8`; the
        runner passes it only where the FP8 kernels run). ``check_weights``: refuse NaN/Inf in
        the tensors read (`finite_check`; ``--no-check-weights`` skips it)."""
        self.config = config
        self.dtype, self.device = dtype, device
        self.backend, self.ops = backend, ops
        self.tp = tp  # stored GGUF blocks are not split: a group multiplies float matrices
        quantized = {} if tp is not None else quantized or {}
        w = DeviceWeights(weights, device, dtype, quantized, fp8, check_weights)
        self.batch_invariant = batch_invariant
        linear = functools.partial(Linear, invariant=batch_invariant)
        ctx = self.layer_context(linear)
        self.rms_norm = ctx.rms_norm
        self.norm = self.read_norm(w, "model.norm.weight")
        # as transformers loads it: tied without a head of its own; with one, only when the
        # config ties and the two tensors are equal (a distinct head is kept, as transformers 5)
        tied = "lm_head.weight" not in w or (
            config.tie_word_embeddings and w.equal(EMBED, "lm_head.weight")
        )
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
        self.read_model_tensors(w, ctx)
        if getattr(self, "classifier_head", None) is None:  # (an encoder's reads its own)
            self.classifier_head = decoder_head(w, config.family, head)
        # longrope: the tables of two halves (short, long), and the context that picks one
        original = longrope.original_context(config.rope_scaling)  # (Gemma 3's local: never)
        self.long_rope = {} if original is None else {"global": (original, max_positions)}
        self.layers = [
            self.layer_class(self, w, f"model.layers.{i}.", i, ctx)
            for i in range(config.num_layers)
        ]
        w.check_finite(tp)  # NaN/Inf in any tensor read: refused now (one sync), not served

    # -- what subclasses change --------------------------------------------------------------
    def layer_context(self, linear: Callable[..., Linear]) -> LayerContext:
        c, tp = self.config, self.tp
        heads, kv_heads = c.num_heads, c.num_kv_heads
        if tp is not None:  # this rank's (layout.py: KV heads replicated when fewer than ranks)
            heads, kv_heads = tp.layout.local_heads(heads, kv_heads)
        # the config's hidden_act: SwiGLU, or GeGLU (Gemma's, and any family's that names it),
        # or relu² (BitNet's)
        acts = {"gelu_tanh": gelu_tanh_and_mul, "gelu": gelu_and_mul, "relu2": relu2_and_mul}
        gelu = acts.get(c.family.hidden_act)
        norm = self.rms_norm_16bit if self.dtype != torch.float32 else None
        return LayerContext(
            ops=self.ops, backend=self.backend, rms_norm=norm or self.ops.rms_norm,
            act_and_mul=gelu or self.ops.silu_and_mul,
            linear=linear, eps=c.rms_norm_eps,
            num_heads=heads, num_kv_heads=kv_heads, head_dim=c.head_dim,
            batch_invariant=self.batch_invariant, tp=tp,
        )  # fmt: skip

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        """Read the family's tensors outside the layers and the head (`positions.py`: a table
        of learned positions, OPT's projections; BLOOM's embedding norm): none here."""

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """A norm's weight as `rms_norm` takes it."""
        return weight

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        """The norm `name` (a checkpoint's ``....weight``) as `rms_norm` takes it (StarCoder2's
        with its bias: `starcoder2.py`)."""
        return self.norm_weight(w[name])

    def head_blocks(self, w: DeviceWeights, head: str) -> list[QuantizedWeight] | None:
        """The LM head's stored blocks, for `qgemm` (float32 CPU models); None where the
        family changes the logits after the head (a soft cap, a scale): the sampler draws from
        the changed logits, so nothing is fused into the raw head."""
        return None if self.config.family.transforms_logits else w.quantized([head])

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

    def rope_table(self, index: int) -> str | None:
        """The rotary table layer `index` reads: "local" for Gemma 3's (and OLMo 3's) window
        layers; None where the layer has no rotary (`FamilyConfig.rope_layers`)."""
        f = self.config.family
        if not f.has_rope(index) or f.positions != "rope":  # (learned positions, ALiBi: none)
            return None
        return "local" if f.local_rope_theta and f.window(index) is not None else "global"

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        c, f = self.config, self.config.family
        if f.positions != "rope":  # no rotary table (`positions.py`, ALiBi)
            return {}
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

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        """The attention backend of each layer that keeps a KV cache, in layer order (the
        runner allocates each one's cache with it): the model's, or one of another shape
        (Gemma 4's full-attention layers)."""
        return [self.backend] * self.config.num_kv_layers

    @property
    def attention_backends(self) -> list[AttentionBackend]:
        """Each distinct backend among the model's and `kv_backends` (each plans a step:
        `AttentionBackend.prepare`), once."""
        return list({id(b): b for b in (self.backend, *self.kv_backends)}.values())

    def sequence_state(self, num_slots: int):
        """The per-sequence state the model keeps beyond its KV blocks, ``num_slots`` of it (the
        runner's `prepare` / `device_step` each step, `SEQUENCE_STATE`): none here (DeepSeek-V4's
        open windows: model/dsv4_engine.py; the hybrids' Mamba states are the runner's own)."""
        return None

    def layer_caches(self, caches: list) -> list:
        """Every layer's (k_cache, v_cache) from those of `kv_backends` (Mamba layers' places
        filled in already): these, or with Gemma 4's KV-shared layers reading an earlier one."""
        return caches

    # -----------------------------------------------------------------------------------------
    @property
    def cos_sin_cache(self) -> torch.Tensor:
        return self.rope_caches["global"]

    def linears(self) -> list[Linear]:
        """Every linear layer, layer by layer (attention, then the MLP's), then the LM head."""
        return [x for layer in self.layers for x in layer.linears()] + [self.lm_head]

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        out = {}
        for name, cache in self.rope_caches.items():
            rows = positions
            if name in self.long_rope:  # the short or the long half, by the token's sequence
                rows = longrope.table_rows(positions, meta, *self.long_rope[name])
            pregather = self.ops.pregather_rotary
            out[name] = (None, gather_cos_sin(rows, cache, dtype)) if pregather else (rows, cache)
        return out

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
        [N]) drawn inside the LM head, which must fuse sampling (`Linear.fuses_sampling`);
        with `HIDDEN_STATES`, their final-norm hidden states [N, hidden] (the pooling runner)."""
        h = self.input_embeddings(input_ids, positions)
        images = meta.aux.get(IMAGE_EMBEDS)
        if images is not None:  # a vision model's image placeholders: the images' features
            h.index_copy_(0, images[0], images[1])
        step = Step(meta, kv_caches, self._rope_rows(positions, h.dtype, meta))
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, step)
        h = h.index_select(0, logits_indices)
        residual = None if residual is None else residual.index_select(0, logits_indices)
        h = self.final_hidden(h, residual)
        return h if head is HIDDEN_STATES else self.logits(h, head)

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first layer's input: the tokens' embeddings (`positions.py`: with their
        positions' learned rows added)."""
        return self.embed_tokens(input_ids)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """What the LM head reads: the last layer's output added to the residual stream,
        normalised (`residual` None: a post-norm layer's output is the stream itself)."""
        eps = self.config.rms_norm_eps
        return self.rms_norm(x=h, weight=self.norm, eps=eps, residual=residual)[0]
