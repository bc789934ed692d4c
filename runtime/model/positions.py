"""Learned absolute positions: a table of one row per position (`model.embed_positions`),
row ``p + FamilyConfig.position_offset`` added to the embedding of the token at position p
(the runner's `positions`); no rotary. The table bounds the context: max_model_len is at most
`max_position_embeddings` (`engine.start_checks.check_max_model_len` refuses more, in one line).

- GPT-2 (`GPT2LMHeadModel`): Llama's sequential layer over StarCoder2's LayerNorms (weight and
  bias, eps `layer_norm_epsilon`), an ungated MLP ``c_proj(gelu_new(c_fc(x)))``, biases
  everywhere, a tied head. Its Conv1D matrices are stored [in, out] and read transposed
  (`transpose_conv1d`); the fused `c_attn` is q, k, v stacked (`falcon.split_qkv`, "stacked").
  `scale_attn_by_inverse_layer_idx` (BioMedLM's, Stanford CRFM's): layer i's scores divided by
  i + 1 (its q scaled, `OptLayer.before_rotary`).
  Tensors are read under Llama's names (`safetensors_weights`: `wte`, `wpe` as
  `model.embed_positions`, `h.N.attn.c_attn` as qkv_proj, `attn.c_proj` as o_proj,
  `mlp.c_fc` / `c_proj` as up / down, `ln_1` / `ln_2` / `ln_f`), checkpoints saved without the
  `transformer.` prefix too.
- GPTBigCode (`GPTBigCodeForCausalLM`: StarCoder 1, SantaCoder): GPT-2's model with nn.Linear
  matrices and, with `multi_query`, one KV head (`c_attn`: every q head, one k, one v; without
  it q/k/v per head).
- GPT-Neo (`GPTNeoForCausalLM`): GPT-2's model with nn.Linear matrices, q/k/v apart (no
  biases; `out_proj` with one), scores unscaled (`FamilyConfig.attention_multiplier` 1), its
  `attention_types` read as layer_types (`config_keys.gpt_neo_layer_types`: "local" layers
  slide over `window_size` tokens).
- OPT (`OPTForCausalLM`): its table offset by 2; q/k/v/out projections and fc1/fc2 with biases
  where `enable_bias`; ReLU; norms before each sublayer and a final one
  (`do_layer_norm_before`), or after each residual add and none at the end (opt-350m:
  `OptLayer`); embeddings of `word_embed_proj_dim` projected in and out around the layers
  (`project_in` / `project_out`, no bias) where that differs from hidden_size.
- XGLM (`XGLMForCausalLM`: xglm-564M ... 7.5B): OPT's pre-norm layer (LayerNorms with biases,
  eps 1e-5; q/k/v/out, fc1/fc2 with biases; exact GELU; a final norm `model.layer_norm`; a tied
  head) whose table is not stored but computed (`sinusoidal_table`, `FamilyConfig.positions`
  "sinusoidal"), offset by 2 as OPT's, and its token embeddings multiplied by sqrt(hidden)
  (`scale_embedding`: `FamilyConfig.embedding_multiplier`) before the rows are added.
- OpenAI GPT (`OpenAIGPTLMHeadModel`: GPT-1): GPT-2's model (Conv1D matrices, the stacked
  `c_attn`, biases, a tied head; `tokens_embed` / `positions_embed` read as `wte` / `wpe`) with
  OPT's post-norm layers (`OptLayer`: ``ln_1(x + attn(x))``, ``ln_2(x + mlp(x))``) and no
  final norm; `afn` "gelu" is gelu_new (transformers' ACT_FNS).
- BioGPT (`BioGptForCausalLM`: microsoft/biogpt, BioGPT-Large): XGLM's layer and scaled
  embeddings (`ScaledPositionsModel`) over OPT's stored table offset by 2; `biogpt.` and
  `output_projection` read as `model.` and `lm_head`; LayerNorms of eps 1e-5 (nn.LayerNorm's:
  its `layer_norm_eps` is not read by transformers).
- CTRL (`CTRLLMHeadModel`: Salesforce/ctrl): XGLM's pre-norm layer (LayerNorms eps 1e-6,
  q/k/v/out with biases: `Wq`/`Wk`/`Wv`/`dense`; a ReLU MLP `ffn.0`/`ffn.2`; the final norm
  `transformer.layernorm`) and scaled embeddings (`transformer.w` x sqrt(hidden)) with CTRL's
  own computed sinusoidal table (`ctrl_sinusoidal_table`, no offset) and a tied head with a bias
  (`lm_head.bias`, added to the logits: `CtrlModel`).
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, Step
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights
from pagoda.runtime.model.starcoder2 import Starcoder2Model
from pagoda.runtime.model.ungated_mlp import UngatedMLP

TABLE = "model.embed_positions.weight"
HEAD_BIAS = "lm_head.bias"  # CTRL's
PROJECT_IN, PROJECT_OUT = "model.project_in.weight", "model.project_out.weight"
# GPT-2's Conv1D matrices, under Llama's names
CONV1D = re.compile(r"^model\.layers\.\d+\.(self_attn\.(qkv|o)_proj|mlp\.(up|down)_proj)\.weight$")


def transpose_conv1d(weights: SafetensorsWeights) -> None:
    """List GPT-2's Conv1D matrices ([in, out]) as linear layers' ([out, in])."""
    weights.transpose([n for n in weights if CONV1D.match(n)])


class OptLayer(LlamaLayer):
    """Llama's layer (OPT's norms before the sublayers), or with `post_norm` (opt-350m):
    ``x = ln1(x + attn(x)); x = ln2(x + mlp(x))``, the stream normalised whole: it hands back
    (x, None) (`LlamaModel.final_hidden` reads the output alone)."""

    def __init__(self, model, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        super().__init__(model, w, prefix, index, ctx)
        self.post_norm = model.config.family.post_norm
        # scale_attn_by_inverse_layer_idx: the scores / (index + 1), as q scaled
        self.q_scale = 1.0 / (index + 1) if model.config.family.q_scale_by_layer else None

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (q, k) if self.q_scale is None else (q * self.q_scale, k)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.post_norm:
            return LlamaLayer.__call__(self, h, residual, step)
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        x = h if residual is None else h + residual
        x = norm(x=self.attention(x, step), weight=self.attn_norm, eps=eps, residual=x)[0]
        return norm(x=self.mlp(x), weight=self.mlp_norm, eps=eps, residual=x)[0], None


class LearnedPositionsModel(Starcoder2Model):
    """GPT-2, GPTBigCode, GPT-Neo and OPT (module docstring)."""

    layer_class = OptLayer  # (Llama's layer unless `post_norm`)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.positions_table = w[TABLE]  # whole on every rank
        self.project_in = ctx.linear(w[PROJECT_IN]) if PROJECT_IN in w else None
        self.project_out = ctx.linear(w[PROJECT_OUT]) if PROJECT_OUT in w else None

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor | None:
        if name == "model.norm.weight" and self.config.family.post_norm:
            return None  # (opt-350m: no final norm)
        return super().read_norm(w, name)

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.project_in is not None:
            h = self.project_in(h)
        offset = self.config.family.position_offset  # (OPT's table starts at row 2)
        rows = positions + offset if offset else positions
        return h + F.embedding(rows, self.positions_table)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        x = h if self.norm is None else super().final_hidden(h, residual)
        return x if self.project_out is None else self.project_out(x)

    def linears(self):
        extra = [x for x in (self.project_in, self.project_out) if x is not None]
        return super().linears()[:-1] + extra + [self.lm_head]


def sinusoidal_table(rows: int, dim: int) -> torch.Tensor:
    """[rows, dim] float32: XGLM's (fairseq's) table, row p = [sin(p f), cos(p f)] with
    frequencies f_i = 10000 ** (-i / (dim / 2 - 1)), a zero column where dim is odd; computed
    as transformers' `XGLMSinusoidalPositionalEmbedding.get_embedding` computes it."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.float32).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return F.pad(table, (0, dim % 2))


