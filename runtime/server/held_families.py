"""The bytes one rank holds of a family's own tensors, those no other family's rule counts
(`held_apart.held_apart` asks `HELD[architecture]` before its generic rules): a Linear per
expert of stacked experts, a family's tensors kept in float32 or used as tensors rather than
Linears. Each function returns the bytes, None for a `Linear`'s matrix (counted with its
layer), or `GENERIC` for a tensor the generic rules count."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pagoda.runtime.model.gemma4_config import GEMMA4_LAYERS
from pagoda.runtime.model.inkling2_config import held_share
from pagoda.runtime.model.inkling_config import kv_conv_share
from pagoda.runtime.server.placement import Placement, dense_bytes, float32_router_bytes
from pagoda.runtime.server.stored import Stored

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

GENERIC = -1  # not the family's own: the generic rules count it
# a norm's weight (Gemma 4's `post_feedforward_layernorm_1`, `_2`, `pre_feedforward_layernorm_2`)
NORM = re.compile(r"norm(_\d)?\.weight$")
_KDA_TENSORS = re.compile(
    r"self_attn\.(([qkv]_)?conv1d\.weight|(forget_gate\.)?(A_log|dt_bias)|o_norm\.weight)$"
)  # (GLM-5-Next's A_log and dt_bias under forget_gate.)


# Gemma 3n's AltUp router and coefficients a layer (tensors: `gemma3n.AltUp`), and the wrapper's
# tables of image and audio token ids (`Gemma3nModel.embed_tokens`)
_ALTUP_COEFS = re.compile(
    r"\.altup\.(prediction_coefs|correction_coefs|modality_router)\.weight$"
    r"|^model\.embed_(vision|audio)\.embedding\.weight$"
)


def _gemma4(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """Gemma 4's and Gemma 3n's (model/gemma4.py, gemma3n.py): AltUp's router and coefficients
    and the wrapper's token tables, tensors in the dtype; the per-layer inputs' table (an
    embedding, not a Linear); a Linear per expert of the MoE block's stacked experts."""
    if mc.family.gemma4 is None:
        return GENERIC
    if _ALTUP_COEFS.search(name) or name == "model.embed_tokens_per_layer.weight":
        return t.numel * p.dtype.itemsize
    if name.endswith(("experts.gate_up_proj", "down_proj")):
        return dense_bytes([t], mc, lay, p) if len(t.shape) == 3 else None
    return GENERIC


