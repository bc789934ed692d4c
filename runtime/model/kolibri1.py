"""Kolibri 1 (`Kolibri1ForCausalLM`; its config in `kolibri1_config.py`): GLM-4.5's model
(`glm4_moe.Glm4MoeModel`: DeepSeek's routed experts beside the ungated shared ones; the router
`moe_routing.GroupedRouter` with the bias on the logits) with GLM-4's layer (`glm4.Glm4Layer`:
norms on attention's and the MLP's outputs) and Qwen3's per-head q/k norms (`qwen3.Qwen3Layer`);
the window layers rotate, the full ones are NoPE (`FamilyConfig.rope_layers`).

Kolibri 1.1 (`Kolibri11Model`; `kolibri1_config.py`): its indexed layers (Kolibri 1's full ones)
round their keys and values to NVFP4 before the cache (`nvfp4_round`); a KV-shared layer has
q_proj and q_norm alone and reads its source layer's cache (`layer_caches`) and this step's keys
and values (handed on by the source layer, `step_kv`) without writing; dense MLPs in
`mlp_only_layers`. An indexed layer attends to every key through the attention backend while no
sequence of the step is longer than `Kolibri11.budget`; past it the whole step selects
(`TokenSelection`, transformers' `Kolibri1_1Indexer.select_tokens`), batched in torch over
`dsa.index_plan`'s padded ``[B, Q]`` queries: the context's keys and values gathered through the
block tables (`AttentionBackend.read_kv`), each query's score for key j the ReLU'd products of
its first `index_heads` heads (NVFP4) with key head 0 (NVFP4), summed head by head in float32,
times ``head_dim ** -0.5 / index_heads``; the `topk` best keys between the `sinks` first and the
`local` last (ties to the earlier key, as transformers' ``top_k_mask``), with those; its heads
attend to the kept keys only (float32 softmax). The pool the best are picked from
(`TokenSelection.pool`, transformers' ``select_pool``): every visible key up to
`index_pool_size` keys; past it the `index_layers` layers pick the best blocks of
`index_compression` keys by their means of the keys before NVFP4 rounding (kept per KV slot
in the `raw_keys` table beside the cache of the layers they read, each block's NVFP4 mean
computed once, by the step whose token ends it, into their `pools` table: `side_tables`),
the unfinished block competing with a zero score; the indexed layers after one reuse its pool (`meta.aux`).

Tensor parallelism: GLM-4.5's split (Kolibri 1's); a KV-shared layer reads its source's cache
rows of the rank's KV heads; rank 0 picks each indexed layer's pool and kept keys (its heads
include key head 0 and the `index_heads` query heads, `kolibri1_config.tp_problem`; the raw
keys' and pools' tables on rank 0 alone) and broadcasts the kept keys."""

from __future__ import annotations

import torch
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsa import MAX_SCORE_ELEMS, index_plan
from pagoda.runtime.model.glm4 import Glm4Layer
from pagoda.runtime.model.glm4_moe import Glm4MoeModel
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step
from pagoda.runtime.model.qwen3 import Qwen3Layer
from pagoda.runtime.model.side_tables import PoolTable, SlotTable


