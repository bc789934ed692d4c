"""GLM-5-Next (`Glm5NextForConditionalGeneration`, GLM-5.3-Flash: its text model, read text-only
from ``model.language_model.``; config read in `glm5_next_config.py`): Kimi Linear's hybrid
(`kimi_linear.py`: KDA layers among NoPE latent attention layers, DeepSeek-V3's router and
experts) with what transformers' ``modeling_glm5_next.py`` changes:

- **the indexed layers** (``indexed_attention``): GLM-5's DeepSeek Sparse Attention with no
  rotary at all (``qk_rope_head_dim`` 0: the cache row is the normed latent alone, the softmax
  scale qk_nope_head_dim ** -0.5) and its q bottleneck's and latent's norms at
  ``rms_norm_eps``. Its k-pool indexer scores pools of ``index_kpool`` tokens (a learned
  softmax mix of their indexer keys) and keeps the ``index_topk / index_kpool`` best whole
  pools and the query's own unfinished pool; "shared" layers reuse the previous layer's
  choice. While a sequence is shorter than ``index_topk + index_kpool`` that is every earlier
  token, which is all this serves: the context is capped there and a longer --max-model-len
  is refused in one line (`glm5_next_config.check_max_model_len`), so these layers attend
  densely through the attention backend and the indexer's weights are not read;
- **KDA with GLM's gates** (`Glm5NextDeltaAttention`): Kimi's low-rank forget gate
  (``forget_gate.f_a_proj`` / ``f_b_proj``, its ``A_log`` [H] and ``dt_bias`` [H K]) bounded as
  BailingHybrid's, ``g = linear_lower_bound * sigmoid(exp(A_log) (f + dt_bias))`` (float32; the
  unbounded gate of a null bound is refused), Kimi's low-rank output gate, the conv in
  float32 and its SiLU output rounded to the model's dtype (transformers keeps the conv so);
- **mHC hyper-connections** (`hyper_connection.py`, DeepSeek-V4's manifold-constrained form:
  ``pre``, ``post``, Sinkhorn-projected ``comb``) around every attention, KDA and MLP block,
  the residual ``hc_mult`` streams per token; the last streams folded by their plain mean (not
  DeepSeek-V4's weighted head) before the final norm;
- **every SwiGLU clamped**: ``silu(min(gate, L)) * clamp(up, -L, L)``, ``L = swiglu_limit``,
  in the dense MLPs, the shared expert and the routed experts (on CUDA the fused-MoE kernel's
  ``silu_limit``), computed in float32 and rounded once (transformers rounds in the model's
  dtype: the same in float32).

The KDA states live in the hybrids' state slots (prefix caching, chunked prefill and
preemption as Kimi Linear's); the streams live only within a step. Not supported (one line
each, `family_options`): tensor parallelism, ``--quantization fp8``, FP8 checkpoints, FP8/int8
KV caches, float16; a context past the indexer's dense reach.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.bailing_hybrid import BailingDeltaAttention
from pagoda.runtime.model.deepseek import DeepseekModel
from pagoda.runtime.model.delta_rule_config import conv_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.glm5_next_config import HC
from pagoda.runtime.model.hy_v4 import silu_limit_and_mul
from pagoda.runtime.model.hyper_connection import HyperConnection, expand
from pagoda.runtime.model.kimi_linear import KimiLinearLayer
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step
from pagoda.runtime.model.mamba2 import MAMBA_STEP
from pagoda.runtime.model.moe import SharedExpertMoE, make_mlp
from pagoda.runtime.recurrent_configs import MambaConfig


class Glm5NextDeltaAttention(BailingDeltaAttention):
    """One KDA layer (module docstring): Kimi's low-rank gates, BailingHybrid's bound and
    float32 conv."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, eps, ctx,
                 lower_bound: float):  # fmt: skip
        p = prefix + "self_attn."
        g = p + "forget_gate."
        self.m, self.index, self.eps, self.beta_scale = m, index, eps, 1.0
        dev, self.lower_bound, self.dtype = w.device, lower_bound, w.dtype
        # x's projections in one matmul: q k v (the conv's channels), f_a, g_a, b
        rows = [p + "q_proj", p + "k_proj", p + "v_proj", g + "f_a_proj", p + "g_a_proj",
                p + "b_proj"]  # fmt: skip
        self.in_proj = ctx.linear(torch.cat([w[n + ".weight"] for n in rows]).contiguous())
        self.f_b = ctx.linear(w[g + "f_b_proj.weight"])
        self.g_b = ctx.linear(w[p + "g_b_proj.weight"])
        self.out_proj = ctx.linear(w[p + "o_proj.weight"])
        parts = [w.source(n).float().to(dev) for n in conv_names(p, w)]  # float32 (`_conv32`)
        self.conv_weight = torch.cat(parts)[:, 0, :].contiguous()
        self.conv_fn = self._conv32
        self.rate = torch.exp(w.source(g + "A_log").float().reshape(-1, 1)).to(dev)  # [H, 1]
        self.dt_bias = w.source(g + "dt_bias").float().view(m.n_heads, m.head_dim).to(dev)
        self.norm = w.source(p + "o_norm.weight").float().to(dev)
        self.scale = m.d_state**-0.5
        self.sizes = [m.conv_dim, m.head_dim, m.head_dim, m.n_heads]

    def linears(self) -> list:
        return [self.in_proj, self.f_b, self.g_b, self.out_proj]

    def inputs(self, h: torch.Tensor):
        t, m = h.shape[0], self.m
        qkv, fa, ga, b = self.in_proj(h).split(self.sizes, dim=-1)
        beta = torch.sigmoid(b).float()
        f = self.f_b(fa).float().view(t, m.n_heads, m.head_dim) + self.dt_bias
        g = self.lower_bound * torch.sigmoid(self.rate * f)
        return qkv, self.g_b(ga), g, beta