def _ergo(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """Ergo (model/ergo.py): a Linear per expert of each [in, out] slice, transposed, a rank's
    experts whole (split by expert); its residual gates float32 as their two factors; its norms
    and expert norms (a rank's experts') in float32; its embedding table float32 (a rank's
    vocabulary rows, counted with the vocabulary's)."""
    if name.endswith(("experts.up_proj", "experts.down_proj")):
        e, a, b = t.shape
        whole = type(lay)(0, 1)  # (an expert's matrices are not split)
        return dense_bytes([Stored(name, t.kind, (e // lay.size, b, a), t.nbytes)], mc, whole, p)
    if name.endswith("residual_gate.weight"):
        return t.numel * 8
    if name.endswith("experts.norm"):
        return t.numel // lay.size * 4
    if NORM.search(name):
        return t.numel * 4
    return GENERIC


def _aria(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """Aria: a Linear per expert of each [in, out] slice, transposed, under a per-expert
    matrix's name (rows or columns split: `rank_share._local`); its router DeepSeek's kind."""
    if name.endswith(("experts.gate_up_proj", "down_proj")):
        e, a, b = t.shape
        return dense_bytes([Stored(name + ".weight", t.kind, (e, b, a), t.nbytes)], mc, lay, p)
    if name.endswith("mlp.router.weight"):
        return float32_router_bytes(t, p)
    return GENERIC


def _stacked_experts(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """MiniMax-M3's (and Zaya's) stacked experts: a Linear per expert."""
    if name.endswith(("experts.gate_up_proj", "down_proj")):
        return dense_bytes([t], mc, lay, p) if len(t.shape) == 3 else None
    return GENERIC


def _zaya(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """Zaya: its stacked experts; its convs (tensors, in the dtype: a rank's heads' channels)
    and balancing biases (float32)."""
    held = _stacked_experts(name, t, mc, lay, p)
    if held != GENERIC:
        return held
    if ".conv_qk_" in name:
        return t.numel // lay.size * p.dtype.itemsize
    if name.endswith("balancing_biases"):
        return t.numel * 4
    return GENERIC


def _recurrent_gemma(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """RecurrentGemma (model/recurrent_gemma.py): the RG-LRU's gates and conv, tensors in the
    dtype, its decay's softplus parameter in float32; a rank's gate blocks' and channels'."""
    if ".rg_lru." in name or ".conv_1d." in name:
        return t.numel // lay.size * (4 if name.endswith("recurrent_param") else p.dtype.itemsize)
    return GENERIC


def _rwkv(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """RWKV: its mixes in the dtype (whole on every rank), the decay and bonus in float32 (a
    rank's channels')."""
    if name.endswith(("time_decay", "time_first")):
        return t.numel // lay.size * 4
    if ".time_" in name:
        return t.numel * p.dtype.itemsize
    return GENERIC


def _zamba(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """Zamba: its mixers' per-head x_proj and dt_proj, tensors in the dtype (a rank's heads')."""
    if name.endswith(("_proj_weight", "dt_proj_bias")):
        return t.numel // lay.size * p.dtype.itemsize
    return GENERIC


def _inkling(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """Inkling's and Inkling 2's (model/inkling.py, inkling2.py): a Linear per expert, routed
    or shared (the shared experts' gate and up one Linear each: None, grouped); the convs, the
    router and its scale and correction bias in float32; the relative-logit profiles a
    tensor."""
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        return dense_bytes([t], mc, lay, p)
    if name.endswith(("shared_experts.gate_proj", "shared_experts.up_proj")):
        return None
    if name.endswith(("k_sconv.conv1d.weight", "v_sconv.conv1d.weight")):  # a rank's KV heads'
        return int(t.numel * kv_conv_share(name, mc, lay)) * 4
    if mc.architecture == "inkling2" and (share := held_share(name, mc, lay)) is not None:
        return int(t.numel * share) * 4  # (its scales by heads, k/v taps by KV heads)
    # (Inkling 2's static taps, clip scales and block-residual queries too)
    if name.endswith(("conv1d.weight", "mlp.gate.weight", "gate.global_scale",
                      "gate.e_score_correction_bias", "static_weight", "norm.scale",
                      ".query")):  # fmt: skip
        return t.numel * 4
    if name.endswith("rel_logits_proj.proj"):
        return t.numel * p.dtype.itemsize
    if name.startswith("model.middle_cycle_cross_pass_"):  # (Inkling2Loop's, float32)
        return t.numel * 4
    if "_message_gate." in name:  # its message gates: tensors, the two up float32
        return t.numel * (p.dtype.itemsize if name.endswith("down_proj.weight") else 4)
    return GENERIC


def _kda(name: str, t: Stored, mc: ModelConfig, lay, p: Placement) -> int | None:
    """The KDA mixers' convs, A_log, dt_bias and output norm (Kimi Linear's, Bailing's,
    GLM-5-Next's): float32, but Kimi Linear's conv in the dtype; a rank's heads' share."""
    if _KDA_TENSORS.search(name):
        conv = name.endswith("conv1d.weight") and mc.architecture == "kimi_linear"
        whole = name.endswith("o_norm.weight")  # (one head's: every rank's; the rest its heads')
        return t.numel // (1 if whole else lay.size) * (p.dtype.itemsize if conv else 4)
    return GENERIC


# architecture -> its own tensors' bytes
HELD = {
    **dict.fromkeys(GEMMA4_LAYERS, _gemma4),
    "ergo": _ergo,
    "aria_text": _aria,
    "minimax_m3": _stacked_experts,
    "zaya": _zaya,
    "recurrent_gemma": _recurrent_gemma,
    "rwkv": _rwkv,
    "zamba": _zamba,
    **dict.fromkeys(("inkling", "inkling2"), _inkling),
    **dict.fromkeys(("kimi_linear", "bailing_hybrid", "glm5_next"), _kda),
}