def ctrl_sinusoidal_table(rows: int, dim: int) -> torch.Tensor:
    """[rows, dim] float32: CTRL's table, row p = [sin(p f_i) for even i, cos(p f_i) for odd i]
    with f_i = 10000 ** (-2 (i // 2) / dim), computed as transformers' `positional_encoding`."""
    pos = torch.arange(rows, dtype=torch.int64).to(torch.float32).unsqueeze(1)
    i = torch.arange(dim, dtype=torch.int64).to(torch.float32).unsqueeze(0)
    angles = pos * (1 / torch.pow(10000, (2 * (i // 2)) / dim))
    return torch.cat([torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])], dim=-1)


class ScaledPositionsModel(LearnedPositionsModel):
    """BioGPT (module docstring): the token embeddings scaled before the table's rows are added."""

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().embed_tokens(input_ids) * self.config.family.embedding_multiplier


class XglmModel(ScaledPositionsModel):
    """XGLM (module docstring): the table computed, the token embeddings scaled."""

    table = staticmethod(sinusoidal_table)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        c = self.config
        table = self.table(c.max_position_embeddings + c.family.position_offset, c.hidden_size)
        self.positions_table = table.to(device=self.device, dtype=self.dtype)
        self.project_in = self.project_out = None


class CtrlModel(XglmModel):
    """CTRL (module docstring): XGLM's model with CTRL's table and the LM head's bias."""

    table = staticmethod(ctrl_sinusoidal_table)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        super().read_model_tensors(w, ctx)
        self.head_bias = w[HEAD_BIAS]  # (added to the logits: nothing fused into the head)

    def head_blocks(self, w: DeviceWeights, head: str):
        return None

    def logits(self, x, head):
        return super().logits(x, None) + self.head_bias
