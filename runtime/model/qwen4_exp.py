"""Qwen4-Exp's text model (`Qwen4ExpForCausalLM`, and `Qwen4ExpForConditionalGeneration` read
text-only; config in `qwen4_exp_config.py`): Qwen3.5-MoE's layers (`qwen3_next.py`: Gated
DeltaNet, gated attention, experts beside a shared expert) between hyper-connections, with
Per-Layer Embeddings of hashed n-grams on some DeltaNet layers, as transformers'
`Qwen4ExpTextModel` computes them:

- the residual is ``hc_count`` streams [T, hc x hidden] (the embedding repeated); before the
  mixer and before the MLP a `HyperConnection` normalises each stream (RMSNorm per stream,
  (1 + w)), mixes them into the block's input with low-rank sigmoid weights (their mean) and
  gives each stream an injection weight 2 sigmoid(.): stream += weight x the block's output. No
  other norm: the final `HyperConnection` (no injection) gives what the LM head reads;
- `Ple` (a layer `ple_layer_ids` names, before its hyper-connection): the token's n-grams
  (orders 2 .. ``ngram_size``, the tokens before it from the engine's history: a step's rows
  and, before its first, `llama.TOKEN_HISTORY`; a token before an end-of-sequence token reads
  as that token, as transformers' ``_shift_right_ignore_eos``) hashed into their heads' tables,
  projected to a value and one key per stream; sigmoid(signed sqrt of key . normed stream)
  gates the value per stream; a depthwise conv of ``ple_conv_kernel_size`` taps
  ``ngram_size`` apart (SiLU) over the normalised gated values is added to them. The conv's
  last (taps - 1) x ``ngram_size`` inputs are kept per sequence in the DeltaNet layer's
  state slot, past its own conv state (`MambaConfig.extra_conv_rows`), so chunked prefill,
  preemption and prefix hits see what one pass would; the n-gram tokens come from the token
  history, the same on every path;
- the DeltaNet's output gate SiLU or sigmoid (``output_gate_type``).

Batched over the step: the n-gram and conv gathers are index tensors built once a step from
its host lengths (`_step_plan`), no loop over sequences. The attention layers' QSA indexer and
the sparse attention it selects: `qwen4_qsa.py`. Tensor parallelism: Qwen3.5-MoE's split (the
DeltaNet by key heads, attention by heads, the experts by width); the hyper-connections, the
PLE (its conv's inputs past every rank's DeltaNet conv rows) and the QSA indexer whole on
every rank, alike (their inputs are the streams every rank holds); the n-gram history crosses
with the step (`worker/step_channel.py`). FP8 is refused (`family_options.py`).
Prefix caching keeps the PLE conv's inputs in the DeltaNet layers' snapshots (the rows past
their conv state: saved at a chunk's end with them, and at boundaries inside a chunk from the
step's rows, `Prefill.snap_mid`); a prefix hit's first rows read the tokens before them from
the history as any chunk does.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import TOKEN_HISTORY, LayerContext, LlamaModel, Step
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, save_chunk_ends
from pagoda.runtime.model.qwen3_next import GatedDeltaNet, Qwen3NextLayer, Qwen3NextModel
from pagoda.runtime.model.qwen4_exp_config import Qwen4Exp
from pagoda.runtime.model.qwen4_qsa import POSITIONS, QsaIndexer, sparse_gqa

PLAN = "qwen4_plan"  # `meta.aux`: the step's `_StepPlan`


def _to(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    """`a` on `dev` (through pinned memory to a GPU: no sync)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dev.type == "cpu" else t.pin_memory().to(dev, non_blocking=True)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, group: int) -> torch.Tensor:
    """RMSNorm over each `group` of x's last dim, times `weight` (float32, 1 + w), in float32,
    rounded once (transformers' `Qwen4ExpTextRMSNorm` with ``group_size``)."""
    y = x.float().unflatten(-1, (-1, group))
    y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    return (y * weight).to(x.dtype)


