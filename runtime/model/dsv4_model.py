"""DeepSeek-V4's whole model stepped over ragged batches against its paged caches, read from a
checkpoint's tensors (`dsv4_config`: config.json and the stored names), outside the engine (the
design: docs/runtime.md, "DeepSeek-V4 in the engine"; the engine runs it: `dsv4_engine`). Each layer: mHC (`hyper_connection`,
Sinkhorn) around `dsv4_layer.Dsv4Attention` and the MoE (hash-routed first layers by
``tid2eid[input_ids]``, then sqrtsoftplus + correction bias top-k; routed and shared experts'
SwiGLU clamped at ``swiglu_limit``), RMSNorms with float32 weights; the streams folded by
``hc_head``, the final norm, the LM head. The caller holds the layers' `Dsv4Cache` and hands
each step's `Batch`. Routed experts run expert by expert over their
tokens, or through the caller's runner (the engine's fused-MoE path: `dsv4_engine`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from pagoda.runtime.model.dsv4_attention import rms
from pagoda.runtime.model.dsv4_config import CSA, Dsv4Config
from pagoda.runtime.model.dsv4_layer import Batch, Dsv4Attention, Dsv4Cache
from pagoda.runtime.model.hy_v4 import silu_limit_and_mul
from pagoda.runtime.model.hyper_connection import HyperConnection, HyperHead, expand
from pagoda.runtime.model.moe_routing import GroupedRouter, HashRouter
from pagoda.runtime.model_configs import ExpertRouting

HC = ("fn", "base", "scale")
# (x [T, hidden], weights float32 [T, k], ids [T, k]) -> the routed experts' weighted sum
Experts = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None
Reduce = Callable[[torch.Tensor], torch.Tensor] | None  # the tensor-parallel ranks' sum


class Dsv4Moe:
    """Layer ``i``'s experts (module docstring); weights by `dsv4_config.canonical` names."""

    def __init__(
        self,
        c: Dsv4Config,
        i: int,
        w: Mapping[str, torch.Tensor],
        run_experts: Experts = None,
        reduce: Reduce = None,
    ) -> None:
        """``run_experts``: (x, weights, ids) -> the routed experts' sum (the engine's
        `moe.SparseMoE.run_experts`: the fused kernel on CUDA); None: expert by expert here.
        ``reduce``: the sum over tensor-parallel ranks of the experts' and shared expert's
        output, each rank holding its share of their width (`dsv4_shard`)."""
        p, e = f"model.layers.{i}.mlp.", c.num_experts
        routing = ExpertRouting(scoring=c.scoring, topk_method="greedy", n_group=1, topk_group=1,
                                routed_scaling_factor=c.routed_scaling_factor)  # fmt: skip
        gate = w[p + "gate.weight"].float()

        def linear(x):
            return F.linear(x, gate)

        self.hashed = c.mlp_layer_types[i] == "hash_moe"
        if self.hashed:
            self.router = HashRouter(linear, w[p + "gate.tid2eid"], routing)
        else:
            bias = w[p + "gate.e_score_correction_bias"]
            self.router = GroupedRouter(
                linear, bias, routing, c.experts_per_token, c.norm_topk_prob
            )
        self.run_experts = run_experts
        x = p + "experts."
        if run_experts is None:
            self.w13 = torch.stack([torch.cat([w[f"{x}{j}.gate_proj.weight"], w[f"{x}{j}.up_proj.weight"]])
                                    for j in range(e)])  # fmt: skip
            self.w2 = torch.stack([w[f"{x}{j}.down_proj.weight"] for j in range(e)])
        s = p + "shared_experts."
        self.s13 = torch.cat([w[s + "gate_proj.weight"], w[s + "up_proj.weight"]])
        self.s2 = w[s + "down_proj.weight"]
        self.limit = c.swiglu_limit if c.swiglu_limit is not None else float("inf")
        self.reduce = reduce

    def __call__(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.partial(x, input_ids)
        return out if self.reduce is None else self.reduce(out)

    def partial(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """The routed and shared experts' output (tensor parallel: this rank's part)."""
        weights, ids = self.router(x, input_ids) if self.hashed else self.router(x)
        shared = F.linear(silu_limit_and_mul(F.linear(x, self.s13), self.limit), self.s2)
        if self.run_experts is not None:
            return self.run_experts(x, weights, ids) + shared
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():  # each picked expert over its tokens
            tok, slot = (ids == e).nonzero(as_tuple=True)
            h = silu_limit_and_mul(F.linear(x[tok], self.w13[e]), self.limit)
            y = F.linear(h, self.w2[e]) * weights[tok, slot, None].to(x.dtype)
            out.index_add_(0, tok, y)
        return out + shared


class Dsv4Model:
    """The model of `c` from tensors ``w`` (`dsv4_config.check_headers`' canonical names)."""

    def __init__(
        self,
        c: Dsv4Config,
        w: Mapping[str, torch.Tensor],
        experts: Callable[[int], Experts] | None = None,
        reduce: Reduce = None,
    ) -> None:
        """``experts``: layer i -> its routed experts' runner (`Dsv4Moe`); None: the loop.
        ``reduce``: where ``w`` holds a tensor-parallel rank's share (`dsv4_shard`), the ranks'
        sum of the attention's output projection and of the experts (the caller then sets
        `embed` and the LM head to its vocabulary-parallel ones)."""
        self.c, self.w = c, w
        table = w["model.embed_tokens.weight"]
        self.embed: Callable[[torch.Tensor], torch.Tensor] = lambda ids: F.embedding(ids, table)
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            attn_w = {k[len(p) + 10 :]: v for k, v in w.items() if k.startswith(p + "self_attn.")}
            self.layers.append((
                HyperConnection(c.hyper, *(w[f"{p}attn_hc.{n}"] for n in HC)),
                w[p + "input_layernorm.weight"].float(), Dsv4Attention(c, i, attn_w, reduce),
                HyperConnection(c.hyper, *(w[f"{p}ffn_hc.{n}"] for n in HC)),
                w[p + "post_attention_layernorm.weight"].float(),
                Dsv4Moe(c, i, w, None if experts is None else experts(i), reduce),
            ))  # fmt: skip
        self.head = HyperHead(c.hyper, *(w[f"model.hc_head.hc_{n}"] for n in HC))
        self.lm_head = w["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]

    def new_caches(self, blocks: int, block_size: int, dtype: torch.dtype) -> list[Dsv4Cache]:
        """Each layer's empty rows and entry tables (``block_size`` a multiple of the rates)."""
        c, out = self.c, []
        for kind, rate in zip(c.layer_types, c.compress_rates, strict=True):
            if rate and block_size % rate:
                raise ValueError(f"block_size {block_size} is not a multiple of the compress "
                                 f"rate {rate} (DeepSeek-V4)")  # fmt: skip
            per = block_size // rate if rate else 0
            d, di = c.head_dim, c.index_head_dim
            cache = Dsv4Cache(torch.zeros(blocks * block_size, d, dtype=dtype),
                              {"kv": torch.zeros(blocks, per, d, dtype=dtype),
                               "index": torch.zeros(blocks, per, di, dtype=dtype)})  # fmt: skip
            if kind == CSA:  # Ca tails: the last window's kv and gate rows (2 x 2 D wide)
                cache.tails = {"kv": torch.zeros(blocks, rate, 4 * d, dtype=dtype),
                               "index": torch.zeros(blocks, rate, 4 * di, dtype=dtype)}  # fmt: skip
            out.append(cache)
        return out

    def __call__(self, input_ids: torch.Tensor, b: Batch, caches: list[Dsv4Cache]) -> torch.Tensor:
        """The logits [T, vocab] of the step's tokens."""
        return F.linear(self.head_input(self.streams(input_ids, b, caches)), self.lm_head)

    def streams(self, input_ids: torch.Tensor, b: Batch, caches: list[Dsv4Cache]) -> torch.Tensor:
        """The last layer's hyper-connected streams [T, hc_mult, hidden] of the step's tokens."""
        eps = self.c.rms_norm_eps
        streams = expand(self.embed(input_ids), self.c.hyper.mult)
        for (ahc, anorm, attn, fhc, fnorm, moe), cache in zip(self.layers, caches, strict=True):
            post, comb, x = ahc(streams)
            streams = ahc.merge(streams, post, comb, attn(rms(x, eps, anorm), b, cache))
            post, comb, x = fhc(streams)
            streams = fhc.merge(streams, post, comb, moe(rms(x, eps, fnorm), input_ids))
        return streams

    def head_input(self, streams: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: the streams folded (``hc_head``), then the final norm."""
        return rms(self.head(streams), self.c.rms_norm_eps, self.w["model.norm.weight"].float())
