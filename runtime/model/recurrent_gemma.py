"""RecurrentGemma (`RecurrentGemmaForCausalLM`: Google's recurrentgemma-2b / 9b, Griffin's
architecture; config read in `recurrent_gemma_config.py`): each layer ``x + block(norm(x))``,
then ``+ mlp(norm(x))`` (GeGLU with biases), the block by `block_types`:

- local attention: Llama's (a sliding window of `attention_window_size` keys, rotary on half
  of each head, o_proj biased), or
- a recurrent block (`RgLru`, transformers' `RecurrentGemmaRecurrentBlock`):
  y = gelu(linear_y(x)); x = conv(linear_x(x)) (causal, depthwise, biased, no activation); the
  RG-LRU over x's channels (in `num_attention_heads` blocks, each with its own input and
  recurrence gates, block-diagonal projections: one batched matmul over the blocks):

      i_t = sigmoid(W_i x_t + b_i),   r_t = sigmoid(W_a x_t + b_a)
      a_t = exp(-8 r_t softplus(Λ)),   h_t = a_t h_{t-1} + sqrt(1 - a_t²) (i_t x_t)

  (at a sequence's first token h_{-1} is 0 and the sqrt factor 1), then linear_out(h * y).

Gemma's (1 + w) norms, the embedding times sqrt(hidden) rounded to bfloat16 (transformers
holds the normalizer so whatever the dtype), the logits soft-capped (`gemma2.GemmaModel`).
A recurrent block keeps, per sequence, its conv inputs and its float32 h in the hybrids'
state slots (`worker/mamba_state.py`, `MambaConfig.mixer` "rglru": SSM slots [heads, P, 1]);
the decode rows are one batched step over their slots, the prefill chunks run the conv
together (`mamba2.packed_conv`) and the recurrence position by position over `ssd.pack`'s
position-major layout (chunks of one token, Mamba-1's: one elementwise torch step per position
of the step's longest chunk, over every sequence still running at it; no per-sequence loop).
Prefix caching keeps snapshots every block (the state before any token: `engine/recurrent.py`).
Tensor parallel: a recurrent block by its gate blocks (N must divide `num_attention_heads`,
`distributed/layout.mamba_problem`): a rank's channels of linear_y, linear_x, the conv, Λ and h
(its state slots theirs: `MambaConfig.on_ranks`), its blocks of both gates, linear_out
row-parallel (its bias added once); local attention by heads, the MLP by width. 16 or 32 bits
(`family_options.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gemma2 import GemmaModel
from pagoda.runtime.model.lfm2 import ShortConv
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba1 import scan_by_position
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, save_chunk_ends
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig

FIRST = "rglru_first"  # meta.aux: bool [T], the tokens at position 0 (the RG-LRU's reset)


class RgLru(ShortConv):
    """One recurrent block's weights and forward (module docstring); the conv's decode and
    prefill are the short conv's (`lfm2.ShortConv`)."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx) -> None:
        p, r = prefix + "temporal_block.", prefix + "temporal_block.rg_lru."
        tp, yx, out = (
            ctx.tp,
            [p + "linear_y.weight", p + "linear_x.weight"],
            p + "linear_out.weight",
        )
        self.index = index
        if tp is None:
            self.in_proj, self.out_proj = linear_layer(ctx, w, yx), linear_layer(ctx, w, [out])
            c0, c1 = 0, m.d_inner
        else:  # this rank's gate blocks: their channels of y and x, out_proj row-parallel
            self.in_proj, self.out_proj = column_linear(ctx, w, yx), row_linear(ctx, w, out)
            c0, c1 = tp.layout.even(m.d_inner)
        self.m = m if tp is None else m.on_ranks(tp.layout.size)  # (this rank's blocks)
        self.width = c1 - c0

        def rows(name: str, per_head: bool = False) -> torch.Tensor:
            """This rank's channels (or gate blocks) of tensor `name`."""
            if tp is None:
                return w[name]
            return w.part(
                name, 0, *((c0 // m.head_dim, c1 // m.head_dim) if per_head else (c0, c1))
            )

        self.weight = rows(p + "conv_1d.weight")[:, 0, :].contiguous()  # [D, K]
        self.bias = rows(p + "conv_1d.bias")
        gates = [rows(r + f"{g}_gate_weight", True) for g in ("input", "recurrent")]  # [H, P, P]
        self.gates = torch.cat(gates, dim=-1)  # [H, P, 2P]: x_h @ both at once
        bias = torch.cat([rows(r + f"{g}_gate_bias", True) for g in ("input", "recurrent")], -1)
        self.gates_bias = bias[:, None, :]  # [H, 1, 2P]
        self.log_a = -8.0 * F.softplus(rows(r + "recurrent_param").float())  # [D] float32

    def __call__(self, h: torch.Tensor, step: MambaStep, first: torch.Tensor) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]; `first` [T]: the tokens at their sequence's start."""
        nd = step.num_decodes
        conv, ssm = step.states[self.index]
        y, x = self.in_proj(h).split(self.width, dim=-1)
        c = torch.empty_like(x)
        if nd:
            c[:nd] = self._decode(conv, x[:nd], step)
        if step.prefill is not None:
            c[nd:] = self._prefill(conv, x[nd:], step)
        a, u = self._inputs(c, first)
        out = torch.empty_like(a)
        if nd:
            run = step.decode_run
            state = ssm[run[0] : run[1]] if run else ssm.index_select(0, step.slots[:nd])
            s = state.view(nd, -1)
            s.mul_(a[:nd]).add_(u[:nd])
            out[:nd] = s
            if not run:
                ssm.index_copy_(0, step.slots[:nd], state)
        if step.prefill is not None:
            out[nd:] = self._scan(ssm, a[nd:], u[nd:], step)
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        y = F.gelu(y, approximate="tanh")
        return self.out_proj(out.to(h.dtype) * y)

    def _inputs(self, c: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrence's decay a and input u [T, D] (float32) of the conv's output c."""
        m = self.m
        blocks = c.view(-1, m.n_heads, m.head_dim).transpose(0, 1)  # [H, T, P]
        g = torch.sigmoid(torch.baddbmm(self.gates_bias, blocks, self.gates).float())
        gi, ga = g.transpose(0, 1).reshape(c.shape[0], m.n_heads, 2, m.head_dim).unbind(2)
        log_a = ga.reshape(c.shape) * self.log_a
        at_start = first[:, None]
        scale = torch.where(at_start, 1.0, torch.sqrt(1 - torch.exp(2 * log_a)))
        u = c * gi.reshape(c.shape).to(c.dtype) * scale.to(c.dtype)
        return torch.exp(log_a).masked_fill(at_start, 0.0), u.float()

    def _scan(self, ssm, a: torch.Tensor, u: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """The prefill chunks' recurrence h = a h + u (`mamba1.scan_by_position`)."""

        def advance(s, off, n, packed):
            return s.mul_(packed[0][off : off + n]).add_(packed[1][off : off + n])

        return scan_by_position(ssm, (a, u), step, self.index, advance, out=1, flat=True)


class RecurrentGemmaLayer(RecurrentLayer, LlamaLayer):
    """Local attention (Llama's) or a recurrent block, then the MLP (module docstring)."""

    mixer: RgLru | None = None

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> RgLru:
        return RgLru(model.config.family.mamba, w, prefix, index, ctx)

    def mix(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        return self.mixer(x, step.meta.aux[MAMBA_STEP], step.meta.aux[FIRST])


class RecurrentGemmaModel(GemmaModel):
    layer_class = RecurrentGemmaLayer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        # transformers' normalizer: sqrt(hidden) held in bfloat16, whatever the model's dtype
        scale = torch.tensor(math.sqrt(config.hidden_size), dtype=torch.bfloat16)
        self.embed_scale = scale.to(device=self.device, dtype=self.dtype)

    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        meta.aux[FIRST] = positions == 0  # (the RG-LRU's reset)
        return super().forward(input_ids, positions, kv_caches, meta, logits_indices, head)
