"""GGUFs of the hybrid state-space models (Mamba2 mixers among attention layers) as llama.cpp's
converter writes them, read into the names, tensors and `FamilyConfig` fields of the models the
safetensors loader builds (`gguf_archs` lists them with the other families of architectures of
their own; `gguf_loader` reads their tensors back through `mamba_value`, `joined` and
`suffixless_name`):

- granitehybrid (Granite 4.0-H, and Bamba): the Mamba2 layers where the per-layer
  `attention.head_count_kv` is 0, the mixer from `ssm.*` (`time_step_rank`: its heads), its
  tensors back in the checkpoint's forms (`mamba_value`: A_log from `ssm_a` = -exp(A_log), A, D
  and the grouped `ssm_norm` flat, the squeezed conv [C, 1, K]; `ssm_dt.bias` the dt bias), the
  shared MLP's (`ffn_*`, `ffn_*_shexp` beside experts) and the experts' gate and up read back
  as one `input_linear` (`JOINED`), Q/K permuted, Granite's scalars; rotary only with
  `rope.scaling.finetuned` (llama.cpp's), on `rope.dimension_count` of each head (Bamba's half).
- nemotron_h (Nemotron-H, dense): the same mixer; attention where the per-layer
  `attention.head_count_kv` is not 0, an ungated ReLU² MLP block where `feed_forward_length` is
  not, a Mamba2 mixer elsewhere; no rotary; Q/K permuted (no rotary: the scores the same).
- nemotron_h_moe (Nemotron 3): the same, a MoE block where `feed_forward_length` is not 0:
  ReLU² experts (`ffn_*_exps`, stacked) routed by V3's sigmoid router (`exp_probs_b`,
  `expert_weights_scale`, `expert_weights_norm`, `expert_group_count`: one group, as the
  converter writes no `expert_group_used_count`), the shared expert (`ffn_*_shexp`), the
  latent projections where `moe_latent_size` is set. Pure `mamba2` files are not read.
- falcon-h1 (Falcon-H1): the mixer (as Granite 4.0-H's tensors) beside attention in every
  layer, `ffn_norm` its `pre_ff_layernorm`; the µP multipliers baked into the weights by the
  converter (embedding, lm_head, q/k/v, o, the mixer's in (by z/x/B/C/dt part) and out, the
  MLP's gate and down): none applied; the mixer's norm after the gate, as llama.cpp's graph
  (the file does not keep `mamba_norm_before_gate`), none without `ssm_norm`; Q/K as stored
  (NeoX rotary).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch

ARCHS = ("granitehybrid", "nemotron_h", "nemotron_h_moe", "falcon-h1")  # the files'
# llama.cpp's per-layer names -> the engine's, where they differ from Llama's
NAMES: dict[str, dict[str, str]] = {
    # Granite 4.0-H: the Mamba2 mixer; the shared MLP (ffn_* dense, ffn_*_shexp beside experts)
    # and GraniteMoe's experts, gate and up read back as one (`JOINED`)
    "granitemoehybrid": {"ssm_in": "mamba.in_proj", "ssm_out": "mamba.out_proj",
                         "ssm_conv1d": "mamba.conv1d", "ssm_norm": "mamba.norm",
                         "ffn_down": "shared_mlp.output_linear",
                         "ffn_down_shexp": "shared_mlp.output_linear",
                         "ffn_gate_inp": "block_sparse_moe.router.layer",
                         "ffn_down_exps": "block_sparse_moe.output_linear",
                         **{f"ffn_{p}{x}": f"{to}.{p}" for p in ("gate", "up")
                            for x, to in (("", "shared_mlp.input_linear"),
                                          ("_shexp", "shared_mlp.input_linear"),
                                          ("_exps", "block_sparse_moe.input_linear"))}},
    # Nemotron-H: the Mamba2 mixer (its MLP blocks' ffn_up / ffn_down, its norm: Llama's names)
    "nemotron_h": {"ssm_in": "mamba.in_proj", "ssm_out": "mamba.out_proj",
                   "ssm_conv1d": "mamba.conv1d", "ssm_norm": "mamba.norm",
                   # its MoE blocks (`nemotron_h_moe`): the router, the experts stacked
                   # [E, N, K] (`model/nemotron_h.py` slices them), the shared expert, the
                   # latent projections (Nemotron 3 Super's)
                   "ffn_gate_inp": "mlp.gate", "ffn_up_exps": "mlp.experts.up_proj",
                   "ffn_down_exps": "mlp.experts.down_proj",
                   "ffn_up_shexp": "mlp.shared_experts.up_proj",
                   "ffn_down_shexp": "mlp.shared_experts.down_proj",
                   "ffn_latent_down": "mlp.fc1_latent_proj",
                   "ffn_latent_up": "mlp.fc2_latent_proj"},
    # Falcon-H1: the Mamba2 mixer beside attention in every layer, its MLP and norm's names
    "falcon_h1": {"ssm_in": "mamba.in_proj", "ssm_out": "mamba.out_proj",
                  "ssm_conv1d": "mamba.conv1d", "ssm_norm": "mamba.norm",
                  "ffn_norm": "pre_ff_layernorm", "ffn_gate": "feed_forward.gate_proj",
                  "ffn_up": "feed_forward.up_proj", "ffn_down": "feed_forward.down_proj"},
}  # fmt: skip
# engine tensors stored as parts (gate rows, then up rows): the parts' names (as `gguf_archs.hf_name`
# gives them, `<whole>.gate.weight`, `<whole>.up.weight`) read back as one `<whole>.weight`
JOINED = {"granitemoehybrid": ("shared_mlp.input_linear", "block_sparse_moe.input_linear")}
JOINED_PARTS = ("gate", "up")
# names without a weight/bias suffix in the engine's checkpoints
BARE = {("granitemoehybrid", "ssm_dt"): "mamba.dt_bias",
        ("nemotron_h", "ssm_dt"): "mamba.dt_bias",
        ("nemotron_h", "exp_probs_b"): "mlp.gate.e_score_correction_bias",
        ("falcon_h1", "ssm_dt"): "mamba.dt_bias"}  # fmt: skip
# the Mamba2 mixer's tensors llama.cpp names without a suffix (`blk.N.ssm_a`): A as -exp(A_log)
# and D, each [n_head, 1]
SUFFIXLESS = {"ssm_a": "mamba.A_log", "ssm_d": "mamba.D"}
_SUFFIXLESS = re.compile(r"^blk\.(\d+)\.(ssm_a|ssm_d)$")
Get = Callable[..., Any]  # get(key, default): the file's `<arch>.<key>`


def suffixless_name(name: str, architecture: str) -> str | None:
    """The engine's name of a Mamba2 `blk.N.ssm_a` / `blk.N.ssm_d` (None for another tensor)."""
    m = _SUFFIXLESS.match(name)
    if m is None or architecture not in ("granitemoehybrid", "nemotron_h", "falcon_h1", "mamba",
                                         "falcon_mamba", "mamba2"):  # fmt: skip
        return None
    return f"model.layers.{m.group(1)}.{SUFFIXLESS[m.group(2)]}"


