"""ModernBERT (`ModernBertModel`: gte-modernbert-base; `ModernBertForSequenceClassification`:
gte-reranker-modernbert-base), an encoder served by the pooling runner only
(`pooler_config.ENCODERS`; config and tensor names in `modernbert_config.py`).

The input is the token embedding through a LayerNorm (no positions table: rotary). Each layer
is pre-norm, ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (layer 0 has no norm before
attention), with LayerNorms (biases where `norm_bias`), q/k/v in one stored matrix, a GeGLU
MLP (exact GELU) and, by default, no biases. Attention is bidirectional (`bert.bidirectional`:
the step's own rows, each prompt whole in one step, nothing in the KV cache): the global layers
see the whole prompt and rotate by `rope_theta`; the local layers (`FamilyConfig.window_layers`)
see the keys within `encoder_window` positions either side and rotate by `local_rope_theta`.
A final LayerNorm; a sequence classifier's head (dense, its activation, LayerNorm, classifier)
runs on the pooled row (CLS, or the mean with `classifier_pooling: mean`) in the pooler
(`model/classifier_head.py`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.bert import bidirectional
from pagoda.runtime.model.classifier_head import ClassifierHead
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaLayer, Step
from pagoda.runtime.model.modernbert_config import EMBED_NORM, HEAD_DENSE, HEAD_NORM, HEAD_OUT
from pagoda.runtime.model.ops import build_cos_sin_cache
from pagoda.runtime.model.starcoder2 import Starcoder2Model, layer_norm


class ModernBertLayer(LlamaLayer):
    """A pre-norm layer whose attention is bidirectional, local or global (module docstring);
    it hands back (x, None): the stream is its output."""

    def __init__(self, model, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        super().__init__(model, w, prefix, index, ctx)
        f = model.config.family
        self.local = f.encoder_window if f.window_layers and f.window_layers[index] else None

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        q, k, v = self.rotated_qkv(x, step)
        qkv = torch.stack((q, k, v), dim=1).view(x.shape[0], -1)  # [T, 3 * heads * D]
        return self.o_proj(bidirectional(qkv, self.ctx, step.meta, self.local))

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, None]:
        eps = self.ctx.eps
        a = h if self.attn_norm is None else layer_norm(x=h, weight=self.attn_norm, eps=eps)
        h = h + self.attention(a, step)
        return h + self.mlp(layer_norm(x=h, weight=self.mlp_norm, eps=eps)), None


class ModernBertModel(Starcoder2Model):
    """ModernBERT (module docstring)."""

    layer_class = ModernBertLayer

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        """[2, hidden]: the LayerNorm's weight and its bias (zeros without `norm_bias`)."""
        bias = name.removesuffix("weight") + "bias"
        return torch.stack([w[name], w[bias] if bias in w else torch.zeros_like(w[name])])

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext) -> GatedMLP:
        return GatedMLP(ctx, w, prefix + "mlp.")  # (Llama's: GeGLU by hidden_act)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        f = self.config.family
        self.embed_norm = self.read_norm(w, EMBED_NORM)
        self.classifier_head = None
        if f.num_labels:  # dense -> act -> LayerNorm -> classifier
            head_norm = self.read_norm(w, HEAD_NORM)
            self.classifier_head = ClassifierHead([
                ("linear", w[HEAD_DENSE], w.biases([HEAD_DENSE])), ("act", f.classifier_act),
                ("norm", head_norm[0], head_norm[1], self.config.rms_norm_eps),
                ("linear", w[HEAD_OUT], w.biases([HEAD_OUT]))])  # fmt: skip

    def rope_table(self, index: int) -> str:
        f = self.config.family
        return "local" if f.window_layers and f.window_layers[index] else "global"

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        c = self.config
        thetas = {"global": c.rope_theta, "local": c.family.local_rope_theta}
        return {name: build_cos_sin_cache(c.head_dim, theta, None, max_positions).to(self.device)
                for name, theta in thetas.items()}  # fmt: skip

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        return layer_norm(x=h, weight=self.embed_norm, eps=self.config.rms_norm_eps)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        return layer_norm(x=h, weight=self.norm, eps=self.config.rms_norm_eps)