class HyperConnection:
    """transformers' `Qwen4ExpTextGatedResidual`: (the block's input [T, hidden], the streams'
    injection weights [T, hc]); the final mixer's (no ``block_inject_weight``): the input."""

    def __init__(self, ctx: LayerContext, w: DeviceWeights, p: str, q: Qwen4Exp, hidden: int):
        self.hc, self.hidden, self.eps = q.hc_count, hidden, ctx.eps
        self.norm = 1 + w.source(p + "hc_norm.weight").float().to(w.device)
        self.down = ctx.linear(w[p + "input_mix_weight_down.weight"])
        self.up = ctx.linear(w[p + "input_mix_weight_up.weight"])
        inject = p + "block_inject_weight.weight"
        self.inject = ctx.linear(w[inject]) if inject in w else None

    def linears(self) -> list:
        return [x for x in (self.down, self.up, self.inject) if x is not None]

    def __call__(self, h: torch.Tensor):
        t, hc = h.shape[0], self.hc
        n = _norm(h, self.norm, self.eps, self.hidden)
        mix = torch.sigmoid(self.up(F.silu(self.down(n) / hc)))
        x = (mix.view(t, hc, self.hidden) * n.view(t, hc, self.hidden)).mean(dim=1)
        if self.inject is None:
            return x
        return x, 2 * torch.sigmoid(self.inject(n) / hc)


