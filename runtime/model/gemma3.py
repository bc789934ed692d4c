"""Gemma 3 (the text model): Gemma 2's layer and model (`gemma2.py`: (1 + w) norms, four norms
a layer, GeGLU, the scaled embedding, query_pre_attn_scalar, the final logit soft cap) with
Qwen3's per-head q/k norms (`qwen3.py`, here with Gemma's norm), and sliding-window layers
interleaved with global ones (`FamilyConfig.window_layers`), each kind with its rotary base
(`LlamaModel.rope_table`). Its configs carry attn_logit_softcapping, which its attention never
applies (the loader leaves it out).
"""

from __future__ import annotations

from pagoda.runtime.model.gemma2 import Gemma2Layer, Gemma2Model
from pagoda.runtime.model.qwen3 import Qwen3Layer


class Gemma3Layer(Gemma2Layer, Qwen3Layer):
    """Gemma 2's layer; its `super().__init__` reads Qwen3's q/k norms, `before_rotary` is Qwen3's."""


class Gemma3Model(Gemma2Model):
    layer_class = Gemma3Layer
