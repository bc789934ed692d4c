"""One rank's share of a checkpoint tensor under tensor parallelism (`distributed.layout`,
`model.parallel_linear`, `moe.py`, `model/mamba_shard.py`), for the weights estimate
(`server/weights.py`): q by its heads, k and v by its KV heads, o and down by input columns,
gate/up and the experts by rows, the vocabulary padded, a Mamba2 mixer by its heads (a KDA
layer's too)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _row_parallel(name: str) -> bool:
    down = ("o_proj.weight", "down_proj.weight", "output_linear.weight", "mlp.c_proj.weight",
            "mamba.out_proj.weight")  # fmt: skip
    return name.endswith(down) or bool(re.search(r"experts\.(\d+\.)?(down_proj|w2)\.weight$", name))


def _local(name: str, shape: tuple[int, ...], mc: ModelConfig, lay) -> tuple[int, int]:
    """(rows, columns) of tensor `name` on rank 0 of `lay` (`model.parallel_linear`, `moe.py`);
    a stacked [E, N, K] tensor's per expert, a vector's (elements, 1)."""
    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (math.prod(shape), 1)
    if lay.size == 1:
        return rows, cols
    m = _LAYER.match(name)
    part = m.group(2) if m else ""
    if name in (EMBED, HEAD):
        start, stop = lay.vocab(rows)
        return stop - start, cols
    if mc.family.gemma4 is not None and m:  # its layers' own head sizes and KV heads
        return _gemma4_local(int(m.group(1)), part, rows, cols, mc, lay)
    if mc.family.mimo is not None and m and (mimo := _mimo_rows(int(m.group(1)), part, mc, lay)):
        return mimo, cols
    if mc.family.laguna is not None and part in (
        "self_attn.q_proj.weight",
        "self_attn.g_proj.weight",
    ):
        g = mc.family.laguna  # each layer's query heads (model/laguna.py), its gates with them
        q0, q1 = lay.heads(g.heads[int(m.group(1))])
        per_head = part.startswith("self_attn.g") and g.gate_per_head
        return (q1 - q0) * (1 if per_head else mc.head_dim), cols
    if m and (kda := _kda_local(int(m.group(1)), part, rows, cols, mc, lay)) is not None:
        return kda
    if mc.family.mla is not None and (m_rows := _mla_rows(part, mc, lay)) is not None:
        return m_rows, cols
    if re.search(r"gate_up_proj_adapter_list\.\d+\.1\.weight$", part):  # Zamba2's adapters'
        return rows // lay.size, cols  # B: gate_up's rows (`model/zamba2.py`; A whole)
    if re.search(r"\blora_qkv\.\d+\.1\.weight$", part):  # its q/k/v adapters' B (`held_forms`)
        (q0, q1), (k0, k1) = lay.heads(mc.num_heads), lay.kv_heads(mc.num_kv_heads)
        return (q1 - q0 + 2 * (k1 - k0)) * mc.head_dim, cols
    if re.search(r"\bqkv_proj\.(weight|bias)$", part):  # Phi-3's fused q/k/v (model/phi3.py)
        (q0, q1), (k0, k1) = lay.heads(mc.num_heads), lay.kv_heads(mc.num_kv_heads)
        return (q1 - q0 + 2 * (k1 - k0)) * mc.head_dim, cols
    if re.search(r"\b[qk]_norm\.weight$", part) and len(shape) == 2:  # Cohere's, per head
        h0, h1 = lay.heads(shape[0]) if part.startswith("self_attn.q") else lay.kv_heads(shape[0])
        return (h1 - h0) * shape[1], 1
    if part.startswith(
        "linear_attn."
    ):  # Qwen3-Next's, OLMo Hybrid's: every part by heads, the norm whole
        if part.startswith(("linear_attn.norm.", "linear_attn.o_norm.")):  # (OLMo Hybrid's o_)
            return rows, cols
        out = "out_proj." in part or "o_proj." in part
        return (rows, cols // lay.size) if out else (rows // lay.size, cols)
    if re.search(r"\bq_proj\.(weight|bias)$", part):
        q0, q1 = lay.heads(mc.num_heads)
        gated = mc.family.mamba is not None and mc.family.mamba.attn_output_gate  # (its gates)
        gated = gated or mc.architecture == "minicpm5_moe"  # (MiniCPM5-MoE's too)
        return (q1 - q0) * mc.head_dim * (2 if gated else 1), cols
    if part == "self_attn.gate_bias":  # Beam's output gate's, one per head: the rank's heads
        q0, q1 = lay.heads(mc.num_heads)
        return q1 - q0, 1
    if re.search(r"\b[kv]_proj\.(weight|bias)$", part):
        k0, k1 = lay.kv_heads(mc.num_kv_heads)
        return (k1 - k0) * mc.head_dim, cols
    if part.startswith(
        ("mamba.", "mamba_decoder.mamba.")  # (Zamba's and Zamba2's hybrid layers' under the latter)
    ):  # this rank's rows of in_proj, columns of out_proj, heads' vectors
        share = _mamba_share(name, mc, lay)
        mamba1 = mc.family.mamba is not None and mc.family.mamba.mixer == "mamba1"
        by_cols = "out_proj.weight" in part or (mamba1 and "x_proj.weight" in part)
        return (rows, int(cols * share)) if by_cols else (int(rows * share), cols)
    if part.endswith(".weight") and _row_parallel(name):
        return rows, cols // lay.size  # input columns
    if re.search(r"(gate_proj|up_proj|w1|w3|input_linear|c_fc)\.(weight|bias)$", part):
        return rows // lay.size, cols  # output rows (experts: their intermediate width)
    return rows, cols  # norms, the router, o's and down's biases: whole on every rank


# a KDA layer's projections split by its heads (`model/kimi_linear.py`): q, k, v, beta's, the
# forget and output gates' full-rank or second low-rank factors (GLM-5-Next's forget gate's
# under `forget_gate.`)
_KDA_ROWS = re.compile(r"self_attn\.(forget_gate\.)?([qkvb]_proj|[fg]_proj|[fg]_b_proj)\.weight$")


# a lightning layer's (MiniMax-Text-01's, `model/minimax.py`): q/k/v and the output gate by heads
_LIGHTNING_ROWS = re.compile(r"self_attn\.(qkv_proj|output_gate)\.weight$")


def _kda_local(layer: int, part: str, rows: int, cols: int, mc: ModelConfig, lay):
    """(rows, columns) of a KDA layer's projection on one rank (`model/kimi_linear.py`): q, k,
    v, b and the gates' per-head factors by rows, o_proj by input columns, the gates' first
    low-rank factors whole; a lightning layer's (`model/minimax.py`) q/k/v, output gate and
    norm by rows, o_proj by columns; None for other layers and tensors."""
    m = mc.family.mamba
    if m is None or m.mixer not in ("kda", "lightning") or not m.layers[layer]:
        return None
    if m.mixer == "lightning" and part.startswith("self_attn.norm."):  # (all heads': split)
        return rows // lay.size, cols
    if _KDA_ROWS.search(part) or _LIGHTNING_ROWS.search(part):
        return rows // lay.size, cols
    if part.endswith("self_attn.o_proj.weight"):
        return rows, cols // lay.size
    return None


def _gemma4_local(layer: int, part: str, rows: int, cols: int, mc: ModelConfig, lay):
    """(rows, columns) of a Gemma 4 / Gemma 3n layer's tensor on one rank (`model/gemma4.py`):
    q by its heads and k/v by its KV heads of the layer's head size, o, the MLP's down and the
    experts' down by input columns, gate/up and the experts' gate_up by rows; the rest whole
    (norms, the router, per-layer inputs, AltUp, Laurel)."""
    g = mc.family.gemma4
    d = g.head_dims[layer]
    if part == "self_attn.q_proj.weight":
        q0, q1 = lay.heads(mc.num_heads)
        return (q1 - q0) * d, cols
    if part in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        k0, k1 = lay.kv_heads(g.kv_heads[layer])
        return (k1 - k0) * d, cols
    if part in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "experts.down_proj"):
        return rows, cols // lay.size
    if part in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "experts.gate_up_proj"):
        return rows // lay.size, cols
    return rows, cols


def _mimo_rows(layer: int, part: str, mc: ModelConfig, lay) -> int | None:
    """A rank's rows of MiMo-V2-Flash's k and v (the layer's own KV heads, split or replicated;
    values `v_head_dim` wide): `model/mimo_v2_flash.py`; None for the others."""
    kv, d = mc.kv_layer_shapes[layer][0], mc.head_dim
    if part in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        k0, k1 = lay.kv_heads(kv)
        return (k1 - k0) * (d if part.startswith("self_attn.k") else mc.family.mimo.v_head_dim)
    return None


def _mamba_share(name: str, mc: ModelConfig, lay) -> float:
    """The part of a Mamba2 mixer's tensor one rank holds (`model/mamba_shard.py`): in_proj's
    rows, the conv's channels, out_proj's input columns, the heads' A, D, dt_bias and norm
    (out_proj's bias whole)."""
    from pagoda.runtime.model import mamba_shard

    m = mc.family.mamba
    if lay.size == 1 or m is None or name.endswith("out_proj.bias"):
        return 1.0
    loc = mamba_shard.shard(m, lay).local
    if m.mixer == "mamba1":  # Jamba's: by channels (`model/mamba1.py`), its dt/B/C norms whole
        return 1.0 if "_layernorm." in name else loc.d_inner / m.d_inner
    if "in_proj." in name:
        return _in_proj_rows(loc) / _in_proj_rows(m)
    if "conv1d." in name:
        return loc.conv_dim / m.conv_dim
    return loc.n_heads / m.n_heads  # A_log, D, dt_bias; norm and out_proj by d_inner alike


def _in_proj_rows(m) -> int:
    return m.d_inner + m.conv_dim + m.n_heads


def _mla_rows(part: str, mc: ModelConfig, lay) -> int | None:
    """A rank's rows of a latent attention matrix split by heads (q_proj or q_b_proj:
    `model/deepseek.py`); None for the others."""
    m, (q0, q1) = mc.family.mla, lay.heads(mc.num_heads)
    if re.search(r"\bq_(b_)?proj\.(weight|bias)$", part):
        return (q1 - q0) * (m.qk_head_dim + m.output_gate * m.v_head_dim)  # (A.X-K2's gates)
    if part == "self_attn.g_proj.weight":  # Dots3 Note's gate: a row per head
        return q1 - q0
    return None
