"""Gemma 3n (the text model: `Gemma3nForCausalLM`, and `Gemma3nForConditionalGeneration` read
text-only; its config in `gemma3n_config.py`): Gemma 4's attention (`gemma4.py`: q, k and v
normed per head, scale 1, the KV-shared last layers reading an earlier layer's cache and this
step's k/v without storing, the sliding and full layers' rotary tables), its four norms scaling
by w, its per-layer inputs, GeGLU and the final soft cap, with what transformers'
`Gemma3nTextDecoderLayer` adds:

- AltUp: the model runs `altup_inputs` streams [A, T, hidden]; the first is the embedding, the
  others its projections rescaled to its RMS. Each layer predicts every stream as itself plus
  a mix of all of them (per-token A x A coefficients from a router: tanh(linear(norm(active) /
  hidden))), runs on the active one's prediction, then corrects each stream by the layer's
  innovation (its output less the active prediction) times per-token coefficients + 1; the
  per-layer input is added to every stream but the first. At the end the other streams are
  projected back, rescaled to the first's RMS, and all of them averaged before the final norm;
- Laurel: a rank-`laurel_rank` branch x + norm(right(left(x))) of the normed input, averaged
  with the attention's residual sum ((h + attn + laurel) / sqrt 2);
- activation sparsity: in the layers of `Gemma3nParts.sparsity` > 0 the MLP's gate keeps what
  exceeds its row's mean + std x the normal quantile of that fraction (relu(gate - cutoff));
- no layer scalar; per-layer input ids past its table read row 0;
- the multimodal wrapper's image and audio token ids (`Gemma3nParts.embedders`) embedded
  through its embedders (a table, its norm, a projection to hidden, an unweighted norm), as
  transformers' `Gemma3nModel` embeds them with or without images or audio; its towers are not
  read (text only).

Tensor parallel: the attention and MLPs split as Gemma 4's (`gemma4.py`: heads, KV-shared
layers on their rank's cache rows, MLP widths by layer), the sparse MLPs' gate statistics
summed over the ranks (`SparseGatedMLP`); AltUp (its router, coefficients and stream
projections), Laurel, the per-layer inputs and the wrapper's embedders replicated (small).
FP8 is refused (`family_options`). Batched over the step's tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gemma4 import _ACTS, Gemma4Layer, Gemma4Model, Gemma4Step
from pagoda.runtime.model.llama import GatedMLP, LayerContext, linear_layer

_ROOT2 = math.sqrt(2)


class SparseGatedMLP(GatedMLP):
    """GatedMLP with the Gaussian top-k on its gate (module docstring); tensor parallel, the
    gate's row mean and standard deviation over every rank's columns (two [T, 1] all-reduces,
    in float32)."""

    __slots__ = ("multiplier", "tp")

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str, sparsity: float,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        super().__init__(ctx, w, prefix)
        normal = torch.distributions.normal.Normal(0, 1)
        quantile = normal.icdf(torch.tensor(sparsity, dtype=torch.float32))
        self.multiplier = quantile.to(device=device, dtype=dtype)
        self.tp = ctx.tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)
        gate = gate_up[:, : gate_up.shape[-1] // 2]
        if self.tp is None:
            mean = gate.mean(dim=-1, keepdim=True)
            std = gate.std(dim=-1, keepdim=True, unbiased=False)
        else:  # this rank's columns of the gate: the row's moments summed over the ranks
            wide, n = gate.float(), gate.shape[-1] * self.tp.layout.size
            mean = self.tp.all_reduce(wide.sum(dim=-1, keepdim=True)) / n
            var = self.tp.all_reduce(((wide - mean) ** 2).sum(dim=-1, keepdim=True)) / n
            mean, std = mean.to(gate.dtype), var.sqrt().to(gate.dtype)
        gate.copy_(F.relu(gate - (mean + std * self.multiplier)))
        return self.down(self.act_and_mul(x=gate_up))


class AltUp:
    """One layer's AltUp router and coefficients (module docstring)."""

    def __init__(self, model: Gemma3nModel, w: DeviceWeights, p: str, ctx: LayerContext) -> None:
        parts = model.config.family.gemma4.gemma3n
        self.ctx, self.active, self.inputs = ctx, parts.altup_active, parts.altup_inputs
        self.router = w[p + "modality_router.weight"]
        self.router_norm = model.read_norm(w, p + "router_norm.weight")
        self.prediction = w[p + "prediction_coefs.weight"]
        self.correction = w[p + "correction_coefs.weight"]
        self.scale = w[p + "correct_output_scale"] if parts.altup_correct_scale else None
        self.root = model.config.hidden_size**-1.0

    def modalities(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ctx.rms_norm(x=x, weight=self.router_norm, eps=self.ctx.eps) * self.root
        return torch.tanh(F.linear(x, self.router).float()).to(x.dtype)

    def predict(self, streams: torch.Tensor) -> torch.Tensor:
        """[A, T, H]: each stream plus its mix of all of them."""
        a, t = self.inputs, streams.shape[1]
        coefs = F.linear(self.modalities(streams[self.active]), self.prediction).view(t, a, a)
        mixed = torch.bmm(coefs, streams.transpose(0, 1)).transpose(0, 1)
        return (mixed + streams).contiguous()

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """[A, T, H]: each prediction plus the layer's innovation times its coefficient."""
        coefs = F.linear(self.modalities(activated), self.correction) + 1.0
        innovation = activated - predictions[self.active]
        return innovation.unsqueeze(0) * coefs.t().unsqueeze(-1) + predictions


class Gemma3nLayer(Gemma4Layer):
    def __init__(
        self, model: Gemma3nModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        parts = model.config.family.gemma4.gemma3n
        self.read_attention(model, w, prefix, index, ctx)
        ctx, sparsity = self.ctx, parts.sparsity[index]
        self.mlp = (
            SparseGatedMLP(ctx, w, prefix + "mlp.", sparsity, model.dtype, model.device)
            if sparsity > 0
            else GatedMLP(ctx, w, prefix + "mlp.")
        )
        self.altup = AltUp(model, w, prefix + "altup.", ctx)
        self.laurel = (
            linear_layer(ctx, w, [prefix + "laurel.linear_left.weight"]),
            linear_layer(ctx, w, [prefix + "laurel.linear_right.weight"]),
            model.read_norm(w, prefix + "laurel.post_laurel_norm.weight"),
        )
        self.per_layer = (
            linear_layer(ctx, w, [prefix + "per_layer_input_gate.weight"]),
            linear_layer(ctx, w, [prefix + "per_layer_projection.weight"]),
            model.read_norm(w, prefix + "post_per_layer_input_norm.weight"),
        )
        self.act = _ACTS[model.config.family.hidden_act]  # (the MLP's: `hidden_activation`)

    def linears(self):
        return [self.qkv, self.o_proj, *self.mlp.linears(), *self.laurel[:2], *self.per_layer[:2]]

    def __call__(self, streams: torch.Tensor, residual: None, step: Gemma4Step):
        norm, eps, active = self.ctx.rms_norm, self.ctx.eps, self.altup.active
        predictions = self.altup.predict(streams)
        h = predictions[active]
        x = norm(x=h, weight=self.attn_norm, eps=eps)
        left, right, laurel_norm = self.laurel
        laurel = x + norm(x=right(left(x)), weight=laurel_norm, eps=eps)
        attn = norm(x=self.attention(x, step), weight=self.post_attn_norm, eps=eps)
        h = (h + attn + laurel) / _ROOT2
        y = self.mlp(norm(x=h, weight=self.pre_mlp_norm, eps=eps))
        h = h + norm(x=y, weight=self.post_mlp_norm, eps=eps)
        corrected = self.altup.correct(predictions, h)
        first = corrected[active]
        if self.altup.scale is not None:
            first = first * self.altup.scale
        gate, proj, post = self.per_layer
        x = self.act(gate(first)) * step.per_layer[:, self.index]
        corrected[1:] += norm(x=proj(x), weight=post, eps=eps)
        return corrected, None


class Gemma3nModel(Gemma4Model):
    layer_class = Gemma3nLayer

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        super().read_model_tensors(w, ctx)
        n = self.config.family.gemma4.gemma3n.altup_inputs - 1
        self.altup_in = [linear_layer(ctx, w, [f"model.altup_projections.{i}.weight"])
                         for i in range(n)]  # fmt: skip
        self.altup_out = [linear_layer(ctx, w, [f"model.altup_unembed_projections.{i}.weight"])
                          for i in range(n)]  # fmt: skip
        self.embedders = []  # (first id, ids, table, its norm, projection, eps)
        for name, first, rows, _, eps in self.config.family.gemma4.gemma3n.embedders:
            e = f"model.embed_{name}."
            self.embedders.append((first, rows, w[e + "embedding.weight"],
                                   self.read_norm(w, e + "hard_embedding_norm.weight"),
                                   linear_layer(ctx, w, [e + "embedding_projection.weight"]), eps))  # fmt: skip
        self.unweighted = self.ones(self.config.hidden_size)

    def linears(self):
        return [*self.altup_in, *self.altup_out, *(e[4] for e in self.embedders),
                *super().linears()]  # fmt: skip

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The scaled text embedding; the wrapper's image and audio ids through their embedders
        (a table, its norm, a projection, an unweighted norm: transformers'
        `Gemma3nMultimodalEmbedder` on token ids), every row computed, the mask picking."""
        h = super().embed_tokens(input_ids)
        for first, rows, table, norm, proj, eps in self.embedders:
            mask = (input_ids >= first) & (input_ids < first + rows)
            x = F.embedding((input_ids - first).clamp(0, rows - 1), table)
            x = proj(self.rms_norm(x=x, weight=norm, eps=eps))
            x = self.rms_norm(x=x, weight=self.unweighted, eps=eps)
            h = torch.where(mask.unsqueeze(-1), x, h)
        return h

    def per_layer_inputs(self, input_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Gemma 4's, ids past the per-layer table reading its row 0 (module docstring)."""
        rows = self.config.family.gemma4.per_layer_vocab
        ids = torch.where(input_ids < rows, input_ids, torch.zeros_like(input_ids))
        return super().per_layer_inputs(ids, h)

    @staticmethod
    def _rescaled(first: torch.Tensor, projections, streams) -> torch.Tensor:
        """[A, T, H]: `first` and each projection of its stream scaled to `first`'s RMS."""
        target = torch.mean(first**2, dim=-1, keepdim=True) ** 0.5
        out = [first]
        for proj, x in zip(projections, streams):
            y = proj(x)
            norm = torch.sqrt(torch.mean(y**2, dim=-1, keepdim=True).clamp(min=1e-5))
            out.append(y * target / norm)
        return torch.stack(out)

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        h = self.embed_tokens(input_ids)
        step = Gemma4Step(meta, kv_caches, self._rope_rows(positions, h.dtype, meta),
                          per_layer=self.per_layer_inputs(input_ids, h))  # fmt: skip
        streams = self._rescaled(h, self.altup_in, [h] * len(self.altup_in))
        for layer in self.layers:
            streams, _ = layer(streams, None, step)
        streams = streams.index_select(1, logits_indices)
        streams = self._rescaled(streams[0], self.altup_out, streams[1:])
        return self.logits(self.final_hidden(streams.mean(dim=0), None), head)