def joined(names, architecture: str) -> dict[str, tuple[str, str]]:
    """The engine's tensors read as two of the file's joined (gate rows, then up rows; `JOINED`):
    {whole: (gate part, up part)} over the engine `names` the file has."""
    out = {}
    for name in names:
        for whole in JOINED.get(architecture, ()):
            prefix, sep, kind = name.rpartition(f"{whole}.gate.")
            if sep and kind in ("weight", "bias"):
                parts = (name, f"{prefix}{whole}.up.{kind}")
                if parts[1] in names:
                    out[f"{prefix}{whole}.{kind}"] = parts
    return out


def mamba_value(name: str, w: torch.Tensor) -> torch.Tensor:
    """A Mamba2 mixer's tensor as the checkpoint holds it, from llama.cpp's form: A_log from
    A = -exp(A_log), A and D [n_head, 1] flat, the conv [channels, width] as [channels, 1,
    width], the norm [groups, channels / groups] flat."""
    if name.endswith("mamba.A_log"):  # (Mamba-1's [d_inner, d_state] kept whole)
        a = torch.log(-w)
        return a.flatten() if a.dim() == 2 and a.shape[-1] == 1 else a
    if name.endswith(("mamba.D", "mamba.norm.weight")):
        return w.flatten()
    if name.endswith("mamba.conv1d.weight") and w.dim() == 2:
        return w[:, None, :]
    return w


def mamba_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The checkpoint's shape of a tensor `shape` in the file (`mamba_value`'s reshapes)."""
    if name.endswith(("mamba.A_log", "mamba.D", "mamba.norm.weight")):
        return (math.prod(shape),)
    if name.endswith("mamba.conv1d.weight") and len(shape) == 2:
        return (shape[0], 1, shape[1])
    return shape


def family_fields(get: Get, gguf_arch: str, layers: int, tensors: set[str]) -> dict[str, Any]:
    """`FamilyConfig` fields of a hybrid's file (`tensors`: its names)."""
    if gguf_arch == "falcon-h1":
        return _falcon_h1(get, layers, tensors)
    return _mamba_hybrid(get, gguf_arch, layers, tensors)


def _per_layer(get: Get, gguf_arch: str, key: str, layers: int) -> list[int]:
    values = get(key)
    if not isinstance(values, list) or len(values) != layers:
        raise ValueError(f"GGUF {gguf_arch} needs {key} with a value for each of its {layers} "
                         "layers (0 where the layer has none)")  # fmt: skip
    return [int(v) for v in values]


