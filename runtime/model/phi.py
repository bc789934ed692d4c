"""Phi (`PhiForCausalLM`: phi-1, phi-1.5, phi-2): Cohere's parallel layer over StarCoder2's
norms (`starcoder2.py`: LayerNorm with a weight and a bias, in the model's dtype), with

- one norm a layer, attention and the MLP side by side off it: ``x + attn(n) + mlp(n)``
  (`cohere.CohereLayer.__call__`);
- an ungated MLP, ``fc2(gelu_tanh(fc1(x)))`` (`gelu_new`), with biases; biases on q, k, v and
  the output projection (`dense`), and on the LM head (added to the logits);
- a partial rotary (`partial_rotary_factor`, default 0.5) in the rotate-half layout;
- with `qk_layernorm`, a LayerNorm (weight and bias) over each head of q and of k before rotary.

Its tensors are read under Llama's names (`safetensors_weights`: `self_attn.dense` as o_proj,
`mlp.fc1` / `fc2` as up / down, `q_layernorm` / `k_layernorm` as q_norm / k_norm), so that
tensor parallelism, the checkpoint check and the weights estimate treat them as the other
families'; its final norm is read as `model.final_layernorm` (`FINAL_NORM`).

GPT-J (`GPTJForCausalLM`: gpt-j-6b) is this model with the rotary in the interleaved layout, pairs
(2i, 2i + 1) over `rotary_dim` of each head, no q/k/v or output biases, and its GPT-2-style
names and keys (`transformer.h.N.attn.q_proj`, `mlp.fc_in` / `fc_out`; `n_embd`, `n_head`, ...).
CodeGen (`CodeGenForCausalLM`: codegen-350M/2B/6B/16B, mono/multi/nl) is GPT-J's model with q, k
and v fused in one `attn.qkv_proj` over its 4 model-parallel shards (each shard's quarter of q,
then of v, then of k): listed as q_proj, k_proj, v_proj at load (`split_codegen_qkv`).

Persimmon (`PersimmonForCausalLM`: persimmon-8b-base / -chat) is this model in Llama's sequential
layer (two LayerNorms with biases): q, k and v fused per head in `self_attn.query_key_value` as
GPT-NeoX's (split at load: `falcon.split_qkv`, "per_head"), Phi's q/k LayerNorms (one weight
and bias for every head, eps `layer_norm_eps`) before a rotate-half rotary over half of each
head, an ungated ReLU² MLP (`dense_h_to_4h` / `dense_4h_to_h`, with biases), biases on q, k, v
and `dense`, no bias on the head (`PersimmonModel`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.cohere import CohereLayer
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.starcoder2 import Starcoder2Model
from pagoda.runtime.model.ungated_mlp import UngatedMLP

HEAD_BIAS = "lm_head.bias"
FINAL_NORM = "model.final_layernorm.weight"  # Phi's name for `model.norm` (Bamba's too)


CODEGEN_GROUPS = 4  # CodeGen's model-parallel shards: transformers' `mp_num`, fixed


def split_codegen_qkv(weights, config) -> None:
    """List each CodeGen layer's fused `attn.qkv_proj` ([3 hidden, hidden]: 4 groups, each its
    quarter of the q rows, then v's, then k's) as q_proj, k_proj, v_proj (each one's quarters
    joined in order); ValueError, one line, for one missing or of the wrong height."""
    part = config.hidden_size // CODEGEN_GROUPS
    for layer in range(config.num_layers):
        fused = f"model.layers.{layer}.attn.qkv_proj.weight"
        if fused not in weights:
            raise ValueError(f"checkpoint is missing tensor {fused!r}")
        a = f"model.layers.{layer}.self_attn."
        parts = [(f"{a}{n}_proj.weight", (3 * g + j) * part, (3 * g + j + 1) * part)
                 for g in range(CODEGEN_GROUPS) for j, n in enumerate("qvk")]  # fmt: skip
        weights.split_rows(fused, parts)


class PhiLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        a = prefix + "self_attn."
        self.q_norm = self.k_norm = None
        if model.config.family.qk_norm:  # [2, head_dim]: weight and bias, the same every head
            self.q_norm = model.read_norm(w, a + "q_norm.weight")
            self.k_norm = model.read_norm(w, a + "k_norm.weight")

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.q_norm is None:
            return q, k
        eps, d = self.ctx.eps, (q.shape[-1],)
        q = F.layer_norm(q, d, self.q_norm[0], self.q_norm[1], eps)
        return q, F.layer_norm(k, d, self.k_norm[0], self.k_norm[1], eps)

    __call__ = CohereLayer.__call__  # attention and the MLP off one norm


class PhiModel(Starcoder2Model):
    layer_class = PhiLayer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        self.head_bias = None
        if HEAD_BIAS in weights:  # in the model's dtype, whole on every rank
            self.head_bias = weights[HEAD_BIAS].to(device=self.device, dtype=self.dtype)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        if name == "model.norm.weight" and name not in w:  # phi-2's (GPT-J's: model.norm)
            name = FINAL_NORM
        return super().read_norm(w, name)

    def head_blocks(self, w: DeviceWeights, head: str):
        return None  # the logits take the head's bias: no sampling fused into the matmul

    def logits(self, x, head):
        logits = super().logits(x, None)
        return logits if self.head_bias is None else logits + self.head_bias


class PersimmonLayer(PhiLayer):
    __call__ = LlamaLayer.__call__  # Llama's sequential layer, Phi's q/k LayerNorms


class PersimmonModel(PhiModel):
    layer_class = PersimmonLayer
