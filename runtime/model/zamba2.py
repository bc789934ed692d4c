"""Zamba2 (`Zamba2ForCausalLM`: Zyphra's Zamba2-1.2B, 2.7B, 7B; configs read in
`zamba2_config.py`): a Mamba2 mixer in every layer, x + mixer(norm(x)) (`mamba2.Mamba2Mixer`,
its gated norm's eps 1e-5, dt clamped below at `time_step_min`), and on the hybrid layers a
shared transformer block before it, whose output t goes through the layer's own `linear` and
joins the mixer's input only: x + mixer(norm(x + linear(t))).

The block (`SharedBlock`, `num_mem_blocks` of them used in turn, their weights held once):

    a = [x, e]                      (the stream and the token embeddings, 2 x hidden)
    t = attention(norm(a))          (head_dim 2 x hidden / heads, scale (head_dim / 2) ** -0.5,
                                     rotary where `use_mem_rope`; no residual add)
    t = down(act(gate_up(norm(t)))) (GELU by default; no residual add)

Each use has LoRA adapters of its own (`LoraLinear`: base(x) + B(A(x))) on the MLP's gate_up,
and on q, k and v where `use_shared_attention_adapter` (the three stacked: A [3r, 2h], B the
block-diagonal of theirs), and a KV cache of its own (the hybrid layers are the model's
attention layers); the Mamba2 state slots as the other hybrids' (`worker/mamba_state.py`).
16 or 32 bits (the shared blocks' adapters do not run in FP8); prefix caching as the Mamba2
hybrids' (state snapshots). Tensor parallel: the mixers as the other Mamba2 hybrids'
(`mamba_shard.py`); each shared block's attention by heads (q, k, v column-parallel, o
row-parallel) and MLP by width (gate_up column-parallel, down row-parallel), the norms and the
layers' `linear` whole on every rank; a use's LoRA adapters' A whole, B's rows those of its
base projection's (`SharedBlock.adapter`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pagoda.runtime.model import zamba2_config
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP, Mamba2Mixer
from pagoda.runtime.model.parallel_linear import column_linear, row_linear

FINAL_NORM = "model.final_layernorm.weight"  # Zamba2's name for `model.norm`


@dataclass
class Zamba2Step(Step):
    embeddings: torch.Tensor | None = None  # the step's token embeddings, the blocks' 2nd half


class LoraLinear:
    """base(x) + up(down(x)): a shared projection with one use's adapter."""

    __slots__ = ("base", "down", "up")

    def __init__(self, base, down, up) -> None:
        self.base, self.down, self.up = base, down, up

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))

    def linears(self) -> list:
        return [self.down, self.up]


class SharedBlock:
    """One shared transformer block's weights (module docstring), read once from its first
    use's layer (`zamba2_config.block_prefix`)."""

    gate_up_names = ("gate_up_proj",)  # the MLP's gate and up, under ``feed_forward.``

    def __init__(self, model: LlamaModel, w: DeviceWeights, ctx: LayerContext, block: int):
        p = zamba2_config.block_prefix(model.config, block)
        a, f = p + "self_attn.", p + "feed_forward."
        self.prefix = p
        self.attn_norm = model.read_norm(w, p + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, p + "pre_ff_layernorm.weight")
        qkv = [f"{a}{n}_proj.weight" for n in "qkv"]
        gate_up = [f"{f}{n}.weight" for n in self.gate_up_names]
        self.qkv_rows = self.gate_up_rows = None  # (one rank: every row)
        if ctx.tp is None:
            self.qkv = linear_layer(ctx, w, qkv)
            self.o_proj = linear_layer(ctx, w, [a + "o_proj.weight"])
            self.gate_up = linear_layer(ctx, w, gate_up)
            self.down = linear_layer(ctx, w, [f + "down_proj.weight"])
            return
        # tensor parallel: attention by heads, the MLP by width (o and down row-parallel); the
        # rows of q, k, v and gate_up a rank holds, its adapters' B too (`adapter`)
        c, lay = model.config, ctx.tp.layout
        (q0, q1), (k0, k1), d = lay.heads(c.num_heads), lay.kv_heads(c.num_kv_heads), c.head_dim
        self.qkv_rows = [[(q0 * d, q1 * d)], [(k0 * d, k1 * d)], [(k0 * d, k1 * d)]]
        fused = len(gate_up) == 1  # Zamba2's gate_up_proj: gate's rows, then up's
        width = w.length(gate_up[0], 0) // (2 if fused else 1)
        g0, g1 = lay.even(width)
        halves = [(g0, g1), (width + g0, width + g1)]
        self.gate_up_rows = [halves] if fused else [[(g0, g1)], [(g0, g1)]]
        self.qkv = column_linear(ctx, w, qkv, [r for rs in self.qkv_rows for r in rs])
        self.o_proj = row_linear(ctx, w, a + "o_proj.weight")
        names = [n for n, rs in zip(gate_up, self.gate_up_rows) for _ in rs]
        self.gate_up = column_linear(ctx, w, names, [r for rs in self.gate_up_rows for r in rs])
        self.down = row_linear(ctx, w, f + "down_proj.weight")

    def linears(self) -> list:
        return [self.qkv, self.o_proj, self.gate_up, self.down]

    def projections(self, ctx: LayerContext, w: DeviceWeights, use: int, z) -> tuple:
        """Use `use`'s q/k/v and gate_up: the block's, with the use's LoRA adapters on the
        MLP's gate_up and, where `z.attention_adapters`, on q, k and v."""
        qkv = self.qkv
        if z.attention_adapters:
            names = ["self_attn.linear_q", "self_attn.linear_k", "self_attn.linear_v"]
            qkv = LoraLinear(self.qkv, *self.adapter(ctx, w, names, use, self.qkv_rows))
        gate_up = ["feed_forward.gate_up_proj"]
        adapter = self.adapter(ctx, w, gate_up, use, self.gate_up_rows)
        return qkv, LoraLinear(self.gate_up, *adapter)

    def adapter(self, ctx: LayerContext, w: DeviceWeights, names: list[str], use: int, rows):
        """Use `use`'s adapters of the projections `names` (under the block) as one
        (A stacked, B block-diagonal). Tensor parallel (`rows`: each projection's rows on this
        rank): A whole on every rank, B's rows those of its base projection's output."""
        down = [w[f"{self.prefix}{n}_adapter_list.{use}.0.weight"] for n in names]
        up = [f"{self.prefix}{n}_adapter_list.{use}.1.weight" for n in names]
        if rows is None:
            up = [w[n] for n in up]
        else:
            up = [torch.cat([w.part(n, 0, *r) for r in rs]) for n, rs in zip(up, rows)]
        return ctx.linear(torch.cat(down)), ctx.linear(torch.block_diag(*up))


