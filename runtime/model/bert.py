"""Encoders: BERT (`BertModel`: bge-*-v1.5, all-MiniLM-L6-v2, e5, gte-base), RoBERTa
(`RobertaModel`) and XLM-RoBERTa (`XLMRobertaModel`: multilingual-e5), served by the pooling
runner only (`pooler_config.ENCODERS`; config and tensor names in `bert_config.py`).

The input is the word embedding plus the learned position row (RoBERTa's offset by
pad_token_id + 1) plus token type 0's row (folded into the position table at load: every token
is segment 0), through a LayerNorm. Each layer is OPT's post-norm one (`OptLayer`:
``ln1(x + attn(x))``, ``ln2(x + mlp(x))``, LayerNorms with biases, biases on every
projection, exact GELU) whose attention is **bidirectional**: every row of a prompt attends to
every row of the same prompt (`bidirectional`). It reads the step's own q/k/v, never the paged
KV cache, and writes nothing to it: the engine schedules each encoder prompt whole in one step
(`pooler_config.with_runner`: no chunked prefill, no prefix caching), so the step's rows of a
request are its whole prompt. There is no final norm; the pooler reads the last layer's rows.
A sequence classifier's head (`*ForSequenceClassification`, any number of labels) is a
`ClassifierHead` the pooler runs on the pooled CLS row: dense, tanh, out.

Tensor parallel as a decoder (ModernBERT's too): `bidirectional` runs the rank's heads
(`LayerContext.num_heads`; an encoder's KV heads are its heads), o_proj row-parallel, the MLP
by width; the hidden states are whole on every rank after the last all-reduce, rank 0 pools.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.bert_config import EMBED_NORM, HEAD_DENSE, HEAD_OUT, TOKEN_TYPES
from pagoda.runtime.model.classifier_head import ClassifierHead
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, Step
from pagoda.runtime.model.positions import LearnedPositionsModel, OptLayer
from pagoda.runtime.model.starcoder2 import layer_norm

# `meta.aux`: the step's padded layout (`padded_rows`), built by the first layer, read by all
PADDED = "encoder_padded_rows"
# `meta.aux`: (BAND, window) -> a local layer's key mask (`_band`), read by every such layer
BAND = "encoder_band"


def padded_rows(meta: AttentionMetadata, device: torch.device):
    """(rows, key mask) of the step's sequences laid out padded as [B, L] (L their longest):
    int64 [T] the padded row of each token, bool [B, 1, 1, L] the keys that are a sequence's;
    None when every sequence has L tokens (the packed rows are the padded ones already).
    Planned from the host lengths; one host-to-device copy each."""
    lens = np.asarray(meta.query_lens_host, dtype=np.int64)
    longest = int(lens.max())
    if int(lens.min()) == longest:
        return None
    starts = np.cumsum(lens) - lens
    rows = np.repeat(np.arange(len(lens)) * longest - starts, lens) + np.arange(int(lens.sum()))
    keys = np.arange(longest)[None, :] < lens[:, None]
    return (torch.from_numpy(rows).to(device, non_blocking=True),
            torch.from_numpy(keys).to(device, non_blocking=True)[:, None, None, :])  # fmt: skip


def bidirectional(qkv: torch.Tensor, ctx: LayerContext, meta: AttentionMetadata,
                  window: int | None = None) -> torch.Tensor:  # fmt: skip
    """Attention [T, heads * D] of the packed q/k/v rows `qkv` [T, 3 * heads * D], each
    sequence's rows over all of its own rows (no causal mask), in one SDPA call over the
    sequences padded to the longest (`padded_rows`; padded keys masked out); with `window`
    (ModernBERT's local layers), over those within `window` positions either side."""
    h, d = ctx.num_heads, ctx.head_dim
    if PADDED not in meta.aux:
        meta.aux[PADDED] = padded_rows(meta, qkv.device)
    layout = meta.aux[PADDED]
    b = len(meta.query_lens_host)
    x, mask = qkv, None
    if layout is not None:
        rows, mask = layout
        x = qkv.new_zeros(b * mask.shape[-1], qkv.shape[1]).index_copy_(0, rows, qkv)
    q, k, v = x.view(b, -1, 3, h, d).permute(2, 0, 3, 1, 4)  # each [B, heads, L, D]
    if window is not None:
        band = _band(meta, q.shape[2], window, qkv.device)
        mask = band if mask is None else mask & band
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = out.transpose(1, 2).reshape(-1, h * d)
    return out if layout is None else out.index_select(0, layout[0])


def _band(meta: AttentionMetadata, length: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [L, L]: the keys within `window` positions of each query (made once a step)."""
    key = (BAND, window)
    if key not in meta.aux:
        pos = torch.arange(length, device=device)
        meta.aux[key] = (pos[None, :] - pos[:, None]).abs() <= window
    return meta.aux[key]


class EncoderLayer(OptLayer):
    """OPT's post-norm layer (`post_norm`) with bidirectional attention (module docstring)."""

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        return self.o_proj(bidirectional(self.qkv(x), self.ctx, step.meta))


class BertModel(LearnedPositionsModel):
    """BERT, RoBERTa and XLM-RoBERTa (module docstring)."""

    layer_class = EncoderLayer

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        super().read_model_tensors(w, ctx)
        f = self.config.family
        self.token_types = None  # a cross-encoder's pairs: type 1 after the first [SEP]
        if f.sep_token_id >= 0:
            self.token_types = w[TOKEN_TYPES]
        else:  # every token segment 0: its row folded into the position table
            self.positions_table = self.positions_table + w[TOKEN_TYPES][0]
        self.embed_norm = self.read_norm(w, EMBED_NORM)
        self.classifier_head = None
        if f.num_labels:  # dense -> tanh -> out (`bert_config`'s HEAD_DENSE, HEAD_OUT)
            self.classifier_head = ClassifierHead([
                ("linear", w[HEAD_DENSE], w[_bias(HEAD_DENSE)]), ("act", "tanh"),
                ("linear", w[HEAD_OUT], w[_bias(HEAD_OUT)])])  # fmt: skip

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = super().input_embeddings(input_ids, positions)
        if self.token_types is not None:
            h = h + F.embedding(pair_types(input_ids, positions, self.config.family.sep_token_id),
                                self.token_types)  # fmt: skip
        return layer_norm(x=h, weight=self.embed_norm, eps=self.config.rms_norm_eps)


def _bias(weight: str) -> str:
    return weight[: -len("weight")] + "bias"


def pair_types(input_ids: torch.Tensor, positions: torch.Tensor, sep: int) -> torch.Tensor:
    """int64 [T]: each token's type in a pair "[CLS] a [SEP] b [SEP]" (BERT's pair encoding): 1
    after its prompt's first [SEP], else 0. Each prompt is whole in the step (positions from 0),
    so its first row is ``t - positions[t]``; counted on the device, no host sync."""
    is_sep = (input_ids == sep).long()
    before = torch.cumsum(is_sep, 0) - is_sep  # the [SEP]s before each row, in the whole batch
    start = torch.arange(len(input_ids), device=input_ids.device) - positions
    return (before - before[start] > 0).long()
