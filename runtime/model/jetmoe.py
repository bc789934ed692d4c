"""JetMoE (`JetMoeForCausalLM`: jetmoe/jetmoe-8b; config in `jetmoe_config.py`): Llama's layer
whose attention heads and MLP are both mixtures of experts, as transformers' modeling_jetmoe.py.

- Attention (`JetMoeLayer`, a mixture of attention heads): one shared projection `kv_proj`
  gives the tokens' keys and values (Hkv heads of `kv_channels`); a router (`experts.router.
  layer`, no bias) picks each token's top-k of E attention experts by its logits and weights
  them by the softmax over those k logits (rounded to the model's dtype); each picked expert
  e projects the token's query, Hkv heads (`experts.input_linear[e]`), so a token has k x Hkv
  query heads. Query group j's head h attends KV head h (transformers repeats the KV heads k
  times, not interleaved): the heads are laid out h-major (h k + j) so that the paged attention
  backend's grouped-query rule (query head i reads KV head i // k) serves them unchanged. Each
  group's output goes through its expert's `output_linear[e]`, weighted by its gate; the k are
  summed and `experts.bias` added. Rotary (rotate-half) on every query and KV head, the softmax
  scale kv_channels ** -0.5.
- The routed query and output projections run as one matmul over all E experts' stacked
  matrices (`input_linear` as [E Hkv D, hidden]; `output_linear` as [hidden, E Hkv D] over the
  groups scattered into their experts' slots, zeros elsewhere): no host sync, no per-token or
  per-expert loop, CUDA graphs capture it; E / k times the projections' work (4x for
  jetmoe-8b's 8 experts, top 2).
- MLP: GraniteMoe's experts (`moe.SparseMoE` over the stacked `mlp.input_linear` [E, 2N, hidden],
  gate then up, and `mlp.output_linear`; the router `mlp.router.layer`: the softmax over the
  top-k logits, rounded), then `mlp.bias` added.
- The norms inside the layers use JetMoeRMSNorm's default eps 1e-6; the final norm
  `rms_norm_eps`. The auxiliary load-balancing losses are training-only: not computed.

Tensor parallelism splits the KV heads (`jetmoe_config.tp_problem`: N must divide them; a rank
holds every attention expert's query heads and output columns of its KV heads, whose keys and
values are its rows of `kv_proj`; the routed output projections summed over ranks, then
`experts.bias`) and the MLP's experts by width (`moe.SparseMoE`, then `mlp.bias`); both routers
are replicated, so every rank picks the same experts. `--quantization fp8` is refused
(`engine.start_checks.check_dtype`): not tested for the routed attention.
"""

from __future__ import annotations

import dataclasses

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.jetmoe_config import LAYER_NORM_EPS
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, linear_layer
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.parallel_linear import RowParallelLinear, column_linear


class JetMoeMLP:
    """The layer's experts (`moe.SparseMoE`, GraniteMoe's stacked names), then `mlp.bias`."""

    __slots__ = ("bias", "routed")

    def __init__(self, moe: SparseMoE, bias: torch.Tensor) -> None:
        self.routed, self.bias = moe, bias  # (`routed`: as SharedExpertMoE names it)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.routed(x) + self.bias

    def linears(self) -> list[Linear]:
        return self.routed.linears()