class Zamba2Layer(LlamaLayer):
    """A Mamba2 layer, with a shared block's use before its mixer on a hybrid layer (module
    docstring); Llama's attention on the block's projections with this use's adapters, its KV
    cache the layer's."""

    block: SharedBlock | None = None

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c = model.config
        m = c.family.mamba
        p = zamba2_config.mixer_prefix(c, index)
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, p + "input_layernorm.weight")  # the mixer's norm
        self.mixer = self.make_mixer(m, w, p, index, ctx)
        if not m.zamba2.hybrid[index]:
            return
        b, use = m.zamba2.block(index)
        self.block = block = model.blocks[b]
        self.qkv, self.gate_up = block.projections(ctx, w, use, m.zamba2)
        self.o_proj = block.o_proj
        self.kv_scales = model.kv_scales(w, block.prefix + "self_attn")
        self.window = self.chunk = None
        self.rope = model.rope_table(index)
        self.rotary = ctx.ops.rotary_embedding
        self.linear = linear_layer(ctx, w, [f"model.layers.{index}.linear.weight"])

    def make_mixer(self, m, w: DeviceWeights, p: str, index: int, ctx: LayerContext):
        """The layer's mixer (under `p`): Mamba2's (Zamba's Mamba-1 heads: `zamba.py`)."""
        return Mamba2Mixer(m, w, p, index, zamba2_config.GATED_NORM_EPS, ctx)

    def linears(self):
        if self.block is None:
            return self.mixer.linears()
        adapters = [a for x in (self.gate_up, self.qkv) if isinstance(x, LoraLinear)
                    for a in x.linears()]  # fmt: skip
        first = self.block.linears() if self.is_first_use else []  # (shared: listed once)
        return [*self.mixer.linears(), *adapters, self.linear, *first]

    @property
    def is_first_use(self) -> bool:
        return self.block.prefix.startswith(f"model.layers.{self.index}.")

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Zamba2Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        s = h if residual is None else residual.add_(h)  # the stream
        x = s if self.block is None else s + self.shared(s, step)
        return self.mixer(norm(x=x, weight=self.attn_norm, eps=eps), step.meta.aux[MAMBA_STEP]), s

    def shared(self, s: torch.Tensor, step: Zamba2Step) -> torch.Tensor:
        """This use of the shared block on the stream `s`, through the layer's linear."""
        norm, eps, b = self.ctx.rms_norm, self.ctx.eps, self.block
        x = norm(x=torch.cat([s, step.embeddings], dim=-1), weight=b.attn_norm, eps=eps)
        x = norm(x=self.attention(x, step), weight=b.mlp_norm, eps=eps)
        return self.linear(b.down(self.ctx.act_and_mul(x=self.gate_up(x))))


class Zamba2Model(LlamaModel):
    layer_class = Zamba2Layer
    block_class = SharedBlock

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        z = self.config.family.mamba.zamba2
        n = min(z.blocks, sum(z.hybrid))
        self.blocks = [self.block_class(self, w, ctx, b) for b in range(n)]

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        return super().read_norm(w, FINAL_NORM if name == "model.norm.weight" else name)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta,
        logits_indices: torch.Tensor,
        head=None,
    ) -> torch.Tensor:
        """`LlamaModel.forward`, the token embeddings kept apart for the shared blocks."""
        e = self.input_embeddings(input_ids, positions)
        rope = self._rope_rows(positions, e.dtype, meta)
        step = Zamba2Step(meta, kv_caches, rope, embeddings=e)
        h, residual = e.clone(), None  # (the stream is added to in place)
        for layer in self.layers:
            h, residual = layer(h, residual, step)
        h = h.index_select(0, logits_indices)
        residual = None if residual is None else residual.index_select(0, logits_indices)
        return self.logits(self.final_hidden(h, residual), head)
