"""DeepSeek-V2 and DeepSeek-V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`: V2-Lite,
V3, R1, V3.1, Kimi K2, Moonlight): multi-head latent attention (MLA) and DeepSeek's experts.

**Attention** (`model_configs.MlaConfig`), as transformers computes it: q from ``q_proj`` (V2-Lite) or
``q_b_proj(norm(q_a_proj(x)))``; ``kv_a_proj_with_mqa(x)`` splits into a latent of
``kv_lora_rank``, normed and expanded per head by ``kv_b_proj`` into the key's unrotated part
(``qk_nope_head_dim``) and the value (``v_head_dim``), and one rotary key (``qk_rope_head_dim``)
shared by every head. Rotary turns the last ``qk_rope_head_dim`` dims of q and k only; V2 (its
complex rotary) and V3 with ``rope_interleave`` pair dims (0, 1), (2, 3), ...: those dims are
de-interleaved first (q and k alike, so every q . k is the same) and rotated as every other
model's. The softmax scale is qk_head_dim ** -0.5, times yarn's mscale(mscale_all_dim) squared
(`FamilyConfig.attention_multiplier`, read by `deepseek_config`).

**The latent cache and absorbed attention** (vLLM's and SGLang's MLA): a layer caches one row
per token, the normed latent then the rotated shared key (``kv_lora_rank + qk_rope_head_dim``
values, 512 + 64 on V3), one KV head shared by every head, K and V one tensor
(`attention/base.py`, ``latent``): DeepSeek-V3 in bf16 caches 61 x 576 x 2 bytes = 68.6 KiB
per token (expanded per head, as this engine used to, 5.7 MiB: 85x), V2-Lite 30.4 KiB (324).
kv_b_proj is split at load into W_UK (the key's unrotated part) and W_UV (the value), per head,
and never applied to the cache: each head's query is ``[q_nope @ W_UK | q_rope]`` (576 wide),
scored against the rows as they are (q_nope . (W_UK c) = (q_nope W_UK) . c), the softmax mixes
the rows' latents (their first 512 columns, no separate V) and ``mix @ W_UV^T`` is the head's
value, then o_proj. Every row takes this form, prefill chunks too: one path keeps a row's bits
independent of chunking and the prefix cache (`attention/torch_backend.py`), though expanding
the context per head for prefill (vLLM's) does fewer FLOPs (docs/benchmarks.md measures it).

q_a_proj and kv_a_proj_with_mqa (or q_proj and kv_a_proj_with_mqa) read the same input and run
as one matmul.

**Tensor parallelism** splits the heads, as vLLM does: each rank holds its heads' rows of q_proj
or q_b_proj and of kv_b_proj (its W_UK and W_UV) and their columns of o_proj (summed by the
all-reduce), while the bottleneck, the latent projection and their norms are every head's and
held whole on every rank (the latent is computed, and cached whole, on each); the experts and
shared experts split by width (`moe.py`).

**Experts**: dense MLPs in the first ``first_k_dense_replace`` layers, then routed experts
(`moe.SparseMoE`, the fused kernel on CUDA) picked by `moe_routing.GroupedRouter`, plus an
ungated shared MLP of ``moe_intermediate_size x n_shared_experts`` (`moe.SharedExpertMoE`).
"""

from __future__ import annotations

import math

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import build_cos_sin_cache, check_rope_context
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.model_configs import MlaConfig


