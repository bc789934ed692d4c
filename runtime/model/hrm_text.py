"""HRM-Text (`HrmTextForCausalLM`: Sapient's hierarchical reasoning model; config and names in
`hrm_text_config.py`), as transformers runs it. Two stacks of Llama layers (L and H), each
layer's norms weightless RMSNorms, its attention multi-head with the output x sigmoid(gate_proj(x))
before o_proj, each stack ending in a weightless norm. Every token runs

    z_H = embed * embedding_scale;  z_L = z_L_init
    H_cycles times:  L_cycles times z_L = L(z_L + z_H);  then z_H = H(z_H + z_L)

and the head reads z_H. Each stack pass attends causally over its own pass's keys of the earlier
tokens, so it is causal and cacheable token by token: the model's layer list is the passes'
layers in order (`HrmCycles.order`: the stacks' layer objects repeated, weights shared), each
entry its own KV cache index. Tensor parallel as Llama's (the output gate's rows with their
heads, the passes' KV caches each rank's heads); FP8 is refused (`family_options`).
"""

from __future__ import annotations

import copy

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.parallel_linear import column_linear


class HrmTextLayer(LlamaLayer):
    """Llama's layer, weightless norms, attention's output gated per element."""

    def __init__(
        self, model: HrmTextModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.attn_norm = self.mlp_norm = model.read_norm(w, "")
        gate = [prefix + "self_attn.gate_proj.weight"]
        if ctx.tp is None:
            self.gate = linear_layer(ctx, w, gate)
        else:  # this rank's heads' rows, as q's
            (q0, q1), d = ctx.tp.layout.heads(model.config.num_heads), model.config.head_dim
            self.gate = column_linear(ctx, w, gate, [(q0 * d, q1 * d)])

    def linears(self):
        return [*super().linears(), self.gate]

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out * torch.sigmoid(self.gate(x))


class HrmTextModel(LlamaModel):
    layer_class = HrmTextLayer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        layers = []
        for i, physical in enumerate(config.family.hrm.order()):  # (weights shared, a cache
            layer = copy.copy(self.layers[physical])  # each pass)
            layer.index = i
            layers.append(layer)
        self.layers = layers

    def read_norm(self, w: DeviceWeights, name: str):
        """Ones (the norms are weightless): one tensor for all of them."""
        if getattr(self, "unit_norm", None) is None:
            h = self.config.hidden_size
            self.unit_norm = torch.ones(h, dtype=self.dtype, device=self.device)
        return self.unit_norm

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.z_init = w["model.z_L_init"]

    def linears(self):
        seen = {id(x): x for layer in self.layers for x in layer.linears()}
        return [*seen.values(), self.lm_head]

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.config.family.hrm.embedding_scale

    def stack(self, first: int, x: torch.Tensor, step: Step) -> torch.Tensor:
        """One stack pass over `x` (its layers `first`..), ending in the stack's norm."""
        h, residual = x, None
        for layer in self.layers[first : first + self.config.family.hrm.per_stack]:
            h, residual = layer(h, residual, step)
        return self.final_hidden(h, residual)

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        hrm = self.config.family.hrm
        z_h = self.input_embeddings(input_ids, positions)
        step = Step(meta, kv_caches, self._rope_rows(positions, z_h.dtype, meta))
        z_l, first = self.z_init.expand_as(z_h), 0
        for _ in range(hrm.h_cycles):
            for _ in range(hrm.l_cycles):
                z_l, first = self.stack(first, z_l + z_h, step), first + hrm.per_stack
            z_h, first = self.stack(first, z_h + z_l, step), first + hrm.per_stack
        return self.logits(z_h.index_select(0, logits_indices), head)