class Glm5NextLayer(KimiLinearLayer):
    """Kimi Linear's layer (NoPE latent attention, or KDA) between two mHC hyper-connections."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        hc = model.config.family.hyper
        self.attn_hc, self.ffn_hc = (
            HyperConnection(hc, *(w.source(f"{prefix}{block}.{n}").to(w.device) for n in HC))
            for block in ("attn_hc", "ffn_hc")
        )

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> Glm5NextDeltaAttention:
        c = model.config
        bound = c.family.kda_lower_bound
        return Glm5NextDeltaAttention(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx, bound)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, None]:
        """The next streams [T, N, D] from the streams ``h`` (`residual`: unused, None)."""
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        post, comb, x = self.attn_hc(h)
        x = norm(x=x, weight=self.attn_norm, eps=eps)
        if self.mixer is not None:
            y = self.mixer(x, step.meta.aux[MAMBA_STEP])
        else:
            y = self.attention(x, step)
        h = self.attn_hc.merge(h, post, comb, y)
        post, comb, x = self.ffn_hc(h)
        y = self.mlp(norm(x=x, weight=self.mlp_norm, eps=eps))
        return self.ffn_hc.merge(h, post, comb, y), None


class Glm5NextModel(DeepseekModel):
    """GLM-5-Next's text model (module docstring): no rotary tables."""

    layer_class = Glm5NextLayer

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        return {}

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        """The dense MLP, or the routed and shared experts, each SwiGLU clamped."""
        mlp = make_mlp(self, w, prefix, index, ctx)
        limit = self.config.family.swiglu_limit
        if limit is None:
            return mlp

        def act(x: torch.Tensor) -> torch.Tensor:
            return silu_limit_and_mul(x, limit)

        if isinstance(mlp, SharedExpertMoE):
            mlp.routed.act_and_mul = act
            mlp.routed.fused_activation = dict(activation="silu_limit", limit=limit)
            mlp.shared.act_and_mul = act
        else:
            mlp.act_and_mul = act
        return mlp

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first streams: each token's embedding in every one [T, N, D]."""
        return expand(self.embed_tokens(input_ids), self.config.family.hyper.mult)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last streams' mean, then the final norm."""
        return self.rms_norm(x=h.mean(dim=1), weight=self.norm, eps=self.config.rms_norm_eps)