def _mamba_hybrid(get: Get, gguf_arch: str, layers: int, tensors: set[str]) -> dict[str, Any]:
    """Granite 4.0-H's and Nemotron-H's Mamba2 mixers from `ssm.*` (`time_step_rank`: the
    heads, `inner_size` over them: a head's width), on the layers whose per-layer
    `attention.head_count_kv` is 0 (and, Nemotron-H's, `feed_forward_length` too: else an MLP
    block, ungated ReLU²); Granite's rotary only with `rope.scaling.finetuned` (llama.cpp's
    test: its Bamba), Nemotron-H's none. Granite's scalars and experts are read as
    granitemoe's."""
    from pagoda.runtime.recurrent_configs import MambaConfig

    kv = _per_layer(get, gguf_arch, "attention.head_count_kv", layers)
    nemotron = gguf_arch in ("nemotron_h", "nemotron_h_moe")
    ffn = [False] * layers
    if nemotron:
        ffn = [bool(f) for f in _per_layer(get, gguf_arch, "feed_forward_length", layers)]
    mamba = [not k and not f for k, f in zip(kv, ffn)]
    mlp = ffn if gguf_arch == "nemotron_h" else [False] * layers
    ssm, heads, inner = _ssm_sizes(get, gguf_arch)
    first = next((i for i, m in enumerate(mamba) if m), 0)
    config = MambaConfig(layers=tuple(mamba), n_heads=heads, head_dim=inner // heads,
                         d_state=int(ssm["state_size"]), n_groups=int(ssm["group_count"]),
                         d_conv=int(ssm["conv_kernel"]),
                         conv_bias=f"blk.{first}.ssm_conv1d.bias" in tensors,
                         proj_bias=f"blk.{first}.ssm_in.bias" in tensors,
                         mlp_layers=tuple(mlp) if nemotron else (), ssm_float32=nemotron,
                         moe=_nemotron_experts(get, ffn) if gguf_arch == "nemotron_h_moe" else None)  # fmt: skip
    fields: dict[str, Any] = {"mamba": config}
    if nemotron:  # (its state in float32: transformers' default)
        fields.update(gated_mlp=False, hidden_act="relu2")
    if nemotron or not get("rope.scaling.finetuned"):  # NoPE
        fields["rope_layers"] = (False,) * layers
    return fields


def _ssm_sizes(get: Get, gguf_arch: str) -> tuple[dict[str, Any], int, int]:
    """The Mamba2 mixer's `ssm.*` keys (all required), its head count and inner width."""
    keys = ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")
    ssm = {k: get(f"ssm.{k}") for k in keys}
    missing = [f"ssm.{k}" for k, v in ssm.items() if not v]
    if missing:
        raise ValueError(f"GGUF {gguf_arch} needs {', '.join(missing)}")
    heads, inner = int(ssm["time_step_rank"]), int(ssm["inner_size"])
    if inner % heads:
        raise ValueError(f"GGUF {gguf_arch} ssm.inner_size {inner} is not a multiple of its "
                         f"{heads} heads (ssm.time_step_rank)")  # fmt: skip
    return ssm, heads, inner


def _falcon_h1(get: Get, layers: int, tensors: set[str]) -> dict[str, Any]:
    """Falcon-H1 as llama.cpp runs it: a Mamba2 mixer beside attention in every layer, the
    mixer's output gated then normed by group (`ssm_norm` where the file has it, else gated
    only); the µP multipliers are in the weights (the converter's), so none is applied."""
    from pagoda.runtime.recurrent_configs import FalconH1Scales, MambaConfig

    ssm, heads, inner = _ssm_sizes(get, "falcon-h1")
    config = MambaConfig(layers=(True,) * layers, n_heads=heads, head_dim=inner // heads,
                         d_state=int(ssm["state_size"]), n_groups=int(ssm["group_count"]),
                         d_conv=int(ssm["conv_kernel"]),
                         conv_bias="blk.0.ssm_conv1d.bias" in tensors,
                         proj_bias="blk.0.ssm_in.bias" in tensors,
                         gated_norm="blk.0.ssm_norm.weight" in tensors, norm_before_gate=False,
                         parallel_attention=True, falcon=FalconH1Scales())  # fmt: skip
    return {"mamba": config}


def _nemotron_experts(get: Get, layers: list[bool]):
    """Nemotron 3's MoE blocks (on `layers`) as llama.cpp's converter writes them: V3's
    sigmoid router in one group (it writes `expert_group_count`, not the groups used)."""
    from pagoda.runtime.model_configs import ExpertRouting
    from pagoda.runtime.recurrent_configs import NemotronHExperts

    groups = int(get("expert_group_count", 1) or 1)
    if groups != 1:
        raise ValueError(f"GGUF nemotron_h_moe expert_group_count {groups} is not supported "
                         "(1: the file does not say how many groups are used)")  # fmt: skip
    routing = ExpertRouting(scoring="sigmoid", topk_method="noaux_tc", n_group=1, topk_group=1,
                            routed_scaling_factor=float(get("expert_weights_scale", 1.0) or 1.0))  # fmt: skip
    latent = int(get("moe_latent_size", 0) or 0)
    return NemotronHExperts(
        layers=tuple(layers), num_experts=int(get("expert_count")),
        top_k=int(get("expert_used_count")), intermediate=int(get("expert_feed_forward_length")),
        shared_intermediate=int(get("expert_shared_feed_forward_length")), routing=routing,
        norm_topk_prob=bool(get("expert_weights_norm", False)), latent=latent or None,
    )  # fmt: skip
