"""The hybrids' recurrent layer: on the layers `MambaConfig.layers` marks, Llama's pre-norm
layer with a recurrent mixer in attention's place, ``x + mixer(norm(x))`` then
``+ mlp(norm(x))`` (the residual adds fused into the norms, as Llama's), the mixer reading its
state slots and the step's slots from ``meta.aux[MAMBA_STEP]`` (`mamba2.MambaStep`); the other
layers are the attention layer class's own.

Mixed in before that class: LFM2's short convs (`lfm2.py`), Qwen3-Next's and OLMo Hybrid's
Gated DeltaNet (`qwen3_next.py`, `olmo_hybrid.py`), Kimi Linear's KDA (`kimi_linear.py`),
Jamba's Mamba-1 mixers (`jamba.py`), RecurrentGemma's RG-LRU blocks
(`recurrent_gemma.py`, its `mix` passing the step's first-token mask), and Granite 4.0's / Bamba's Mamba2 mixers
(`granite_hybrid.py`, whose own call scales each branch). Falcon-H1 (mixer and attention side
by side), Nemotron-H, Mamba-1 and Zamba2 (no MLP after the mixer, or a shared block before it)
have layers of their own.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step
from pagoda.runtime.model.mamba2 import MAMBA_STEP


class RecurrentLayer:
    """A recurrent layer (module docstring) before an attention layer class in the MRO, e.g.
    ``class Lfm2Layer(RecurrentLayer, Qwen3Layer)``; the subclass gives `make_mixer`."""

    mixer = None  # the layer's recurrent mixer (`make_mixer`); None on an attention layer
    mlp_norm_name = "post_attention_layernorm.weight"  # the norm before the MLP (Jamba's otherwise)

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        if not model.config.family.mamba.layers[index]:
            super().__init__(model, w, prefix, index, ctx)  # the attention layer's own
            return
        self.ctx, self.index = ctx, index
        self.attn_norm = self.read_layer_norm(model, w, prefix + "input_layernorm.weight")
        self.mlp_norm = self.read_layer_norm(model, w, prefix + self.mlp_norm_name)
        self.mlp = model.make_mlp(w, prefix, index, ctx)
        self.mixer = self.make_mixer(model, w, prefix, index, ctx)

    def read_layer_norm(self, model: LlamaModel, w: DeviceWeights, name: str) -> torch.Tensor:
        """A recurrent layer's norm as `rms_norm` takes it (DeepSeek's layer reads its own
        as stored: `kimi_linear.py`)."""
        return model.read_norm(w, name)

    def mix(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """The recurrent mixer over the normed input (the RG-LRU's reads more of the step)."""
        return self.mixer(x, step.meta.aux[MAMBA_STEP])

    def linears(self):
        if self.mixer is None:
            return super().linears()
        return [*self.mixer.linears(), *self.mlp.linears()]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mixer is None:
            return super().__call__(h, residual, step)
        x, residual = self.attention_input(h, residual)
        h = self.mix(x, step)
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        return self.mlp(x), residual
