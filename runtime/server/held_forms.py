"""The per-family rewrites of a checkpoint's stored tensors into the form the model holds them
(`as_held`), for the weights estimate (`server/weights.py`): gpt-oss's stacked or MXFP4
experts, Llama 4's stacked experts, JetMoE's attention experts, Qwen3-Next's and Qwen3.5's
stacked experts, Zamba2's shared blocks and their adapters, Gemma 4's unweighted norms."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pagoda.runtime.model.gemma4_config import GEMMA4_LAYERS
from pagoda.runtime.server.stored import Stored

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

_HELD = "held"  # a tensor made at load (gpt-oss's experts): no stored form to read in place
_GPT_OSS_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)"
                              r"(_blocks|_scales|_bias)?$")  # fmt: skip
# a GGUF's (`gguf_archs`): gate and up apart (or gate_up) and down, as the engine lays them out
_GGUF_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate|up|gate_up|down)"
                           r"\.(weight|bias)$")  # fmt: skip


def as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """The tensors the model reads, renamed and reshaped as the family holds them (its `FORMS`
    entry; another family's as stored)."""
    form = FORMS.get(mc.architecture)
    return tensors if form is None else form(tensors, mc)


def _gemma4_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """Gemma 4's (and Gemma 3n's) tensors with its unweighted norms' weights, made at load."""
    return tensors if mc.family.gemma4 is None else {**tensors, **_gemma4_ones(mc)}


def _gemma4_ones(mc: ModelConfig) -> dict[str, Stored]:
    """Gemma 4's unweighted norms (`Gemma4Model.ones`: no stored tensor, a weight of ones made
    at load, held as its norms are): each layer's v norm (its head size) and, with the MoE
    block, its router's (hidden-wide)."""
    g, out = mc.family.gemma4, {}
    for i in range(mc.num_layers):
        name = f"model.layers.{i}.self_attn.v_norm.weight"
        out[name] = Stored(name, _HELD, (g.head_dims[i],), 0)
        if g.num_experts:
            name = f"model.layers.{i}.router.norm.weight"
            out[name] = Stored(name, _HELD, (mc.hidden_size,), 0)
    return out


def _gpt_oss_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """gpt-oss's experts under names and shapes the rules here read as the engine holds them
    (`gpt_oss.expert_tensors`): gate/up rows [E, 2I, hidden] and down [E, hidden, I] per
    expert `Linear`, from the stacked x @ W tensors or MXFP4 blocks (their scales go with
    them); the biases as vectors, gate/up's split by rows, down's whole on every rank."""
    out = {}
    e, n, h = mc.family.num_experts, mc.family.moe_intermediate_size, mc.hidden_size
    for name, t in tensors.items():
        m = _GPT_OSS_EXPERTS.match(name)
        g = _GGUF_EXPERTS.match(name) if m is None else None
        if g is not None:  # gate and up (and their biases) as one gate_up, like the files'
            prefix, which, kind = g.groups()
            new = f"{prefix}{'down' if which == 'down' else 'gate_up'}_proj.{kind}"
            shape = (e * (2 * n if which != "down" else h),) if kind == "bias" else (
                (e, 2 * n, h) if which != "down" else (e, h, n))  # fmt: skip
            held = out.get(new)
            out[new] = Stored(new, t.kind if kind == "bias" else _HELD, shape,
                              t.nbytes + (held.nbytes if held else 0))  # fmt: skip
            continue
        if m is None:
            out[name] = t
            continue
        prefix, which, suffix = m.groups()
        if suffix == "_scales":
            continue
        if suffix == "_bias":
            new = f"{prefix}{which}.bias"
            out[new] = Stored(new, t.kind, (t.numel,), t.nbytes)
            continue
        shape = (e, 2 * n, h) if which == "gate_up_proj" else (e, h, n)
        new = f"{prefix}{which}.weight"
        out[new] = Stored(new, _HELD, shape, t.nbytes)
    return out


_ZAMBA2_ADAPTER = re.compile(r"^(.+\.self_attn\.)linear_[qkv]_adapter_list\.(\d+)\.([01])\.weight$")


def _zamba2_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """Zamba2's shared blocks as the engine holds them (`model/zamba2.py`): read from each
    block's first use (a copy a later hybrid layer holds is not read, as transformers ties it),
    a use's q/k/v adapters as one `Linear` each way (the three A stacked [3r, 2h], the three B
    one block-diagonal [3 x 2h, 3r])."""
    from pagoda.runtime.model.zamba2_config import block_prefix, shared_name

    z = mc.family.mamba.zamba2
    read = tuple(block_prefix(mc, b) for b in range(min(z.blocks, sum(z.hybrid))))
    out: dict[str, Stored] = {}
    for name, t in tensors.items():
        if f".{shared_name(mc)}." in name and not name.startswith(read):
            continue
        m = _ZAMBA2_ADAPTER.match(name)
        if m is None:
            out[name] = t
            continue
        prefix, use, part = m.groups()
        new = f"{prefix}lora_qkv.{use}.{part}.weight"
        held = out.get(new)
        shape = t.shape
        if held is not None:  # A's rows stacked; B's rows and columns
            shape = (held.shape[0] + t.shape[0], t.shape[1] + (held.shape[1] if part == "1" else 0))
        out[new] = Stored(new, t.kind, shape, t.nbytes + (held.nbytes if held else 0))
    return out


def _jetmoe_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """JetMoE's attention experts as the one Linear each becomes (`_jetmoe_attention`)."""
    return dict(_jetmoe_attention(t) for t in tensors.values())


def _jetmoe_attention(t: Stored) -> tuple[str, Stored]:
    """JetMoE's attention experts (`model/jetmoe.py`) as the one `Linear` each stack loads
    into: `input_linear` [E, Hkv D, hidden] as [E Hkv D, hidden], `output_linear` [E, hidden,
    Hkv D] as [hidden, E Hkv D]; other tensors as read."""
    if ".self_attention.experts." in t.name and len(t.shape) == 3:
        e, a, b = t.shape
        shape = (e * a, b) if t.name.endswith("input_linear.weight") else (a, e * b)
        return t.name, Stored(t.name, t.kind, shape, t.nbytes)
    return t.name, t


def _llama4_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """Llama 4's stacked experts as the Linears they become (`_llama4_experts`)."""
    return dict(_llama4_experts(t) for t in tensors.values())


def _llama4_experts(t: Stored) -> tuple[str, Stored]:
    """Llama 4's stacked experts (`model/llama4.py`), gate_up [E, hidden, 2N] and down
    [E, N, hidden], as the per-expert Linears they load into: GraniteMoe's stacked names and
    layout ([E, 2N, hidden] split by rows, [E, hidden, N] by columns); other tensors as read."""
    for stored, as_linear in (("experts.gate_up_proj", "input_linear.weight"),
                              ("experts.down_proj", "output_linear.weight")):  # fmt: skip
        if t.name.endswith(stored) and len(t.shape) == 3:
            name = t.name.removesuffix(stored) + as_linear
            e, a, b = t.shape
            return name, Stored(name, t.kind, (e, b, a), t.nbytes)
    return t.name, t


def _qwen3_vl_moe_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """Qwen3-VL-MoE's stacked experts (`model/qwen3_vl.py`): the hub's [E, in, out] as Llama
    4's (`_llama4_experts`), transformers 5's [E, out, in] renamed alone (a layer's down_proj
    of [E, hidden, N] says which, as the model reads it)."""
    out = {}
    for name, t in tensors.items():
        stack = name.rsplit(".", 1)[-1]
        if len(t.shape) != 3 or stack not in ("gate_up_proj", "down_proj"):
            out[name] = t
            continue
        down = tensors[name.removesuffix(stack) + "down_proj"]
        if down.shape[1] != mc.hidden_size:  # the hub's layout
            name, t = _llama4_experts(t)
        else:
            linear = "input_linear.weight" if stack == "gate_up_proj" else "output_linear.weight"
            name = name.removesuffix("experts." + stack) + linear
            t = Stored(name, t.kind, t.shape, t.nbytes)
        out[name] = t
    return out


def _bitnet_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """The BitLinear matrices as the engine holds them: made at load (never read in place),
    a packed one four times its stored rows, with a vector of its scale (one per row)."""
    from pagoda.runtime.model.bitnet_config import MATRIX

    if not mc.family.bitnet:
        return tensors
    out = dict(tensors)
    packed = mc.family.bitnet == "offline"
    for name, t in tensors.items():
        if MATRIX.match(name):
            rows = t.shape[0] * (4 if packed else 1)
            out[name] = Stored(name, _HELD, (rows, *t.shape[1:]), t.nbytes)
            if packed:  # its weight_scale repeated over the output columns (`BitLinear.scale`)
                scale = name.removesuffix("weight") + "bitnet_scale"
                out[scale] = Stored(scale, _HELD, (rows,), 0)
    return out


def _stacked_as_held(tensors: dict[str, Stored], mc: ModelConfig) -> dict[str, Stored]:
    """Qwen3-Next's and Qwen3.5's (and Lara-4-Mini's) stacked experts under `.weight` names
    (`qwen3_next_config.stacked_experts`)."""
    from pagoda.runtime.model.qwen3_next_config import stacked_experts

    renamed = stacked_experts(tensors)
    return {renamed.get(n, n): Stored(renamed.get(n, n), t.kind, t.shape, t.nbytes)
            for n, t in tensors.items()}  # fmt: skip


# architecture -> its stored tensors rewritten as the model holds them
FORMS = {
    "gpt_oss": _gpt_oss_as_held,  # stacked or MXFP4 experts
    "llama4": _llama4_as_held,  # stacked experts
    "llama4_vision": _llama4_as_held,  # (the same text model, reading images)
    "qwen3_vl_moe": _qwen3_vl_moe_as_held,  # stacked experts, in either layout
    "jetmoe": _jetmoe_as_held,  # attention experts
    **dict.fromkeys(("qwen3_next", "qwen3_5_moe", "lara_mini"), _stacked_as_held),
    **dict.fromkeys(("zamba2", "zamba"), _zamba2_as_held),  # shared blocks, adapters
    "bitnet": _bitnet_as_held,  # BitLinear matrices, unpacked or quantized at load
    **dict.fromkeys(GEMMA4_LAYERS, _gemma4_as_held),  # unweighted norms' weights
}
