"""Kimi Linear (`KimiLinearForCausalLM`; config read in `kimi_linear_config.py`): DeepSeek-V3's
layer (`deepseek.DeepseekLayer`: latent attention, the grouped sigmoid router with its
correction bias and a shared expert) whose ``self_attn`` is, by layer, either

- latent attention with no rotary at all (the key's shared "rotary" part used as it is; the
  softmax scale qk_head_dim ** -0.5), cached as DeepSeek's latent rows; or
- Kimi Delta Attention (`KimiDeltaAttention`, transformers' `KimiLinearDeltaAttention`): q, k
  and v projections through a causal depthwise conv (SiLU; the published checkpoints' conv in
  three parts, q_conv1d, k_conv1d, v_conv1d, concatenated at load), q and k L2-normalised,
  beta = sigmoid(b_proj(x)), a log decay per key channel g = -exp(A_log[h]) softplus(
  f_b_proj(f_a_proj(x)) + dt_bias) [T, H, K], the delta rule of `kda.py` (chunked prefill in
  `gated_delta.prefill`'s packed layout, `kda.recurrent_step` for decode rows), then per head
  RMSNorm(o) * weight * sigmoid(g_b_proj(g_a_proj(x))) in float32 (`KimiLinearRMSNormGated`),
  o_proj.

The KDA layers keep a conv state [3 H K, kernel - 1] and a float32 state [H, K, K] per sequence
in the hybrids' state slots (`MambaConfig.mixer` "kda"), with prefix-caching snapshots as
Qwen3-Next's Gated DeltaNet (`qwen3_next.GatedDeltaNet`, whose step this reuses). The MLPs are
read as DeepSeek's (the published ``block_sparse_moe.`` and experts' w1, w2, w3 listed under
transformers' names at load: `kimi_linear_config.rename_mlps`). Tensor
parallelism and FP8 are refused (`distributed/layout.py`, `engine/core.check_dtype`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model import kda
from pagoda.runtime.model.deepseek import DeepseekLayer, DeepseekModel
from pagoda.runtime.model.delta_rule_config import conv_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.qwen3_next import GatedDeltaNet
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


class KimiDeltaAttention(GatedDeltaNet):
    """One KDA layer (module docstring): Qwen3-Next's step with a decay per key channel."""

    step_rule = staticmethod(kda.recurrent_step)
    chunk_rule = staticmethod(kda.chunked)

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, eps, ctx):
        p = prefix + "self_attn."
        self.m, self.index, self.eps, self.beta_scale = m, index, eps, 1.0
        k, dev = m.head_dim, w.device
        # x's projections in one matmul: q k v (the conv's channels), f_a, g_a, b
        rows = ("q_proj", "k_proj", "v_proj", "f_a_proj", "g_a_proj", "b_proj")
        self.in_proj = ctx.linear(torch.cat([w[f"{p}{n}.weight"] for n in rows]).contiguous())
        self.f_b = ctx.linear(w[p + "f_b_proj.weight"])
        self.g_b = ctx.linear(w[p + "g_b_proj.weight"])
        self.out_proj = ctx.linear(w[p + "o_proj.weight"])
        self.conv_weight = torch.cat([w[n] for n in conv_names(p, w)])[:, 0, :].contiguous()
        # float32 as transformers keeps them: -exp(A_log) [H, 1], dt_bias [H, K], the norm's weight
        self.A = -torch.exp(w.source(p + "A_log").float().reshape(-1, 1)).to(dev)
        self.dt_bias = w.source(p + "dt_bias").float().view(m.n_heads, k).to(dev)
        self.norm = w.source(p + "o_norm.weight").float().to(dev)
        self.scale = m.d_state**-0.5
        self.sizes = [m.conv_dim, k, k, m.n_heads]

    def linears(self) -> list:
        return [self.in_proj, self.f_b, self.g_b, self.out_proj]

    def inputs(self, h: torch.Tensor):
        t, m = h.shape[0], self.m
        qkv, fa, ga, b = self.in_proj(h).split(self.sizes, dim=-1)
        beta = torch.sigmoid(b).float()
        f = self.f_b(fa).float().view(t, m.n_heads, m.head_dim) + self.dt_bias
        return qkv, self.g_b(ga), self.A * F.softplus(f), beta  # (softplus: x above 20)

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """weight * RMSNorm(o) * sigmoid(z) per head in float32, rounded once."""
        t, dtype = o.shape[0], o.dtype
        y = o.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.norm * y * torch.sigmoid(z.float().view(t, *o.shape[1:]))
        return y.to(dtype).view(t, -1)


class KimiLinearLayer(RecurrentLayer, DeepseekLayer):
    """DeepSeek's layer with NoPE latent attention, or KDA in its place (module docstring;
    `recurrent_layer.RecurrentLayer`)."""

    mixer: KimiDeltaAttention | None = None

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        if self.mixer is None:
            self.rope, self.interleaved = None, False  # NoPE

    def read_layer_norm(self, model: LlamaModel, w: DeviceWeights, name: str) -> torch.Tensor:
        return w[name]  # as stored, as DeepSeek's layer reads its norms

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> KimiDeltaAttention:
        c = model.config
        return KimiDeltaAttention(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx)


class KimiLinearModel(DeepseekModel):
    """Kimi Linear (module docstring): no rotary tables."""

    layer_class = KimiLinearLayer

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        return {}
