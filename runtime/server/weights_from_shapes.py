"""One rank's weights from a model's shapes alone (`from_shapes`): the estimate for a directory
without weight files (a config.json alone, `weights.estimate`) and for the plans `fit.Plan`
suggests; the projections, norms, experts and a hybrid's mixers counted from `ModelConfig`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pagoda.runtime.model_config import indexer_params

if TYPE_CHECKING:
    import torch
    from pagoda.runtime.config import ModelConfig


# hidden-wide vectors a layer holds beyond Llama's two norms, in the model's dtype, whole on
# every rank: AfMoE's (and Beam's) two more norms, JetMoE's attention and MLP output biases
EXTRA_LAYER_VECTORS = {
    "afmoe": 2,
    "jetmoe": 2,
    "kolibri1": 2,
    "kolibri1_1": 2,
    "beam": 2,
}  # (Kolibri 1: GLM-4's)


def _rank_shapes(shapes: dict[str, tuple[int, ...]], mc: ModelConfig, tp: int) -> dict:
    """Rank 0's part of each tensor of `shapes` (`rank_share._local`; kv_b_proj, held as the
    absorbed W_UK and W_UV, by heads)."""
    if tp == 1:
        return shapes
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.server.rank_share import _local

    lay = TPLayout(0, tp)
    return {n: (s[0] // tp, s[1]) if n.endswith("kv_b_proj.weight") else _local(n, s, mc, lay)
            for n, s in shapes.items()}  # fmt: skip


def from_shapes(mc: ModelConfig, dtype: torch.dtype, fp8: bool, tp: int = 1) -> int:
    """One rank's weights from the model's shape alone (no weight files to read; `fit`'s other
    plans): the decoder's projections at one byte plus a float32 scale per output row where
    they run in FP8, the rest in ``dtype``; q, o, the MLP, experts and vocabulary split over
    ``tp`` ranks, K and V by the rank's KV heads (replicated when fewer than ranks), the FP8
    scales of row-parallel o and down whole on every rank, norms (q/k norms too) and routers on
    every rank; q/k/v biases by the rank's heads, o's and the LM head's (PhiMoE's) whole;
    Qwen2-MoE's shared expert as a dense MLP (FP8 too)."""
    h, i, n, t = mc.hidden_size, mc.intermediate_size, mc.num_layers, tp
    item = dtype.itemsize
    f = mc.family
    if f.gemma4 is not None:  # (16 or 32 bits: `family_options` refuses FP8)
        from pagoda.runtime.model.gemma4_config import param_count

        return param_count(mc, tp) * item
    if f.dsv4 is not None:  # DeepSeek-V4: its tensors as a rank holds them (model/dsv4_shard.py)
        from pagoda.runtime.distributed.layout import TPLayout
        from pagoda.runtime.model.dsv4_shard import held_bytes

        return held_bytes(f.dsv4, dtype, TPLayout(0, tp))
    if mc.architecture == "longcat_flash":  # (16 or 32 bits: `family_options`)
        from pagoda.runtime.model.checkpoint_shapes import expected_shapes
        from pagoda.runtime.model.longcat_flash_config import weight_bytes

        return weight_bytes(_rank_shapes(expected_shapes(mc), mc, tp), item)
    moe = sum(f.has_experts(x) for x in range(n))
    kv = max(1, mc.num_kv_heads // t)  # this rank's K and V heads: split, or replicated
    attn, attn_rows = _attention_shape(mc, t, kv)
    norms = _norms_and_biases(mc, item, t, kv)
    absorbed = 0.0  # latent attention's W_UK and W_UV, dense in the dtype whatever runs in FP8
    if f.mla is not None:
        absorbed = n * _kv_b_rows(mc.num_heads, f.mla) / t * f.mla.kv_lora_rank * item
        ix = f.mla.indexer  # DeepSeek Sparse Attention's, whole on every rank
        if ix is not None:  # weights_proj in float32 (GLM-5-Next's k-pool one: not)
            proj = 0 if ix.kpool else sum(ix.full_layers) * ix.n_heads * h
            absorbed += (indexer_params(h, f.mla) - proj) * item + proj * 4
    mlp = (n - moe) * (3 if f.gated_mlp else 2) * h * i / t  # an ungated MLP: up and down
    if fp8:  # one byte each, a float32 scale per output row (o's and down's rows are whole on
        # every rank: split by input columns, their scales replicated)
        rows = n * attn_rows + (n - moe) * ((2 if f.gated_mlp else 1) * i / t + h)
        projections = n * attn + mlp + 4 * rows
    else:
        projections = (n * attn + mlp) * item
    experts, routers, shared = _expert_bytes(mc, item, fp8, t, moe)
    projections += shared
    width = f.embed_proj_dim or h  # (OPT's narrower embeddings, projected in and out)
    head = 0 if mc.tie_word_embeddings else f.head_rows or mc.vocab_size  # (a pruned head)
    embed = (mc.vocab_size + head) * width * item
    if mc.architecture == "gpt_oss":  # biases, sinks (float32)
        heads = mc.num_heads / t
        biases = (heads + 2 * kv) * mc.head_dim + h  # q/k/v this rank's, o's whole
        biases += f.num_experts * (2 * f.moe_intermediate_size / t + h + 1)  # experts, router
        projections += n * biases * item + n * 4 * heads
    if mc.architecture == "glm5_next":  # its mHC hyper-connections, in float32 (one rank)
        nh = f.hyper.mult
        projections += 4 * n * 2 * ((2 + nh) * nh * (nh * h + 1) + 3)
    elif f.hyper is not None:  # HY V4's (16 or 32 bits): attention's gates in the dtype (this
        # rank's heads'); the hyper-connections, sinks and the indexer key's norm in float32
        nh, m, ix = f.hyper.mult, mc.num_heads / t, f.mla.indexer
        projections += n * m * f.mla.v_head_dim * h * item
        projections += 4 * (n * (2 * (2 * nh * nh * h + 2 * nh + 2) + m) + nh * nh * h + nh + 1)
        projections += sum(ix.full_layers) * 2 * ix.head_dim * (4 - item)
    if f.attention_sinks and mc.architecture != "gpt_oss":  # GraniteSWA's, Flint's sinks (f32)
        projections += n * 4 * mc.num_heads / t
    if f.mimo is not None:  # its attention by layer kind, the sinks (16 or 32 bits)
        from pagoda.runtime.model.mimo_v2_flash_config import attention_bytes

        projections += attention_bytes(mc, item, t) - n * attn * item
    if f.kolibri11 is not None:  # its KV-shared layers: no k/v projections nor k norm
        shared, rows = sum(map(f.kolibri11.shares_kv, range(n))), 2 * kv * mc.head_dim
        projections -= shared * ((rows * h + 4 * rows if fp8 else rows * h * item)
                                 + mc.head_dim * item)  # fmt: skip
    hybrid = _hybrid_bytes(mc, item, fp8, t)  # Mamba2 mixers (`recurrent_configs.MambaConfig`)
    return math.ceil(projections + absorbed + (experts + embed) / t + norms) + routers + hybrid


def _attention_shape(mc: ModelConfig, t: int, kv: int) -> tuple[float, float]:
    """(weights, output rows) of one layer's attention projections on one of `t` ranks, `kv`
    its KV heads: q and o split by heads, k and v its KV heads; AFMoE's output gate as q;
    DeepSeek's latent attention as its projections (`_mla_matrices`)."""
    h, d = mc.hidden_size, mc.head_dim
    attn = h * d * (2 * mc.num_heads / t + 2 * kv)
    attn_rows = (mc.num_heads / t + 2 * kv) * d + h
    if mc.architecture in ("afmoe", "minicpm5_moe", "beam"):  # attention's output gate (as q)
        attn += h * d * mc.num_heads / t
        attn_rows += mc.num_heads / t * d
    if mc.family.laguna is not None:  # query heads by layer (their mean), the softplus gate
        g = mc.family.laguna  # (16 or 32 bits: `family_options` refuses FP8)
        heads, gates = sum(g.heads) / mc.num_layers / t, 1 if g.gate_per_head else d
        attn = h * d * (2 * heads + 2 * kv) + h * heads * gates
        attn_rows = (heads + 2 * kv) * d + h + heads * gates
    if mc.architecture == "jetmoe":  # every attention expert's q and o, the shared k/v (the
        # rank's KV heads: `jetmoe_config.tp_problem`), the router whole
        e, kv_width = mc.family.num_experts, kv * d
        attn = h * kv_width * (2 * e + 2) + e * h
        attn_rows = (e + 2) * kv_width + h + e
    if mc.family.mla is not None:
        mats = _mla_matrices(h, mc.num_heads, mc.family.mla, t)
        attn, attn_rows = sum(r * c for r, c in mats), sum(r for r, _ in mats)
    return attn, attn_rows


def _norms_and_biases(mc: ModelConfig, item: int, t: int, kv: int) -> float:
    """The norms (q/k norms too), biases, OPT's embedding projections and a learned position
    table on one of `t` ranks, `kv` its KV heads: whole on every rank, q/k/v biases by the
    rank's heads."""
    h, d, n, f = mc.hidden_size, mc.head_dim, mc.num_layers, mc.family
    if mc.architecture == "gpt_oss":  # its norms in float32 (its biases and sinks: from_shapes)
        return (2 * n + 1) * h * 4
    norms = (2 * n + 1) * h * item
    if mc.architecture == "nemotron_h":  # one norm a block, and the final one, in float32
        norms = (n + 1) * h * 4
    if mc.architecture in ("mamba", "falcon_mamba"):  # one norm a layer (no MLP)
        norms = (n + 1) * h * item
    norms += EXTRA_LAYER_VECTORS.get(mc.architecture, 0) * n * h * item
    if mc.architecture == "axk1":  # a norm on each MoE block's output
        norms += sum(f.has_experts(x) for x in range(n)) * h * item
    if mc.architecture == "bitnet":  # its sub-norms: attention's output, the MLP's product
        norms += n * (h + mc.intermediate_size) / t * item  # (a rank's channels)
        if mc.family.bitnet == "offline":  # the packed layers' scales, one per output column
            qkv = (mc.num_heads / t + 2 * kv) * d  # (a rank's rows; o's and down's whole)
            norms += n * (qkv + 2 * h + 2 * mc.intermediate_size / t) * item
    if f.cohere_layer:  # one norm a layer; Cohere's LayerNorm weights in float32
        norms = (n + 1) * h * (item if f.cohere_rms_norm else 4)
    if f.layer_norm_bias:  # LayerNorms with biases (StarCoder2's, PhiMoE's)
        norms *= 2
    if f.qk_norm_whole:  # q/k norms over all heads (OLMo 2's, MiniMax-M2's), whole on every rank
        norms += n * (mc.num_heads + mc.num_kv_heads) * d * item
    elif f.qk_norm:  # over each head (Qwen3's)
        norms += n * 2 * d * item
    if mc.attention_bias:  # q/k/v biases this rank's; o's (PhiMoE's) whole, as the LM head's
        norms += n * ((mc.num_heads / t + 2 * kv) * d + h * f.o_proj_bias) * item
    norms += mc.vocab_size * item * f.lm_head_bias
    if f.mla is not None:  # DeepSeek's latent attention's two norms
        norms += n * (f.mla.kv_lora_rank + (f.mla.q_lora_rank or 0)) * item
        norms += n * f.mla.qk_rope_head_dim * item * f.mla.dots  # (Dots3's rotary key norm)
    if f.gated_norm_rank:  # A.X-K2's norm gates (W_down, W_up): every layer's, the experts'
        gated = n + sum(f.has_experts(x) for x in range(n))
        norms += gated * 2 * h * f.gated_norm_rank * item
    if mc.architecture == "beam":  # attention's gate bias, one per head, by the rank's heads
        norms += n * mc.num_heads / t * item
    if f.embed_proj_dim:
        norms += 2 * h * f.embed_proj_dim * item
    if f.positions in ("learned", "sinusoidal"):  # the table (stored or computed), every rank's
        norms += (mc.max_position_embeddings + f.position_offset) * h * item
    return norms


def _expert_bytes(mc: ModelConfig, item: int, fp8: bool, t: int, moe: int):
    """(experts, routers, shared experts) of the `moe` expert layers: the experts whole (the
    caller splits them over the ranks), the routers whole on every rank (DeepSeek's in float32,
    with V3's correction bias), a shared expert as a dense MLP split over `t` ranks (FP8 with
    the projections, gate/up split by rows, down by columns) and Qwen2-MoE's gate, whole."""
    h, f = mc.hidden_size, mc.family
    mats = 3 if f.gated_mlp else 2  # (Ergo's experts: up and down)
    experts = moe * f.num_experts * mats * h * f.moe_intermediate_size * item
    routers = moe * f.num_experts * h * item
    if f.routing is not None:
        routers = moe * f.num_experts * (h + f.routing.bias) * 4
    shared = 0.0
    if s := f.shared_expert_intermediate_size:
        shared = moe * (mats * h * s / t + 4 * (2 * s / t + h) if fp8 else mats * h * s / t * item)
        gate = f.routing is None and mc.architecture not in (
            "granitemoe",
            "granitemoe_swa",
        )  # Qwen2-MoE's sigmoid gate
        routers += moe * h * item if gate else 0
    return experts, routers, shared


def _hybrid_bytes(mc: ModelConfig, item: int, fp8: bool, t: int) -> float:
    """What a hybrid's layers hold beyond (or short of) Llama's shape on one of `t` ranks
    (`ModelConfig.hybrid_params`), in bytes; with FP8, the Mamba2 projections, the attention
    and MLPs a layer lacks, and Nemotron-H's experts, shared expert and latent projections at
    one byte plus a float32 scale per output row (row-parallel ones' rows whole)."""
    from pagoda.runtime.model import mamba_shard

    m, h = mc.family.mamba, mc.hidden_size
    if m is None:
        return mc.hybrid_params(t) * item
    if m.mixer == "mamba1":  # (16 or 32 bits: `family_options`) A_log and D in float32
        loc = m.on_ranks(t)  # (`model/mamba1.py`), this rank's channels
        return mc.hybrid_params(t) * item + m.num_layers * loc.d_inner * (loc.d_state + 1) * (
            4 - item
        )
    if not fp8:
        return mc.hybrid_params(t) * item

    def fp8_bytes(rows: float, cols: float, scales: float) -> float:
        return rows * cols + 4 * scales

    loc = mamba_shard.local(m, t)
    in_rows = loc.d_inner + loc.conv_dim + loc.n_heads
    proj = in_rows * h + h * loc.d_inner
    mixer = (loc.mixer_params(h) - proj) * item + proj + 4 * (in_rows + h)
    d, heads, kv = mc.head_dim, mc.num_heads / t, max(1, mc.num_kv_heads // t)
    attn = fp8_bytes(1, h * d * (2 * heads + 2 * kv), (heads + 2 * kv) * d + h)
    out = m.num_layers * mixer - (mc.num_layers - mc.num_kv_layers) * attn
    i = mc.intermediate_size
    if m.mlp_layers:  # an ungated MLP in those layers only
        out -= (mc.num_layers - sum(m.mlp_layers)) * fp8_bytes(2 * h, i / t, i / t + h)
    if (e := m.moe) is not None:
        w, n, s = e.latent or h, e.intermediate / t, e.shared_intermediate / t
        block = e.num_experts * fp8_bytes(2 * w, n, n + w) + fp8_bytes(2 * h, s, s + h)
        block += fp8_bytes(2 * h, e.latent, e.latent + h) if e.latent else 0
        block += e.num_experts * (h + 1) * item  # the router and its bias
        out += sum(e.layers) * block
    return out


def _mla_matrices(h: int, heads: int, m, t: int = 1) -> list[tuple[float, float]]:
    """(rows, columns) on one of `t` ranks of a latent attention layer's projections
    (`model_configs.MlaConfig`, `model/deepseek.py`): q (or q_b) by heads, o by its columns, the
    bottleneck and the latent whole (kv_b, absorbed, is no projection: `_kv_b_rows`)."""
    qk = heads * m.qk_head_dim / t
    q = [(qk, h)] if m.q_lora_rank is None else [(m.q_lora_rank, h), (qk, m.q_lora_rank)]
    if m.output_gate:  # A.X-K2's q_b_proj: each head's q and gate, of [normed | raw] bottleneck
        q[1] = (heads * (m.qk_head_dim + m.v_head_dim) / t, 2 * m.q_lora_rank)
    if m.dots:  # Dots3 Note's gate per head (by heads)
        q.append((heads / t, h))
    return [*q, (m.kv_lora_rank + m.qk_rope_head_dim, h), (h, heads * m.v_head_dim / t)]


def _kv_b_rows(heads: int, m) -> int:
    """kv_b_proj's rows of `heads` heads (W_UK's and W_UV's, `kv_lora_rank` columns each)."""
    return heads * (m.qk_nope_head_dim + m.v_head_dim)
