"""Mixture-of-experts MLP and the families built on it: Mixtral, Qwen3-MoE and Qwen2-MoE here,
GraniteMoe in `granite.py`, OLMoE in `olmo2.py`.

The router is a linear layer to one logit per expert; its softmax (float32) picks the top-k
experts of each token, whose probabilities are renormalised to sum to 1 (Mixtral, and Qwen3-MoE
with `norm_topk_prob`). Each expert is a SwiGLU MLP; a token's output is the weighted sum of its
experts' outputs.

- CPU: grouped by expert (`grouped_experts`): the picks sorted by expert, one gate/up and one
  down matmul per expert that has tokens, each weighted product rounded to the model's dtype and
  index-added back in expert order, as transformers adds them; no per-token loop. The experts'
  matmuls are the dense layers' `Linear`s (packed once, a row's bits independent of how many
  rows share the call), so a token's output does not depend on the rest of the batch.
- CUDA: `pagoda.kernels.fused_moe.fused_experts` (expert-aligned grouped Triton GEMMs, no host
  sync, so CUDA graphs capture it; batch-invariant with `--batch-invariant`); where that kernel
  cannot be imported, every expert over every token (same result, E times the work), logged.

Tensor parallelism (`pagoda.runtime.distributed`) splits each expert's intermediate width, as
vLLM's fused-MoE layer does: every rank holds rows [r N/R, (r+1) N/R) of every expert's gate and
up and those columns of its down, routes every token itself (the router is replicated), and the
ranks' partial outputs are summed by one all-reduce per layer.

Qwen2-MoE adds a shared expert (`SharedExpertMoE`): a SwiGLU MLP every token goes through, its
output scaled by sigmoid(shared_expert_gate(x)) and added to the routed experts'; under tensor
parallelism it is split by width like the experts, and both partial sums share the all-reduce.

Expert weights come per expert (Hugging Face: `experts.{e}.w1` / `gate_proj` ...) or stacked
`[E, N, K]` under `experts.{name}.weight` (the GGUF loader's names for `ffn_*_exps`), or gate
and up stacked together `[E, 2N, K]` beside down `[E, K, N]` (GraniteMoe's `input_linear` and
`output_linear`; its router's softmax over the top-k logits is the renormalised top-k), or
those two stored transposed, `[E, K, 2N]` and `[E, N, K]` (Aria's, `AriaTextModel`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from pagoda.runtime.cpu.quantized import QuantizedWeight, stack
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaModel
from pagoda.runtime.model.parallel_linear import RowParallelLinear
from pagoda.runtime.model.qwen3 import Qwen3Model

log = logging.getLogger(__name__)


def grouped_experts(
    x: torch.Tensor,  # [T, K]
    topk_weights: torch.Tensor,  # float32 [T, k]
    topk_ids: torch.Tensor,  # [T, k]; -1: no expert (LongCat's zero experts)
    expert: Callable[[int, torch.Tensor], torch.Tensor],  # (e, rows [n, K]) -> [n, K]
) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * expert(topk_ids[t, j], x[t])`` grouped by expert (module
    docstring); a pick of id -1 adds nothing. Reads the per-expert counts on the host: the CPU
    path."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (the -1 picks first)
    token = order // k  # the token of each pick, by expert
    weight = topk_weights.reshape(-1).index_select(0, order)
    out = torch.zeros_like(x)
    real = flat >= 0
    start = flat.numel() - int(real.sum())
    for e, n in enumerate(torch.bincount(flat[real]).tolist()):
        if n:
            rows = token[start : start + n]
            y = expert(e, x.index_select(0, rows))
            out.index_add_(0, rows, (y * weight[start : start + n, None]).to(out.dtype))
            start += n
    return out


def masked_experts(
    x: torch.Tensor,  # [T, K]
    topk_weights: torch.Tensor,  # float32 [T, k]
    topk_ids: torch.Tensor,  # [T, k]; -1: no expert
    expert: Callable[[int, torch.Tensor], torch.Tensor],  # (e, rows [n, K]) -> [n, K]
    num_experts: int,
) -> torch.Tensor:
    """`grouped_experts`' sum with every expert over every token, each output times its weight
    (0 where the expert is not picked): no host sync (CUDA graphs), E times the work; the CUDA
    path where no fused kernel runs the experts."""
    dense = torch.zeros(x.shape[0], num_experts + 1, device=x.device)
    dense.scatter_(1, topk_ids.long() % dense.shape[1], topk_weights)  # -1 picks the last
    out = torch.zeros_like(x)
    for e in range(num_experts):
        out += (expert(e, x) * dense[:, e : e + 1]).to(out.dtype)
    return out


def _fused_kernel() -> Callable[..., torch.Tensor] | None:
    try:
        from pagoda.kernels.fused_moe import fused_experts
    except ImportError:  # no Triton, or a build without the fused-MoE kernel
        return None
    return fused_experts


class SparseMoE:
    """Router + experts of one layer (module docstring)."""

    # the fused kernel's activation where the family sets `act_and_mul` otherwise (HY V4's)
    fused_activation: dict = {}

    def __init__(
        self,
        ctx: LayerContext,
        router: Linear,
        experts: list[tuple[Linear, Linear]],  # (gate_up, down) per expert, for the CPU path
        w13: torch.Tensor | None,  # [E, 2N, K] and [E, K, N] on CUDA
        w2: torch.Tensor | None,
        top_k: int,
        renormalize: bool,
        round_weights: bool,
        route: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        """``route``: (weights, ids) of the hidden states where the family routes otherwise
        than by `router`'s softmax (`moe_routing.GroupedRouter`, DeepSeek's)."""
        self.router, self.experts, self.w13, self.w2 = router, experts, w13, w2
        self.route = route
        self.top_k, self.renormalize, self.round_weights = top_k, renormalize, round_weights
        self.act_and_mul = ctx.act_and_mul
        self.batch_invariant = ctx.batch_invariant
        self.tp = ctx.tp
        self.fused = _fused_kernel() if w13 is not None else None
        if w13 is not None and self.fused is None:
            log.warning("no fused-MoE kernel here: every expert runs over every token")

    @classmethod
    def from_weights(
        cls, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext
    ) -> SparseMoE:
        f = model.config.family
        block, names = model.moe_names  # type: ignore[attr-defined]
        p = prefix + block
        gate = p + getattr(model, "moe_router", "gate.weight")
        route = None
        if f.routing is not None:  # DeepSeek's: float32 scores, grouped (moe_routing.py)
            from pagoda.runtime.model.moe_routing import GroupedRouter

            bias = p + getattr(model, "moe_bias", "gate.e_score_correction_bias")
            linear = ctx.linear(w.source(gate).float())  # replicated on every rank
            stored = f.routing.bias and (bias in w or not f.routing.bias_optional)
            bias = w.source(bias).reshape(-1) if stored else None  # ([1, E]: ERNIE's)
            route = GroupedRouter(linear, bias, f.routing, f.num_experts_per_tok,
                                  f.norm_topk_prob)  # fmt: skip
            router = None
        else:
            router = ctx.linear(w[gate], quantized=w.quantized([gate]))
        tensors = _ExpertTensors(w, p + getattr(model, "moe_experts", "experts."), names,
                                 f.num_experts, getattr(model, "moe_suffix", ".weight"),
                                 getattr(model, "moe_transposed", False))  # fmt: skip
        if ctx.tp is not None:
            tensors.rows = ctx.tp.layout.even(f.moe_intermediate_size)
        w13 = w2 = None
        experts: list[tuple[Linear, Linear]] = []
        if w.device.type == "cuda":  # stacked for the fused kernel: [E, 2N, K] and [E, K, N]
            w13_rows, w2_rows = [], []
            for e in range(f.num_experts):
                gate, up, down = tensors.weights(e)
                w13_rows.append(torch.cat([gate, up]))
                w2_rows.append(down)
            w13, w2 = torch.stack(w13_rows), torch.stack(w2_rows)
            del w13_rows, w2_rows
        else:
            for e in range(f.num_experts):
                gate, up, down = tensors.weights(e)
                qg, qu, qd = tensors.blocks(e)
                gate_up_q = None if qg is None or qu is None else stack([*qg, *qu])
                experts.append(
                    (
                        ctx.linear(torch.cat([gate, up]), quantized=gate_up_q),
                        ctx.linear(down, quantized=qd),
                    )
                )
        return cls(
            ctx, router, experts, w13, w2, f.num_experts_per_tok, f.norm_topk_prob,
            f.round_topk_to_model_dtype, route,
        )  # fmt: skip

    def linears(self) -> list[Linear]:
        router = [self.router] if self.route is None else [self.route.linear]
        return [*router, *(x for pair in self.experts for x in pair)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.partial(x)
        return out if self.tp is None else self.tp.all_reduce(out)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """The experts' output before the ranks' sum (tensor parallel: this rank's part)."""
        if self.route is not None:
            weights, ids = self.route(x)
        else:
            probs = torch.softmax(self.router(x).float(), dim=-1)
            weights, ids = torch.topk(probs, self.top_k, dim=-1)
            if self.renormalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.run_experts(x, weights, ids)

    def run_experts(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, none_ids: bool = False
    ) -> torch.Tensor:
        """``sum_j weights[t, j] * expert(ids[t, j], x[t])`` (this rank's part; weights float32
        [T, k], ids [T, k]) for routing decided by the caller (`partial`'s, Zaya's router:
        `zaya.py`); ``none_ids``: an id of -1 picks no expert and costs nothing (LongCat's zero
        experts)."""
        if self.round_weights:  # Qwen3-MoE hands the experts weights in the model's dtype
            weights = weights.to(x.dtype).float()
        if self.fused is not None:
            return self.fused(
                x, self.w13, self.w2, weights, ids.to(torch.int32),
                batch_invariant=self.batch_invariant, none_ids=none_ids,
                **self.fused_activation,
            )  # fmt: skip
        if self.w13 is not None:
            return self._every_expert(x, weights, ids)
        return grouped_experts(x, weights, ids, self._expert)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.experts[e]
        return down(self.act_and_mul(x=gate_up(rows)))

    def _every_expert(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor):
        """Without the fused kernel on CUDA (`masked_experts`)."""
        return masked_experts(x, weights, ids, self._stacked_expert, self.w13.shape[0])

    def _stacked_expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        y = self.act_and_mul(x=rows @ self.w13[e].T)
        return torch.nn.functional.linear(y, self.w2[e])


class _ExpertTensors:
    """One layer's expert weights, per expert or stacked (read once, then sliced); two names
    are stacked gate and up in one [E, 2N, K] tensor, then down (GraniteMoe's; `suffix` ""
    where the stacks are stored as transformers 5's `gate_up_proj` / `down_proj` parameters,
    Zaya's; `transposed`: stored [E, K, 2N] and [E, N, K], `grouped_mm`'s layout, Aria's)."""

    def __init__(
        self, w: DeviceWeights, prefix: str, names: tuple[str, ...], n: int,
        suffix: str = ".weight", transposed: bool = False,
    ):  # fmt: skip
        self.w, self.prefix, self.names, self.n = w, prefix, names, n
        self.transposed = transposed
        self.rows: tuple[int, int] | None = None  # this rank's intermediate rows (tensor parallel)
        self.stacked = f"{prefix}{names[0]}{suffix}" in w
        self._stacks = [f"{prefix}{x}{suffix}" for x in names] if self.stacked else None
        self._stack: list[torch.Tensor] | None = None  # read at the first `weights`
        self._cut = False  # whether `_stack` holds this rank's rows alone

    def _name(self, e: int, which: int) -> str:
        return f"{self.prefix}{e}.{self.names[which]}.weight"

    def _read_stacks(self) -> None:
        """The stacked tensors; with `rows`, a stacked gate_up [E, 2N, K] and down [E, K, N]
        (not transposed) as this rank's rows of gate and up and columns of down alone, the
        rest never read (`DeviceWeights.part`: a safetensors file's slices)."""
        names, w = self._stacks, self.w
        assert names is not None
        if self.rows is None or self.transposed or len(names) != 2:
            self._stack = [w[x] for x in names]
            return
        (a, b), n = self.rows, w.length(names[0], 1) // 2
        gate_up = torch.cat([w.part(names[0], 1, a, b), w.part(names[0], 1, n + a, n + b)], 1)
        self._stack, self._cut = [gate_up, w.part(names[1], 2, a, b)], True

    def weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate [N, K], up [N, K], down [K, N]) of expert `e`; with `rows`, this rank's
        rows of gate and up and those columns of down."""
        if self.stacked and self._stack is None:
            self._read_stacks()
        if self._cut:  # (this rank's rows already)
            gate, up = self._stack[0][e].chunk(2)
            return gate.contiguous(), up.contiguous(), self._stack[1][e].contiguous()
        if self._stack is not None and len(self._stack) == 2:
            gate_up, down = self._stack[0][e], self._stack[1][e]
            if self.transposed:  # (gate and up are cut, then stacked or copied: contiguous)
                gate_up, down = gate_up.T, down.T.contiguous()
            gate, up = gate_up.chunk(2)
        elif self._stack is not None:
            gate, up, down = (t[e] for t in self._stack)
        else:
            gate, up, down = (self.w[self._name(e, i)] for i in range(3))
        if self.rows is None:
            return gate, up, down
        a, b = self.rows
        return gate[a:b].contiguous(), up[a:b].contiguous(), down[:, a:b].contiguous()

    def blocks(self, e: int) -> tuple[QuantizedWeight | None, ...]:
        """Stored blocks of (gate, up, down) for `qgemm` (float32 CPU models), or Nones."""
        if not self.stacked:
            return tuple(self.w.quantized([self._name(e, i)]) for i in range(3))
        if len(self.names) == 2:  # GraniteMoe's (Hugging Face only): no stored blocks
            return None, None, None
        out = []
        for name in self.names:
            q = self.w.quantized([f"{self.prefix}{name}.weight"])
            if q is None:
                out.append(None)
                continue
            rows = q[0].rows // self.n  # stacked: expert e's rows follow expert e - 1's
            out.append(
                [QuantizedWeight(q[0].kind, q[0].blocks[e * rows : (e + 1) * rows], q[0].cols)]
            )
        return tuple(out)


class SharedExpertMoE:
    """The routed experts plus a shared expert gated by a sigmoid (Qwen2-MoE; module docstring):
    ``experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)``; without a gate (DeepSeek's
    `shared_experts`), ``experts(x) + shared_experts(x)``."""

    def __init__(
        self, routed: SparseMoE, shared: GatedMLP, gate: Linear | None, average: bool = False
    ) -> None:
        """``average``: (experts(x) + shared(x)) / 2 (Cohere 2 MoE's "average" strategy)."""
        self.routed, self.shared, self.gate, self.average = routed, shared, gate, average
        self.tp = routed.tp

    @classmethod
    def from_weights(
        cls, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext
    ) -> SharedExpertMoE:
        p = prefix + model.moe_names[0]  # type: ignore[attr-defined]
        gated = model.config.family.routing is None  # DeepSeek's shared_experts: no gate
        name = "shared_expert." if gated else getattr(model, "moe_shared", "shared_experts.")
        shared = GatedMLP(ctx, w, p + name)
        if isinstance(shared.down, RowParallelLinear):  # its partial sum joins the experts'
            shared.down = shared.down.inner  # (no bias to add after the sum)
        gate = None
        if gated:
            name = p + "shared_expert_gate.weight"  # [1, hidden], replicated
            gate = ctx.linear(w[name], quantized=w.quantized([name]))
        average = model.config.family.shared_expert_average
        return cls(SparseMoE.from_weights(model, w, prefix, ctx), shared, gate, average)

    def linears(self) -> list[Linear]:
        gate = [] if self.gate is None else [self.gate]
        return [*self.routed.linears(), *self.shared.linears(), *gate]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared(x)
        if self.gate is not None:
            shared = torch.sigmoid(self.gate(x)) * shared
        out = self.routed.partial(x) + shared
        if self.average:  # (a sum of the ranks' parts: halved before or after, alike)
            out = out * 0.5
        return out if self.tp is None else self.tp.all_reduce(out)


def make_mlp(model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
    """Layer `index`'s MLP (`LlamaModel.make_mlp` of the models with experts): the experts,
    with the shared expert where the family has one, or a dense MLP."""
    f = model.config.family
    if f.has_experts(index) and f.shared_expert_intermediate_size:
        return SharedExpertMoE.from_weights(model, w, prefix, ctx)
    if f.has_experts(index):
        return SparseMoE.from_weights(model, w, prefix, ctx)
    return GatedMLP(ctx, w, prefix + "mlp.")


class MixtralModel(LlamaModel):
    """Llama attention (with Mistral's sliding window when set), experts in every layer."""

    moe_names = ("block_sparse_moe.", ("w1", "w3", "w2"))
    make_mlp = make_mlp


class Qwen3MoeModel(Qwen3Model):
    """Qwen3 attention; experts where `FamilyConfig.moe_layers` says (`decoder_sparse_step`,
    `mlp_only_layers`), a dense MLP of `intermediate_size` elsewhere."""

    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp


class Qwen2MoeModel(LlamaModel):
    """Qwen2 attention (q/k/v biases); where `FamilyConfig.moe_layers` says, the routed experts
    (softmax top-k, `norm_topk_prob`, weights rounded to the model's dtype as Qwen3-MoE's) with
    the shared expert beside them (`SharedExpertMoE`); a dense MLP elsewhere."""

    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp


class AriaTextModel(LlamaModel):
    """Aria's text model (`aria_config.py`): Llama's attention; in every layer the routed
    experts (softmax top-k renormalised: `FamilyConfig.routing`), stacked and stored
    transposed, beside the ungated `shared_experts` MLP (`SharedExpertMoE`)."""

    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))
    moe_router, moe_suffix, moe_transposed = "router.weight", "", True
    make_mlp = make_mlp