class DeepseekLayer(LlamaLayer):
    """Llama's residual layer around latent attention and DeepSeek's MLP (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c, a = model.config, prefix + "self_attn."
        m: MlaConfig = c.family.mla
        self.ctx, self.index, self.mla = ctx, index, m
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        first = "q_a_proj" if m.q_lora_rank is not None else "q_proj"
        # q's first projection and the latent's read the same x: one matmul
        names = [f"{a}{first}.weight", f"{a}kv_a_proj_with_mqa.weight"]
        q_width = m.q_lora_rank or ctx.num_heads * m.qk_head_dim  # (this rank's heads)
        self.a_sizes = [q_width, m.kv_lora_rank, m.qk_rope_head_dim]
        h0 = 0 if ctx.tp is None else ctx.tp.layout.heads(c.num_heads)[0]
        heads = (h0, h0 + ctx.num_heads)  # this rank's (module docstring)

        def by_heads(name: str, width: int):  # rows of `width` per head: this rank's heads'
            if ctx.tp is None:
                return linear_layer(ctx, w, [name])
            return column_linear(ctx, w, [name], [(heads[0] * width, heads[1] * width)])

        latent = (0, m.kv_lora_rank + m.qk_rope_head_dim)
        self.kv_a = None  # apart only where q_proj has no bias and the latent has one
        if m.q_lora_rank is None and a + "kv_a_proj_with_mqa.bias" in w:
            self.qkv_a = by_heads(names[0], m.qk_head_dim)
            self.kv_a = linear_layer(ctx, w, names[1:]) if ctx.tp is None else column_linear(
                ctx, w, names[1:], [latent])  # fmt: skip
        elif ctx.tp is None:
            self.qkv_a = linear_layer(ctx, w, names)
        elif m.q_lora_rank is None:  # this rank's heads of q_proj, the whole latent
            self.qkv_a = column_linear(ctx, w, names, [(heads[0] * m.qk_head_dim,
                                                        heads[1] * m.qk_head_dim), latent])  # fmt: skip
        else:  # replicated: the bottleneck and the latent are every head's
            self.qkv_a = column_linear(ctx, w, names, [(0, m.q_lora_rank), latent])
        self.q_norm = self.q_b = None
        if m.q_lora_rank is not None:
            self.q_norm = w[a + "q_a_layernorm.weight"]
            if m.dots:  # Dots3 Note's scale of the normed bottleneck, in the norm's weight
                self.q_norm = self.q_norm * math.sqrt(c.hidden_size / m.q_lora_rank)
            # (with A.X-K2's output gate, each head's query then its gate: `project`)
            self.q_b = by_heads(a + "q_b_proj.weight", m.qk_head_dim + m.output_gate * m.v_head_dim)
        self.kv_norm = w[a + "kv_a_layernorm.weight"]
        self.k_rope_norm = self.g_proj = None
        if m.dots:  # the latent's scale; the rotary key's norm; the gate per head
            self.kv_norm = self.kv_norm * math.sqrt(c.hidden_size / m.kv_lora_rank)
            self.k_rope_norm = w[a + "k_rope_only_layernorm.weight"]
            self.g_proj = by_heads(a + "g_proj.weight", 1)
        self.w_uk, self.w_uv = absorbed(w, a, m, heads)
        o = a + "o_proj.weight"  # input columns by heads (an even share), summed over ranks
        self.o_proj = linear_layer(ctx, w, [o]) if ctx.tp is None else row_linear(ctx, w, o)
        self.kv_scales = model.kv_scales(w, a.rstrip("."))
        self.window = None
        self.rope = "global"
        self.interleaved = m.rope_interleave  # rotary dims de-interleaved first (docstring)
        self.mlp = model.make_mlp(w, prefix, index, ctx)

    def linears(self):
        apart = [x for x in (self.kv_a, self.q_b, self.g_proj) if x is not None]
        return [self.qkv_a, *apart, self.o_proj, *self.mlp.linears()]

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """Absorbed latent attention (module docstring): per head, the query's unrotated part
        times W_UK is scored against the cached latent, its rotary part against the shared
        rotary key; the output, a mix of latents, is turned into the value by W_UV."""
        q_full, k_full, _, gate = self.project(x, step)
        k_cache, v_cache = step.kv_caches[self.index]
        out = self.ctx.backend.forward(  # [t, h, c]: each head's mix of latents
            q_full, k_full, k_full, k_cache, v_cache, step.meta, window=None,
            kv_scales=self.kv_scales,
        )  # fmt: skip
        return self.values(out, gate)

    def project(
        self, x: torch.Tensor, step: Step, extra: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(q_full ``[t, h, c + r + extra]``, k_full ``[t, 1, c + r + extra]``, the normed q
        bottleneck or None, the output gate ``[t, h, v_head_dim]`` or None): the query ``[q_nope
        @ W_UK | q_rope]`` and the cache row ``[normed latent | k_rope]``, rotated; ``extra``
        columns after them (q's zero, k's unset: the sparse attention's indexer key,
        model/dsa.py). A.X-K2's q_b_proj reads the normed bottleneck beside the raw one and
        gives each head its query and its gate (`MlaConfig.output_gate`); Dots3 Note's gate is
        ``g_proj(x)``, one per head ``[t, h, 1]``, its rotary key normed before rotary and its
        bottleneck and latent scaled (in their norms' weights: `MlaConfig.dots`)."""
        ctx, m = self.ctx, self.mla
        t, h = x.shape[0], ctx.num_heads
        n, r, c = m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
        if self.kv_a is None:
            q, latent, k_pe = self.qkv_a(x).split(self.a_sizes, dim=-1)
        else:
            q, (latent, k_pe) = self.qkv_a(x), self.kv_a(x).split(self.a_sizes[1:], dim=-1)
        bottleneck = gate = None
        if self.q_b is not None:
            bottleneck = ctx.rms_norm(x=q.contiguous(), weight=self.q_norm, eps=m.norm_eps)
            q = self.q_b(torch.cat([bottleneck, q], dim=-1) if m.output_gate else bottleneck)
        if m.output_gate:
            q, gate = q.view(t, h, n + r + m.v_head_dim).split([n + r, m.v_head_dim], dim=-1)
        q = q.view(t, h, n + r)
        # the query and the cache row: [q_nope @ W_UK | q_rope] and [normed latent | k_rope]
        q_full = x.new_empty(t, h, c + r + extra)
        if extra:
            q_full[..., c + r :] = 0
        q_full[..., :c] = torch.bmm(q[..., :n].transpose(0, 1), self.w_uk).transpose(0, 1)
        k_full = x.new_empty(t, 1, c + r + extra)
        k_full[:, 0, :c] = ctx.rms_norm(x=latent.contiguous(), weight=self.kv_norm, eps=m.norm_eps)
        if self.k_rope_norm is not None:  # (in the checkpoint's layout, before de-interleaving)
            k_pe = ctx.rms_norm(x=k_pe.contiguous(), weight=self.k_rope_norm, eps=m.norm_eps)
        if self.g_proj is not None:  # [t, h, 1]: one gate per head
            gate = self.g_proj(x).unsqueeze(-1)
        q_rot, k_rot = q_full[..., c : c + r], x.new_empty(t, 1, r)
        _rotary_dims(q_rot, q[..., n:], self.interleaved)
        _rotary_dims(k_rot, k_pe.unsqueeze(1), self.interleaved)
        if self.rope is not None:  # (None: NoPE, the "rotary" dims as they are: Kimi Linear's)
            positions, rows = step.rope[self.rope]
            ctx.ops.rotary_embedding(positions=positions, q=q_rot, k=k_rot, cos_sin_cache=rows)
        k_full[..., c : c + r] = k_rot
        return q_full, k_full, bottleneck, gate

    def values(self, out: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output from each head's mix of latents ``out`` [t, h, c]: W_UV, times
        sigmoid(gate) where there is one (float32, as transformers), o_proj."""
        t, h = out.shape[:2]
        v = torch.bmm(out.transpose(0, 1), self.w_uv).transpose(0, 1)  # [t, h, v_head_dim]
        if gate is not None:
            v = (v * torch.sigmoid(gate.float())).to(v.dtype)
        return self.o_proj(v.reshape(t, h * self.mla.v_head_dim))


def _rotary_dims(dst: torch.Tensor, src: torch.Tensor, interleaved: bool) -> None:
    """``dst[...] = src``, de-interleaved when ``interleaved``: the even dims, then the odd ones
    (module docstring), in one strided copy."""
    if interleaved:
        dst, src = dst.unflatten(-1, (2, -1)), src.unflatten(-1, (-1, 2)).transpose(-1, -2)
    dst.copy_(src)


def absorbed(
    w: DeviceWeights, a: str, m: MlaConfig, heads: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's rows of heads ``heads`` split for the absorbed form, once at load: W_UK
    ``[h, qk_nope, kv_lora_rank]`` (q_nope @ W_UK is the query against the latent) and W_UV^T
    ``[h, kv_lora_rank, v_head_dim]`` (the attended latent @ W_UV^T is the value), contiguous
    for `torch.bmm`, in the model's dtype (the products accumulate in float32)."""
    name, width = a + "kv_b_proj.weight", m.qk_nope_head_dim + m.v_head_dim
    if a + "kv_b_proj.bias" in w:  # transformers' kv_b_proj has none (nor any checkpoint)
        raise ValueError(f"{a}kv_b_proj.bias: kv_b_proj has no bias in DeepSeek's attention")
    # llama.cpp's converter split it (gguf_deepseek.py): joined back
    whole = w[name] if name in w else kv_b_weight(w, a, m)
    per_head = whole.view(-1, width, m.kv_lora_rank)[heads[0] : heads[1]]
    w_uk = per_head[:, : m.qk_nope_head_dim].contiguous()
    w_uv = per_head[:, m.qk_nope_head_dim :].transpose(1, 2).contiguous()
    return w_uk, w_uv


def kv_b_weight(w: DeviceWeights, a: str, m: MlaConfig) -> torch.Tensor:
    """kv_b_proj [heads x (qk_nope + v), kv_lora_rank] from llama.cpp's split of it: k_b
    [heads, kv_lora_rank, qk_nope] (transposed) and v_b [heads, v, kv_lora_rank]."""
    k_b, v_b = w[a + "k_b_proj.weight"], w[a + "v_b_proj.weight"]
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, m.kv_lora_rank)


class DeepseekModel(LlamaModel):
    """DeepSeek-V2/V3 (module docstring)."""

    layer_class = DeepseekLayer
    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        c = self.config
        check_rope_context(c.rope_scaling, c.max_position_embeddings, max_positions)
        r = c.family.mla.qk_rope_head_dim
        cache = build_cos_sin_cache(r, c.rope_theta, c.rope_scaling, max_positions)
        return {"global": cache.to(self.device)}
