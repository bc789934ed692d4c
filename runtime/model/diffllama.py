"""DiffLlama (`DiffLlamaForCausalLM`: kajuma/DiffLlama-0.3B-handcut, ...): Llama's model with the
differential attention of transformers' `DiffLlamaAttention` (arXiv 2410.05258):

- q, k and v as Llama's (H query heads, G KV heads, rotate-half rotary over the whole head);
- the values' KV heads split in two halves, A (the first G/2) and B (the rest); each query head
  h attends with its own scores, softmax(q_h k_g / sqrt(d)), once to A's head g mod G/2 and
  once to B's: o_h = [o_h^A | o_h^B], 2d wide;
- the first half of the query heads paired with the second, o_i - lambda o_{i + H/2} for
  i < H/2, where lambda = exp(sum(lambda_q1 * lambda_k1)) - exp(sum(lambda_q2 * lambda_k2)) +
  lambda_init and lambda_init = 0.8 - 0.6 exp(-0.3 layer) (the layer's four vectors
  `self_attn.lambda_{q,k}{1,2}`, [d] each);
- an RMSNorm without weight over each 2d-wide pair (eps `rms_norm_eps`), times 1 - lambda_init,
  then o_proj over the H/2 pairs (H d wide).

Both value reads run in one call of the attention backend over the paged cache
(`DiffLlamaLayer`): 2H query heads (q twice) over 2G KV heads (k twice; values A, A, B, B by
head), whose group g (< G) holds k_g with A's head g mod G/2 and group G + g k_g with B's, so the
backend's own head grouping pairs each query head with both (its KV cache is twice Llama's:
`ModelConfig.kv_layer_shapes`, a backend of that shape, `AttentionBackend.with_geometry`).

Tensor parallelism (`diffllama_config.py`): a rank holds its share of each half of the query
heads and of the KV heads, so its pairs and both value reads are its own; locally the same
layer over H/N heads and G/N KV heads, o_proj row-parallel over its pairs' columns.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.diffllama_config import halves
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.parallel_linear import column_linear

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def lambda_init(layer: int) -> float:
    """transformers' `lambda_init_fn`: 0.8 - 0.6 exp(-0.3 layer)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DiffLlamaLayer(LlamaLayer):
    def __init__(
        self, model: DiffLlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.heads = (ctx.num_heads, ctx.num_kv_heads)  # (the projections' own)
        self.ctx = dataclasses.replace(
            ctx, backend=model.diff_backend, num_heads=2 * ctx.num_heads,
            num_kv_heads=2 * ctx.num_kv_heads,
        )  # fmt: skip
        a, dtype = prefix + "self_attn.", model.dtype
        q1, k1, q2, k2 = (w[a + n].to(dtype) for n in LAMBDAS)
        self.lambda_init = lambda_init(index)
        # as transformers computes it: the products in the model's dtype summed in float32,
        # each exp rounded to the dtype, then the difference and lambda_init in the dtype
        one = torch.exp(torch.sum(q1 * k1, dim=-1, dtype=torch.float32)).to(dtype)
        two = torch.exp(torch.sum(q2 * k2, dim=-1, dtype=torch.float32)).to(dtype)
        self.lam = one - two + self.lambda_init

    def split_qkv(self, model: DiffLlamaModel, w: DeviceWeights, names: list[str]) -> Linear:
        """q/k/v on a tensor-parallel rank: its share of each half of the query heads, then of
        the KV heads (k and v alike: `diffllama_config.halves`)."""
        c, d, lay = model.config, model.config.head_dim, self.ctx.tp.layout
        q, kv = halves(lay, c.num_heads), halves(lay, c.num_kv_heads)
        rows = [(a * d, b * d) for a, b in (*q, *kv, *kv)]
        return column_linear(self.ctx, w, [n for n in names for _ in range(2)], rows)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, d], k [T, G, d] and the values by KV head of the doubled cache
        [T, 2G, d]: A's heads twice, then B's twice."""
        (h, g), d, t = self.heads, self.ctx.head_dim, x.shape[0]
        q, k, v = self.qkv(x).split([h * d, g * d, g * d], dim=-1)
        v = v.reshape(t, g, d)
        a, b = v[:, : g // 2], v[:, g // 2 :]
        return q.reshape(t, h, d), k.reshape(t, g, d), torch.cat([a, a, b, b], dim=1)

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([q, q], dim=1), torch.cat([k, k], dim=1)  # (the doubled heads)

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """[T, 2H d] (each query head's read of A, then every head's of B) -> the H/2 pairs'
        normalised differences [T, H d] (module docstring)."""
        (h, _), d, t = self.heads, self.ctx.head_dim, out.shape[0]
        o = out.view(t, 2, h, d).transpose(1, 2).reshape(t, h, 2 * d)  # [o_h^A | o_h^B]
        diff = o[:, : h // 2] - self.lam * o[:, h // 2 :]
        diff = F.rms_norm(diff, (2 * d,), None, self.ctx.eps)
        return ((1 - self.lambda_init) * diff).reshape(t, h * d)


class DiffLlamaModel(LlamaModel):
    layer_class = DiffLlamaLayer

    def __init__(self, config, weights, **kwargs) -> None:
        backend: AttentionBackend = kwargs["backend"]  # (the doubled heads' shape)
        self.diff_backend = backend.with_geometry(
            2 * backend.num_kv_heads, backend.head_dim, 2 * backend.num_heads
        )
        super().__init__(config, weights, **kwargs)

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        return [self.diff_backend] * self.config.num_kv_layers
