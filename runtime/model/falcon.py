"""Falcon (`FalconForCausalLM`: falcon-7b/40b/180b, Falcon2-11B): Cohere's parallel layer over
StarCoder2's norms (`starcoder2.py`: LayerNorm with a weight and a bias, in the model's dtype;
eps `layer_norm_epsilon`), with an ungated MLP ``dense_4h_to_h(gelu(dense_h_to_4h(x)))`` (exact
GELU), biases where `bias` says, full rotary, and a fused `query_key_value` whose rows
`split_qkv` lists as Llama's q/k/v in one of three layouts (`FamilyConfig.falcon_qkv`):

- "multi_query" (falcon-7b): every head's q, then one k and one v head;
- "grouped" (`new_decoder_architecture`: 40b, 180b, Falcon2): per KV head group, its q heads,
  then its k, then its v;
- "per_head" (neither): q, k and v of each head in turn;
- "stacked" (GPT-2, StarCoder 1, MPT: `positions.py`, `bloom.py`): every q head, then every
  k head, then every v head.

The layer (`FamilyConfig.falcon_norms`): "one" norm with attention and the MLP side by side off
it, ``x + attn(n) + mlp(n)`` (`cohere.CohereLayer.__call__`); "two" (`new_decoder_architecture`
with `num_ln_in_parallel_attn` 2): ``x + attn(ln_attn(x)) + mlp(ln_mlp(x))``; "sequential"
(`parallel_attn` false): Llama's. Its tensors are read under Llama's names
(`safetensors_weights`: `word_embeddings`, `self_attention.dense` as o_proj, `dense_h_to_4h` /
`dense_4h_to_h` as up / down, `ln_attn` / `ln_mlp` as input_layernorm /
post_attention_layernorm, `ln_f` as the final norm), so tensor
parallelism, the checkpoint check and the weights estimate treat them as the other families'.
ALiBi (`alibi` true: falcon-rw) is refused when the config is read.

GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, GPT-NeoX-20B) is this model too: its q/k/v per head, two
norms in parallel (`use_parallel_residual`, `input_layernorm` / `post_attention_layernorm`) or
Llama's layer, a partial rotary (`rotary_pct`, default 0.25), biases, GELU; its tensors under
`gpt_neox.` and `embed_out` read as Llama's too. GPT-NeoX-Japanese (`GPTNeoXJapaneseForCausalLM`)
is GPT-NeoX's sequential layer without biases, but for the last layer's attention output
(`dense_bias`, read as its o_proj's bias), its MLP `intermediate_multiple_size` x hidden.
"""

from __future__ import annotations

import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.cohere import CohereLayer
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights
from pagoda.runtime.model.starcoder2 import Starcoder2Model
from pagoda.runtime.model.ungated_mlp import UngatedMLP

FUSED = "self_attn.qkv_proj"  # (query_key_value, renamed)
_FP8 = ("weight_scale", "weight_scale_inv", "input_scale")


def qkv_rows(c: ModelConfig) -> list[tuple[str, int, int]]:
    """(q_proj | k_proj | v_proj, first row, end row) of the fused matrix, in its row order."""
    d, h, g = c.head_dim, c.num_heads, c.num_kv_heads
    if c.family.falcon_qkv == "multi_query":
        blocks = [("q_proj", h), ("k_proj", 1), ("v_proj", 1)]
    elif c.family.falcon_qkv == "stacked":  # every q head, every k head, every v head (GPT-2)
        blocks = [("q_proj", h), ("k_proj", g), ("v_proj", g)]
    elif c.family.falcon_qkv == "grouped":
        blocks = [(p, n) for _ in range(g) for p, n in (("q_proj", h // g), ("k_proj", 1),
                                                        ("v_proj", 1))]  # fmt: skip
    else:  # per head
        blocks = [(p, 1) for _ in range(h) for p in ("q_proj", "k_proj", "v_proj")]
    out, start = [], 0
    for part, heads in blocks:
        out.append((part, start, start + heads * d))
        start += heads * d
    return out


def split_qkv(weights: SafetensorsWeights, config: ModelConfig) -> None:
    """List each layer's fused q/k/v (and its bias) as Llama's q_proj, k_proj, v_proj rows
    (module docstring); ValueError, one line, for one missing, of the wrong height, or FP8."""
    rows = qkv_rows(config)
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}.{FUSED}."
        module = f"model.layers.{layer}.self_attn."
        if prefix + "weight" not in weights:
            raise ValueError(f"checkpoint is missing tensor {prefix + 'weight'!r}")
        if any(prefix + s in weights for s in _FP8):
            raise ValueError(f"checkpoint tensor {prefix}weight is FP8-quantized: FP8 checkpoints "
                             "with a fused q/k/v (Falcon's query_key_value, GPT-2's c_attn, "
                             "...) are not supported")  # fmt: skip
        for kind in ("weight", "bias"):
            if prefix + kind in weights:
                parts = [(f"{module}{p}.{kind}", a, b) for p, a, b in rows]
                weights.split_rows(prefix + kind, parts)


class FalconLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.norms = model.config.family.falcon_norms  # ("two": ln_mlp is mlp_norm)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.norms == "sequential":
            return LlamaLayer.__call__(self, h, residual, step)
        if self.norms == "one":
            return CohereLayer.__call__(self, h, residual, step)
        x, residual = self.attention_input(h, residual)  # ln_attn(x), x
        m = self.ctx.rms_norm(x=residual, weight=self.mlp_norm, eps=self.ctx.eps)  # ln_mlp(x)
        residual = residual.add_(self.attention(x, step))
        return self.mlp(m), residual


class FalconModel(Starcoder2Model):
    layer_class = FalconLayer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)