class JetMoeLayer(LlamaLayer):
    """Llama's layer with the mixture of attention heads (module docstring): `qkv_heads` routes
    the queries, `attention_output` routes the heads' outputs back (`o_proj`: every expert's
    output projection over the scattered groups, with `experts.bias`)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        f, a = model.config.family, prefix + "self_attention."
        x = a + "experts."
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        self.num_experts, self.top_k = f.num_experts, f.num_experts_per_tok
        self.router = ctx.linear(w[x + "router.layer.weight"])
        self.qkv, q, o = self.attention_weights(model, w, a)
        self.queries = ctx.linear(q.reshape(-1, q.shape[-1]))
        o = o.permute(1, 0, 2).reshape(o.shape[1], -1)  # [E, hidden, Hkv D] -> [hidden, E Hkv D]
        if ctx.tp is None:
            self.o_proj = ctx.linear(o, w[x + "bias"])
        else:  # every expert's columns of this rank's heads, summed over ranks, then the bias
            self.o_proj = RowParallelLinear(ctx.linear(o), w[x + "bias"], ctx.tp)
        del q, o
        self.kv_scales = model.kv_scales(w, a.rstrip("."))
        self.window = self.chunk = None
        self.rope = model.rope_table(index)
        self.rotary = ctx.ops.rotary_embedding
        self.mlp = model.make_mlp(w, prefix, index, ctx)

    def attention_weights(
        self, model: LlamaModel, w: DeviceWeights, a: str
    ) -> tuple[Linear, torch.Tensor, torch.Tensor]:
        """(`kv_proj`'s layer: keys, then values; every attention expert's query projection
        [E, Hkv D, hidden]; their output projection [E, hidden, Hkv D]): all heads', or on a
        tensor-parallel rank its KV heads' rows and columns (module docstring)."""
        x = a + "experts."
        kv, q, o = a + "kv_proj.weight", x + "input_linear.weight", x + "output_linear.weight"
        if self.ctx.tp is None:
            return linear_layer(self.ctx, w, [kv]), w[q], w[o]
        c = model.config
        d, width = c.head_dim, c.num_kv_heads * c.head_dim
        h0, h1 = self.ctx.tp.layout.even(c.num_kv_heads)
        rows = (h0 * d, h1 * d)
        keys_values = column_linear(self.ctx, w, [kv, kv], [rows, (width + h0 * d, width + h1 * d)])
        return keys_values, w.part(q, 1, *rows), w.part(o, 2, *rows)

    def linears(self) -> list[Linear]:
        return [self.router, self.queries, self.qkv, self.o_proj, *self.mlp.linears()]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gates [T, k] in the model's dtype, expert ids [T, k]) of the tokens `x`: the softmax
        over the top-k router logits (JetMoeTopKGating)."""
        top, ids = self.router(x).float().topk(self.top_k, dim=-1)
        return torch.softmax(top, dim=-1).to(x.dtype), ids

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx = self.ctx
        t, d, hkv, k = x.shape[0], ctx.head_dim, ctx.num_kv_heads, self.top_k
        _, ids = self.route(x)
        every = self.queries(x).view(t, self.num_experts, hkv * d)
        q = every.gather(1, ids.unsqueeze(-1).expand(t, k, hkv * d))  # [T, k, Hkv D]
        q = q.view(t, k, hkv, d).transpose(1, 2).reshape(t, hkv * k, d)  # head h k + j
        key, value = self.qkv(x).split(hkv * d, dim=-1)
        return q, key.reshape(t, hkv, d), value.reshape(t, hkv, d)

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The heads' outputs [T, Hkv k D] (h-major) weighted by their gates in their experts'
        slots [T, E Hkv D] (zeros where not picked), for `o_proj`."""
        ctx = self.ctx
        t, d, hkv, k = x.shape[0], ctx.head_dim, ctx.num_kv_heads, self.top_k
        gates, ids = self.route(x)  # (as `qkv_heads` routed them: the same rows, the same picks)
        groups = out.view(t, hkv, k, d).transpose(1, 2).reshape(t, k, hkv * d)
        slots = out.new_zeros(t, self.num_experts, hkv * d)
        slots.scatter_(1, ids.unsqueeze(-1).expand(t, k, hkv * d), groups * gates.unsqueeze(-1))
        return slots.view(t, -1)


class JetMoeModel(LlamaModel):
    layer_class = JetMoeLayer
    moe_names = ("mlp.", ("input_linear", "output_linear"))  # GraniteMoe's, stacked
    moe_router, moe_experts = "router.layer.weight", ""

    def layer_context(self, linear) -> LayerContext:
        # the layers' norms: JetMoeRMSNorm's default eps (the final norm: rms_norm_eps)
        return dataclasses.replace(super().layer_context(linear), eps=LAYER_NORM_EPS)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return JetMoeMLP(SparseMoE.from_weights(self, w, prefix, ctx), w[prefix + "mlp.bias"])