def nvfp4_round(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded to NVFP4 and back, as transformers' `nvfp4_fake_quantize`: per 16 values of
    the last dim an E4M3 scale (amax / 6), E2M1 magnitudes (steps 0.5 / 1 / 2 below 2 / 4 / 6),
    rounded to nearest-even."""
    blocks = x.float().unflatten(-1, (-1, 16))
    scale = (blocks.abs().amax(-1, keepdim=True) / 6).clamp(2**-9, 448)
    scale = scale.to(torch.float8_e4m3fn).float()
    scaled = blocks / scale
    magnitude = scaled.abs().clamp(max=6)
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    rounded = torch.round(magnitude / step) * step
    return (rounded.copysign(scaled) * scale).flatten(-2).to(x.dtype)


POOL = "kolibri_pool"  # `meta.aux`: the step's last pool [B, Q, K] (`TokenSelection.pool`)


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` highest finite scores of each row; ties go to the lowest indices (transformers'
    ``Kolibri1_1Indexer.top_k_mask``)."""
    k = min(k, scores.shape[-1])
    kth = scores.topk(k, dim=-1).values[..., -1:]
    above = scores > kth
    tied = (scores == kth) & (kth > float("-inf"))
    free = k - above.sum(-1, keepdim=True)
    return above | (tied & (tied.cumsum(-1, dtype=torch.int32) <= free))


class TokenSelection:
    """An indexed layer's sparse attention past `Kolibri11.budget` (module docstring). On
    tensor-parallel ranks rank 0 selects (it holds key head 0 and the `index_heads` query heads:
    `kolibri1_config.tp_problem`), its kept keys broadcast to the others, each rank's heads
    attending to them."""

    def __init__(self, k11, head_dim: int, scale: float, tp=None) -> None:
        self.k11, self.scale, self.tp = k11, scale, tp
        self.head_weight = head_dim**-0.5 / k11.index_heads

    def score(self, routing: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``sum_h relu(q_h . k)`` x the head weight [..., K], head by head in float32 (as
        transformers sums them): ``routing`` [..., n, D], ``keys`` [B, D, K]."""
        scores = torch.matmul(routing[..., 0, :], keys).relu_()
        for i in range(1, self.k11.index_heads):
            scores += torch.matmul(routing[..., i, :], keys).relu_()
        return scores.mul_(self.head_weight)

    def pool(self, routing: torch.Tensor, pools, plan) -> torch.Tensor:
        """Each query's pool [B, Q, K] (transformers' ``select_pool``): past `pool_size` keys,
        the `pool_size / compression` blocks of `compression` keys whose mean (of the keys
        before their NVFP4 rounding; NVFP4 itself: ``pools``, the `PoolTable` of those means)
        scores best, the query's unfinished block competing with a zero score (ties to the
        earlier block); else every visible key."""
        c, size = self.k11, self.k11.compression
        kp, dev = plan.slots.shape[1], plan.slots.device
        nb = kp // size
        means = pools.gather(plan.slots, nb).float()  # [B, NB, D]
        scores = self.score(routing, means.transpose(1, 2))  # [B, Q, NB]
        scores = torch.nn.functional.pad(scores, (0, 1))
        blocks = torch.arange(nb + 1, device=dev)
        seen = plan.q_pos + 1  # [B, Q, 1]
        scores = torch.where(blocks < seen // size, scores, 0.0)
        scores.masked_fill_(blocks >= (seen + size - 1) // size, float("-inf"))
        chosen = top_k_mask(scores, c.pool_size // size).repeat_interleave(size, dim=-1)
        pos = torch.arange(kp, device=dev)
        visible = pos <= plan.q_pos
        return visible & (chosen[..., :kp] | (seen <= c.pool_size))

    def attend(self, q: torch.Tensor, k_cache, v_cache, meta: AttentionMetadata, backend,
               pools, source: bool):  # fmt: skip
        """Each query's heads ``q`` [T, H, D] over its kept keys of the cache → [T, H, D]; its
        pool a new one (``source``: an `index_layers` layer's, from ``pools``, the block means'
        `PoolTable`) or the step's last one."""
        plan = index_plan(meta)
        keys, values = backend.read_kv(k_cache, v_cache, plan.slots)  # [B, K, Hkv, D]
        qp, width = plan.q_rows.shape[1], min(self.k11.budget, plan.slots.shape[1])
        if self.tp is None or self.tp.rank == 0:
            kept, real = self.select(q, keys, meta, plan, pools, source)
        if self.tp is not None:  # rank 0's choice on every rank (-1: padding)
            shared = (kept.masked_fill(~real, -1) if self.tp.rank == 0 else
                      q.new_empty((q.shape[0], width), dtype=torch.long))  # fmt: skip
            shared = self.tp.broadcast(shared)
            kept, real = shared.clamp(min=0), shared >= 0
        return self._attend(q, keys, values, plan.src // qp, kept, real)

    def select(self, q, keys, meta: AttentionMetadata, plan, pools, source: bool):
        """(kept [T, w], real [T, w]): each query's kept keys (at most the budget `w`) and
        which of them are not padding."""
        c = self.k11
        b, qp = plan.q_rows.shape
        kp = plan.slots.shape[1]
        routing_keys = nvfp4_round(keys[:, :, 0]).float().transpose(1, 2)  # [B, D, K]
        routing = nvfp4_round(q[:, : c.index_heads]).float()[plan.q_rows]  # [B, Q, n, D]
        pool = None
        if kp > c.pool_size and source:
            pool = meta.aux[POOL] = self.pool(routing, pools, plan)
        elif kp > c.pool_size:
            pool = meta.aux[POOL]
        pos = torch.arange(kp, device=q.device)
        width = min(c.budget, kp)
        kept = torch.empty(b, qp, width, dtype=torch.long, device=q.device)
        real = torch.empty(b, qp, width, dtype=torch.bool, device=q.device)
        n = max(1, MAX_SCORE_ELEMS // (b * kp))
        for r0 in range(0, qp, n):  # row slices bound the [B, n, K] scores
            r1 = min(r0 + n, qp)
            scores = self.score(routing[:, r0:r1], routing_keys)
            last = plan.q_pos[:, r0:r1]  # [B, n, 1]
            visible = pos <= last if pool is None else pool[:, r0:r1]
            local = pos > last - c.local
            sinks = pos < c.sinks
            chosen = top_k_mask(scores.masked_fill_(~(visible & ~sinks & ~local),
                                                    float("-inf")), c.topk)  # fmt: skip
            short = last < c.budget  # a query seeing no more keys than the budget: all of them
            sel = (pos <= last) & (chosen | sinks | local | short)
            top = sel.to(torch.float32).topk(width, dim=-1)  # its (at most `width`) keys
            kept[:, r0:r1], real[:, r0:r1] = top.indices, top.values > 0
        return kept.view(b * qp, width)[plan.src], real.view(b * qp, width)[plan.src]

    def _attend(self, q, keys, values, batch, kept, real) -> torch.Tensor:
        """Softmax attention of each token [T, H, D] (of sequence ``batch`` [T]) over its kept
        keys ``kept`` [T, w] (``real``: not padding), the softmax in float32, in token slices."""
        t, h, d = q.shape
        hkv = keys.shape[2]
        out = q.new_empty(t, h, d)
        n = max(1, MAX_SCORE_ELEMS // (kept.shape[1] * h * d))
        for t0 in range(0, t, n):
            t1 = min(t0 + n, t)
            seq, idx = batch[t0:t1, None], kept[t0:t1]
            k, v = keys[seq, idx], values[seq, idx]  # [n, w, Hkv, D]
            qg = q[t0:t1].view(t1 - t0, hkv, h // hkv, d)
            s = torch.einsum("tkgd,twkd->tkgw", qg, k.to(q.dtype)).float() * self.scale
            s.masked_fill_(~real[t0:t1, None, None, :], float("-inf"))
            p = torch.softmax(s, dim=-1).to(q.dtype)
            out[t0:t1] = torch.einsum("tkgw,twkd->tkgd", p, v.to(q.dtype)).reshape(-1, h, d)
        return out


# the published tensor names -> the ones the model reads (transformers' conversion mapping)
_RENAMES = (
    (".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias"),
    (".post_attn_norm.weight", ".post_self_attn_layernorm.weight"),
    (".post_ffn_norm.weight", ".post_mlp_layernorm.weight"),
)


class Kolibri1Layer(Glm4Layer, Qwen3Layer):
    """GLM-4's `__call__` and post-sublayer norms, Qwen3's q/k norms before rotary."""


class Kolibri1Model(Glm4MoeModel):
    layer_class = Kolibri1Layer


class Kolibri11Layer(Glm4Layer):
    """GLM-4's layer with Qwen3's q/k norms (the k norm and k/v projections: its own layers'),
    NVFP4 keys and values on the indexed layers, or a KV-shared layer's attention."""

    # a source layer's keys and values of this step (NVFP4), what its KV-shared layers read
    step_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    source: Kolibri11Layer | None = None  # a KV-shared layer's source (`Kolibri11Model`)
    # key head 0 before NVFP4 rounding per KV slot (its pool's block means), on the layers the
    # pool layers pick from (`side_tables.SlotTable`)
    raw_keys: SlotTable | None = None
    pools: PoolTable | None = None  # their finished blocks' NVFP4 means
    raw_step: torch.Tensor | None = None  # this step's [T, D]

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        k = model.config.family.kolibri11
        self.shared = k.shares_kv(index)
        super().__init__(model, w, prefix, index, ctx)
        a = prefix + "self_attn."
        self.q_norm = model.norm_weight(w[a + "q_norm.weight"])
        self.k_norm = None if self.shared else model.norm_weight(w[a + "k_norm.weight"])
        self.indexed = model.config.family.window(index) is None  # (no window: indexed)
        self.selection = TokenSelection(k, ctx.head_dim, ctx.backend.scale, ctx.tp)
        self.pool_source = k.pool_layers[index]  # (an `index_layers` layer: a new pool)
        rank0 = ctx.tp is None or ctx.tp.rank == 0  # (rank 0 alone selects: its tables)
        keeper = index in {k.kv_source[i] for i, p in enumerate(k.pool_layers) if p}
        if rank0 and keeper and not self.shared:
            self.raw_keys = SlotTable(ctx.head_dim)
            self.pools = PoolTable(k.compression, ctx.head_dim)  # each finished block's mean
            self.side_tables = [self.raw_keys, self.pools]
        # an FP8 cache's scales: those it was written with (the source layer's)
        self.kv_scales = model.kv_scales(w, f"model.layers.{k.kv_source[index]}.self_attn")

    def projections(self, model: LlamaModel, index: int) -> tuple[str, ...]:
        return ("q_proj",) if self.shared else super().projections(model, index)

    before_rotary = Qwen3Layer.before_rotary  # each head's q and k normed on its own

    def step_qkv(self, x: torch.Tensor, step: Step):
        q, k, v = self.qkv_heads(x)
        if self.indexed:
            v = nvfp4_round(v)
            self.step_kv = (k, v)  # (k rounded in `after_rotary`)
        return q, k, v

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.indexed:
            return q, k
        self.raw_step = k[:, 0]
        k = nvfp4_round(k)
        self.step_kv = (k, self.step_kv[1])
        return q, k

    def store_raw(self, step: Step, cache: torch.Tensor) -> None:
        """This step's raw key head 0 into the table that goes with the layer's KV ``cache``
        (a new cache gets a new table), where a pool layer reads it."""
        if self.raw_keys is None:
            return
        ctx, meta = self.ctx, step.meta
        slots = cache.numel() // (ctx.num_kv_heads * ctx.head_dim)
        self.raw_keys.bind(cache, slots, self.raw_step.dtype)
        self.raw_keys.write(meta.slot_mapping, self.raw_step)
        self.pools.bind(cache, slots, self.raw_step.dtype, meta.block_size)
        self.pools.close(meta, self._block_means)

    def _block_means(self, slots: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The NVFP4 mean [N, D] of the raw keys of each block of cache ``slots`` [N, size]
        (float32, as `TokenSelection.pool` scores it)."""
        size = self.pools.size
        return nvfp4_round(self.raw_keys.rows[slots].float().sum(1) / size)

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        meta = step.meta
        sparse = self.indexed and meta.max_seq_len > self.selection.k11.budget
        k_cache, v_cache = step.kv_caches[self.index]  # (a KV-shared layer's: its source's)
        if not (self.shared or sparse):
            out = super().attention(x, step)
            if self.indexed:
                self.store_raw(step, k_cache)
            return out
        ctx = self.ctx
        t, d, h = x.shape[0], ctx.head_dim, ctx.num_heads
        if self.shared:
            norm, eps = ctx.rms_norm, ctx.eps
            q = norm(x=self.qkv(x).view(t * h, d), weight=self.q_norm, eps=eps).view(t, h, d)
            k, v = self.source.step_kv
        else:  # (an indexed layer: NoPE, no rotary)
            q, k, v = self.step_qkv(x, step)
            q, k = self.after_rotary(*self.before_rotary(q, k))
        if sparse:
            if not self.shared:
                ctx.backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
                self.store_raw(step, k_cache)
            table = (self.source if self.shared else self).pools
            out = self.selection.attend(q, k_cache, v_cache, meta, ctx.backend, table,
                                        self.pool_source)  # fmt: skip
        else:
            out = ctx.backend.forward(
                q, k, v, k_cache, v_cache, meta, window=None, kv_scales=self.kv_scales,
                store=False,
            )  # fmt: skip
        return self.o_proj(out.reshape(t, h * d))


class Kolibri11Model(Kolibri1Model):
    layer_class = Kolibri11Layer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        sources = config.family.kolibri11.kv_source
        for i, layer in enumerate(self.layers):
            if layer.shared:
                layer.source = self.layers[sources[i]]

    def layer_caches(self, caches: list) -> list:
        """Each layer's (k_cache, v_cache): its own, or its source layer's."""
        sources, own, out = self.config.family.kolibri11.kv_source, iter(caches), []
        for i, s in enumerate(sources):
            out.append(out[s] if s != i else next(own))
        return out
