"""One rank's share of a checkpoint tensor under tensor parallelism (`distributed.layout`,
`model.parallel_linear`, `moe.py`, `model/mamba_shard.py`), for the weights estimate
(`server/weights.py`): q by its heads, k and v by its KV heads, o and down by input columns,
gate/up and the experts by rows, the vocabulary padded, a Mamba2 mixer by its heads (a KDA
layer's too); a family's own tensors by its rule (`distributed/tp_families.RANK_ROWS`: Gemma 4's
layers, Laguna's, MiMo-V2-Flash's, ...)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from pagoda.runtime.distributed import tp_families

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
    a stacked [E, N, K] tensor's per expert, a vector's (elements, 1). A layer's tensor by its
    family's rule (`tp_families.RANK_ROWS`), else a KDA, lightning or latent attention layer's,
    else the shared rules (`_shared`); the rest whole but the vocabulary's rows."""
    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (math.prod(shape), 1)
    if lay.size == 1:
        return rows, cols
    if name in (EMBED, HEAD):
        start, stop = lay.vocab(rows)
        return stop - start, cols
    m = _LAYER.match(name)
    if m is None:  # the final norm, ...: whole
        return rows, cols
    layer, part = int(m.group(1)), m.group(2)
    for rule in (tp_families.rank_rows, _kda_local, _mla_local):
        if (local := rule(layer, part, rows, cols, mc, lay)) is not None:
            return local
    return _shared(name, part, shape, rows, cols, mc, lay)


def _shared(name, part, shape, rows, cols, mc: ModelConfig, lay) -> tuple[int, int]:
    """(rows, columns) of a layer's tensor `part` on rank 0 of `lay` by the rules every family
    shares: q by its heads, k and v by its KV heads, o and down by input columns, gate/up and
    the experts by rows, a Gated DeltaNet's or Mamba mixer's by its heads; the rest whole
    (norms, the router, o's and down's biases)."""
    if re.search(r"\bqkv_proj\.(weight|bias)$", part):  # Phi-3's fused q/k/v (model/phi3.py)
        (q0, q1), (k0, k1) = lay.heads(mc.num_heads), lay.kv_heads(mc.num_kv_heads)
        return (q1 - q0 + 2 * (k1 - k0)) * mc.head_dim, cols
    if re.search(r"\b[qk]_norm\.weight$", part) and len(shape) == 2:  # Cohere's, per head
        h0, h1 = lay.heads(shape[0]) if part.startswith("self_attn.q") else lay.kv_heads(shape[0])
        return (h1 - h0) * shape[1], 1
    if part.startswith("linear_attn."):  # Qwen3-Next's, OLMo Hybrid's: by heads, the norm whole
        if part.startswith(("linear_attn.norm.", "linear_attn.o_norm.")):  # (OLMo Hybrid's o_)
            return rows, cols
        out = "out_proj." in part or "o_proj." in part
        return (rows, cols // lay.size) if out else (rows // lay.size, cols)
    if re.search(r"\bq_proj\.(weight|bias)$", part):
        q0, q1 = lay.heads(mc.num_heads)
        gated = mc.family.mamba is not None and mc.family.mamba.attn_output_gate  # (its gates)
        return (q1 - q0) * mc.head_dim * (2 if gated else 1), cols
    if re.search(r"\b[kv]_proj\.(weight|bias)$", part):
        k0, k1 = lay.kv_heads(mc.num_kv_heads)
        return (k1 - k0) * mc.head_dim, cols
    if part.startswith(("mamba.", "mamba_decoder.mamba.")):  # (the latter Zamba's and
        # Zamba2's hybrid layers') this rank's rows of in_proj, columns of out_proj, heads'
        share = _mamba_share(name, mc, lay)
        mamba1 = mc.family.mamba is not None and mc.family.mamba.mixer == "mamba1"
        by_cols = "out_proj.weight" in part or (mamba1 and "x_proj.weight" in part)
        return (rows, int(cols * share)) if by_cols else (int(rows * share), cols)
    if part.endswith(".weight") and _row_parallel(name):
        return rows, cols // lay.size  # input columns
    if re.search(r"(gate_proj|up_proj|w1|w3|input_linear|c_fc)\.(weight|bias)$", part):
        return rows // lay.size, cols  # output rows (experts: their intermediate width)
    return rows, cols


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


def _mamba_share(name: str, mc: ModelConfig, lay) -> float:
    """The part of a Mamba2 mixer's tensor one rank holds (`model/mamba_shard.py`): in_proj's
    rows, the conv's channels, out_proj's input columns, the heads' A, D, dt_bias and norm
    (out_proj's bias whole)."""
    from pagoda.runtime.model import mamba_shard

    m = mc.family.mamba
    if lay.size == 1 or m is None or name.endswith("out_proj.bias"):
        return 1.0
    loc = mamba_shard.shard(m, lay).local
    if m.mixer in ("mamba1", "short_conv"):  # Mamba-1's (`model/mamba1.py`; Jamba's dt/B/C
        # norms whole) and LFM2's conv (`model/lfm2.py`): by channels
        return 1.0 if "_layernorm." in name else loc.d_inner / m.d_inner
    if "in_proj." in name:
        return _in_proj_rows(loc) / _in_proj_rows(m)
    if "conv1d." in name:
        return loc.conv_dim / m.conv_dim
    return loc.n_heads / m.n_heads  # A_log, D, dt_bias; norm and out_proj by d_inner alike


def _in_proj_rows(m) -> int:
    return m.d_inner + m.conv_dim + m.n_heads


def _mla_local(layer: int, part: str, rows: int, cols: int, mc: ModelConfig, lay):
    """A rank's (rows, columns) of a latent attention matrix split by heads (q_proj or q_b_proj:
    `model/deepseek.py`); None for the others and for models without latent attention."""
    m = mc.family.mla
    if m is None:
        return None
    q0, q1 = lay.heads(mc.num_heads)
    if re.search(r"\bq_(b_)?proj\.(weight|bias)$", part):
        return (q1 - q0) * (m.qk_head_dim + m.output_gate * m.v_head_dim), cols  # (A.X-K2's)
    if part == "self_attn.g_proj.weight":  # Dots3 Note's gate: a row per head
        return q1 - q0, cols
    return None