def _inject(h: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The streams plus each one's weight times the block's output."""
    return h + (out[:, None, :] * weights[:, :, None]).flatten(1)


@dataclasses.dataclass
class _StepPlan:
    """A step's gathers, built once from its host lengths (module docstring)."""

    shifted: torch.Tensor  # int64 [ngram_size, T]: each row's token, the one before, ...
    taps: torch.Tensor  # int64 [kernel, T]: each tap's row of [states, rows] (`Ple._conv`)
    ends: torch.Tensor  # int64 [B * L]: each sequence's new state rows of [states, rows]
    starts: torch.Tensor  # int64 [B]: each sequence's first row of [states, rows]


def _step_plan(q: Qwen4Exp, ids: torch.Tensor, meta: AttentionMetadata) -> _StepPlan:
    """The step's `_StepPlan` (in `meta.aux`), its index arrays built on the host from the
    query lengths and copied in one transfer; the rows' n-gram tokens gathered on the device
    from `ids` and `llama.TOKEN_HISTORY`. Rows of sequence b at offset p: a tap reaching d rows
    back reads row - d (p >= d) or the kept input L + p - d of b's state (L: `ple_state_len`)."""
    plan = meta.aux.get(PLAN)
    if plan is not None:
        return plan
    qlens = np.asarray(meta.query_lens_host, dtype=np.int64)
    b, t, n, k = len(qlens), int(qlens.sum()), q.ngram_size - 1, q.ple_kernel
    cu = np.concatenate([[0], np.cumsum(qlens)])
    seq = np.repeat(np.arange(b), qlens)
    pos = np.arange(t) - cu[seq]
    big_l, dil = q.ple_state_len, q.ngram_size
    back = dil * (k - 1 - np.arange(k))[:, None]  # [k, 1] each tap's distance back
    taps = np.where(pos >= back, b * big_l + np.arange(t) - back, seq * big_l + big_l + pos - back)
    e = qlens[:, None] + np.arange(big_l)  # [B, L] the new state's places in [state, rows]
    ends = np.where(
        e >= big_l, b * big_l + cu[:-1, None] + e - big_l, np.arange(b)[:, None] * big_l + e
    )
    # the tokens j = 1 .. n before each row: the step's rows, else the history (-1: none)
    j = np.arange(1, n + 1)[:, None]
    inside = pos >= j
    rows = np.where(inside, np.arange(t) - j, 0)
    hist = np.where(inside, 0, seq * n + n - j + pos)
    parts = [rows, hist, inside, taps, ends, b * big_l + cu[:-1]]
    flat = _to(np.concatenate([a.reshape(-1).astype(np.int64) for a in parts]), ids.device)
    rows, hist, inside, taps, ends, starts = flat.split([a.size for a in parts])
    history = meta.aux[TOKEN_HISTORY].reshape(-1)
    before = torch.where(inside.view(n, t).bool(), ids[rows.view(n, t)], history[hist.view(n, t)])
    eos = q.eos_token_id
    before = torch.where(before < 0, eos, before)
    shifted = [ids]
    cut = torch.zeros_like(ids, dtype=torch.bool)
    for i in range(n):  # in an n-gram, a token before an end-of-sequence token reads as eos
        shifted.append(torch.where(cut, eos, before[i]))
        cut = cut | (before[i] == eos)
    plan = _StepPlan(torch.stack(shifted), taps.view(k, t), ends, starts)
    meta.aux[PLAN] = plan
    return plan


class Ple:
    """transformers' `Qwen4ExpTextPLELayer` (module docstring) of one layer."""

    def __init__(self, model: LlamaModel, w: DeviceWeights, p: str, q: Qwen4Exp, ple_index: int):
        c, ctx = model.config, model.ctx
        self.q, self.hidden, self.eps = q, c.hidden_size, c.rms_norm_eps
        self.sizes, self.offsets, rows = q.head_tables(ple_index)
        e = p + "ple_embedding."
        # as transformers saves it: in shards (``split_ngram_parts``), or whole
        names = [e + "ngram_embedding.weight"]
        if names[0] not in w:
            names = []
            while f"{e}ngram_embedding.shard_{len(names)}.weight" in w:
                names.append(f"{e}ngram_embedding.shard_{len(names)}.weight")
        got = sum(w.stored[n].shape[0] for n in names)
        if got != rows:
            raise ValueError(f"checkpoint tensor {e}ngram_embedding has {got} rows, "
                             f"config.json's n-gram heads need {rows}")  # fmt: skip
        self.table = w[names[0]]
        if len(names) > 1:  # the shards copied in one by one (the table is most of the model)
            first, self.table = self.table, None
            self.table = first.new_empty(rows, first.shape[1])
            at = 0
            for n in names:
                part = first if n == names[0] else w[n]
                self.table[at : at + part.shape[0]] = part
                at += part.shape[0]
            del first, part
        dev = w.device
        self.mult = q.multipliers(c.vocab_size, ple_index).to(dev)
        per = q.heads_per_ngram
        self.mod = torch.tensor(self.sizes, dtype=torch.long, device=dev).view(-1, per)
        self.off = torch.tensor(self.offsets, dtype=torch.long, device=dev).view(-1, per)
        self.key = ctx.linear(w[p + "key_proj.weight"])
        self.value = ctx.linear(w[p + "value_proj.weight"])
        self.norms = [1 + w.source(p + n).float().to(dev)
                      for n in ("norm_key.weight", "norm_query.weight", "norm_conv.weight")]  # fmt: skip
        self.conv = w[p + "conv1d.weight"][:, 0, :].float()  # [hc x hidden, kernel]

    def linears(self) -> list:
        return [self.key, self.value]

    def _embeddings(self, shifted: torch.Tensor) -> torch.Tensor:
        """[T, ple_embed_dim]: each order's heads' rows of the table, concatenated."""
        blocks, mixed = [], shifted[0] * self.mult[0]
        for order in range(1, self.q.ngram_size):
            mixed = torch.bitwise_xor(mixed, shifted[order] * self.mult[order])
            ids = torch.remainder(mixed[:, None], self.mod[order - 1]) + self.off[order - 1]
            blocks.append(ids)
        return F.embedding(torch.cat(blocks, dim=-1), self.table).flatten(1)

    def __call__(self, h: torch.Tensor, step: Step, index: int) -> torch.Tensor:
        t, hc, hidden = h.shape[0], self.q.hc_count, self.hidden
        plan = step.meta.aux[PLAN]
        emb = self._embeddings(plan.shifted)
        k_norm, q_norm, c_norm = self.norms
        key = _norm(self.key(emb), k_norm, self.eps, hidden).view(t, hc, hidden)
        query = _norm(h, q_norm, self.eps, hidden).view(t, hc, hidden)
        gate = (key * query).sum(dim=-1, keepdim=True) / math.sqrt(hidden)
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = (torch.sigmoid(gate) * self.value(emb)[:, None, :]).flatten(1)
        return gated + self._conv(_norm(gated, c_norm, self.eps, hidden), plan, step, index)

    def _conv(self, x: torch.Tensor, plan: _StepPlan, step: Step, index: int) -> torch.Tensor:
        """SiLU of the dilated depthwise conv of `x` [T, C] over each sequence's kept inputs
        and its rows; the last ones kept again in the layer's state slot (module docstring)."""
        ms: MambaStep = step.meta.aux[MAMBA_STEP]
        conv = ms.states[index][0]
        c, big_l = x.shape[1], self.q.ple_state_len
        kept = conv[:, conv.shape[1] - c * big_l // conv.shape[2] :].view(conv.shape[0], c, big_l)
        b = ms.slots.shape[0]
        start = kept.index_select(0, ms.slots).transpose(1, 2).reshape(b * big_l, c)
        ext = torch.cat([start.to(x.dtype), x])
        out = ext[plan.taps[0]].float() * self.conv[:, 0]
        for j in range(1, self.conv.shape[1]):
            out += ext[plan.taps[j]].float() * self.conv[:, j]
        new = ext[plan.ends].view(b, big_l, c).transpose(1, 2)
        kept.index_copy_(0, ms.slots, new.to(kept.dtype))
        mid = None if ms.prefill is None else ms.prefill.snap_mid
        if mid is not None:  # prefix caching: the inputs before boundaries inside chunks
            seq, off, entry = mid[0] + ms.num_decodes, mid[1], mid[2]
            e = off[:, None] + torch.arange(big_l, device=x.device)
            src = torch.where(
                e >= big_l, plan.starts[seq, None] + e - big_l, seq[:, None] * big_l + e
            )
            snap = ms.snaps[index][0]
            at = snap[:, snap.shape[1] - kept.shape[1] * big_l // snap.shape[2] :]
            at = at.view(snap.shape[0], c, big_l)
            at.index_copy_(0, entry, ext[src].transpose(1, 2).to(at.dtype))
        return F.silu(out.to(x.dtype))


class Qwen4DeltaNet(GatedDeltaNet):
    """Qwen3.5's Gated DeltaNet reading its conv state's first `conv_dim` rows (the PLE's past
    them), its output gate SiLU or sigmoid."""

    def __init__(self, m, w, prefix, index, eps, ctx, act: str):
        super().__init__(m, w, prefix, index, eps, ctx)
        self.act = torch.sigmoid if act == "sigmoid" else F.silu

    def __call__(self, h: torch.Tensor, step: MambaStep) -> torch.Tensor:
        conv, state = step.states[self.index]
        if conv.shape[1] == self.m.conv_dim:
            return super().__call__(h, step)
        c, i = self.m.conv_dim, self.index
        snaps = step.snaps
        if snaps is not None:
            snaps = {**snaps, i: (snaps[i][0][:, :c], snaps[i][1])}
        mine = dataclasses.replace(step, states={**step.states, i: (conv[:, :c], state)},
                                   snaps=snaps, save_end=None)  # fmt: skip
        out = super().__call__(h, mine)
        save_chunk_ends(step, i)  # the whole rows: the PLE conv's inputs with them
        return out

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        t, dtype = o.shape[0], o.dtype
        y = o.float()
        y = self.norm * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        y = y * self.act(z.float().view(t, *o.shape[1:]))
        return y.to(dtype).view(t, -1)


class Qwen4ExpLayer(Qwen3NextLayer):
    """Per-Layer Embeddings (some DeltaNet layers), then the mixer and the MLP, each between
    its hyper-connection's mix and injection (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c = model.config
        q: Qwen4Exp = c.family.qwen4
        if c.family.mamba.layers[index]:  # no norms of its own: the hyper-connections'
            self.ctx, self.index = ctx, index
            self.mlp = model.make_mlp(w, prefix, index, ctx)
            self.mixer = Qwen4DeltaNet(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx,
                                       q.gate_act)  # fmt: skip
        else:
            super().__init__(model, w, prefix, index, ctx)
        h = c.hidden_size
        self.attn_hc = HyperConnection(ctx, w, prefix + "attn_hyper_connection.", q, h)
        self.mlp_hc = HyperConnection(ctx, w, prefix + "mlp_hyper_connection.", q, h)
        self.indexer = None
        if self.mixer is None and q.indexer_heads:
            rope = model.rope_caches["global"]
            self.indexer = QsaIndexer(w, prefix, q, c.rms_norm_eps, ctx, rope)
            self.side_tables = [self.indexer.keys, self.indexer.blocks_table]
        self.ple = None
        if index in q.ple_layers:
            self.ple = Ple(model, w, prefix + "ple.", q, q.ple_layers.index(index))

    def linears(self):
        mine = [*self.attn_hc.linears(), *self.mlp_hc.linears()]
        if self.ple is not None:
            mine += self.ple.linears()
        if self.indexer is not None:
            mine += self.indexer.linears()
        if self.mixer is None:
            return [*super().linears(), *mine]
        return [*self.mixer.linears(), *self.mlp.linears(), *mine]

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """Gated attention over every earlier token while the step's sequences are within the
        QSA indexer's dense reach (the backend's), else over each token's kept slots
        (`qwen4_qsa`); the indexer's raw keys stored either way."""
        ix, meta, ctx = self.indexer, step.meta, self.ctx
        if ix is None:
            return super().attention(x, step)
        k_cache, v_cache = step.kv_caches[self.index]
        slots = k_cache.numel() // (ctx.num_kv_heads * ctx.head_dim)
        q_index = ix.query_and_store(x, meta, k_cache, slots)
        if meta.max_seq_len <= ix.dense_limit:
            return super().attention(x, step)
        t, d = x.shape[0], ctx.head_dim
        q, k, v = self.rotated_qkv(x, step)
        backend = ctx.backend
        backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        kept_slots, kept = ix.select(q_index, meta)
        out = sparse_gqa(q, backend, k_cache, v_cache, kept_slots, kept, backend.scale)
        return self.o_proj(self.attention_output(x, out.reshape(t, ctx.num_heads * d)))

    def __call__(self, h: torch.Tensor, residual: None, step: Step) -> tuple[torch.Tensor, None]:
        if self.ple is not None:
            h = h + self.ple(h, step, self.index)
        x, weights = self.attn_hc(h)
        if self.mixer is not None:
            out = self.mixer(x, step.meta.aux[MAMBA_STEP])
        else:
            out = self.attention(x, step)
        h = _inject(h, out, weights)
        x, weights = self.mlp_hc(h)
        return _inject(h, self.mlp(x), weights), None


class Qwen4ExpModel(Qwen3NextModel):
    """Qwen4-Exp's text model (module docstring)."""

    layer_class = Qwen4ExpLayer

    def __init__(self, config, weights, **kwargs) -> None:
        q: Qwen4Exp = config.family.qwen4
        self.token_history = q.ngram_size - 1 if q.ple_layers else 0
        super().__init__(config, weights, **kwargs)

    def layer_context(self, linear):
        self.ctx = super().layer_context(linear)
        return self.ctx

    def read_norm(self, w: DeviceWeights, name: str):
        if name == "model.norm.weight" and name not in w:  # (the final hyper-connection's)
            return None
        return super().read_norm(w, name)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        q, p = self.config.family.qwen4, "model.hyper_connection_mixer."
        self.final_mix = HyperConnection(ctx, w, p, q, self.config.hidden_size)

    def linears(self):
        return [*super().linears()[:-1], *self.final_mix.linears(), self.lm_head]

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        meta.aux[POSITIONS] = positions  # (the QSA indexer's rotary)
        if self.token_history:  # the step's n-gram tokens and conv gathers, once
            _step_plan(self.config.family.qwen4, input_ids, meta)
        return super().forward(input_ids, positions, kv_caches, meta, logits_indices, head)

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids).repeat(1, self.config.family.qwen4.hc_count)

    def final_hidden(self, h: torch.Tensor, residual: None) -> torch.Tensor:
        return self.final_mix(h)
