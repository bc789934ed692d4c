"""Qwen3-Next's and Qwen3.5's configs as transformers 5 reads them (`Qwen3NextForCausalLM`,
`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`, and the multimodal
`Qwen3_5ForConditionalGeneration` / `Qwen3_5MoeForConditionalGeneration` read text-only: their
`text_config`, their `model.language_model.` tensors), for `model/qwen3_next.py`; reached
through `mamba_config` (the Gated DeltaNet layers keep a per-sequence state in the hybrids'
state slots). Kept apart from the model so that reading a config imports no layer code.

- `layer_types` ("linear_attention" / "full_attention"; transformers' default: every
  `full_attention_interval`-th layer, 4, attention) picks each layer's mixer;
- the DeltaNet layers: `linear_num_value_heads` heads of `linear_value_head_dim`,
  `linear_num_key_heads` key heads of `linear_key_head_dim`, a conv of
  `linear_conv_kernel_dim` (`MambaConfig.mixer` "gated_deltanet", chunks of 64 as
  transformers' torch path takes them);
- attention: q_proj twice as wide (the output gate), q/k norms, a partial rotary
  (`partial_rotary_factor`, 0.25 where config.json names none; Qwen3.5's multimodal rotary
  sections turn text positions as the plain rotary does);
- the MLP: Qwen3.5's dense SwiGLU; Qwen3-Next's experts (where `decoder_sparse_step` and
  `mlp_only_layers` say, else a dense MLP of `intermediate_size`) and Qwen3.5-MoE's (every
  layer), each with a shared expert and its sigmoid gate (Qwen2-MoE's), top-k renormalised
  where `norm_topk_prob` (Qwen3.5-MoE: always).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import qwen4_exp_config as qwen4
from pagoda.runtime.model.delta_rule_config import delta_rule_mamba
from pagoda.runtime.model_configs import ExpertRouting
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {
    "Qwen3NextForCausalLM": "qwen3_next",  # Qwen3-Next-80B-A3B
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",  # its text model; the vision tower not read
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "LaraMiniForCausalLM": "lara_mini",  # Lara-4-Mini: Qwen3.5's DeltaNet, Qwen3 attention
    "Qwen4ExpForCausalLM": "qwen4_exp",  # Qwen3.5-MoE's layers, hyper-connections, PLE
    "Qwen4ExpForConditionalGeneration": "qwen4_exp",  # its text model (`qwen4_exp_config`)
}
# a multimodal wrapper's text model, by its text_config's model_type (`hf_tables`)
TEXT_MODEL_TYPES = {
    "Qwen3_5ForConditionalGeneration": {"qwen3_5_text": "qwen3_5"},
    "Qwen3_5MoeForConditionalGeneration": {"qwen3_5_moe_text": "qwen3_5_moe"},
    "Qwen4ExpForConditionalGeneration": {"qwen4_exp_text": "qwen4_exp"},
}
# Qwen3_5Config's default (Qwen4ExpConfig's too)
WRAPPER_TIES = {"qwen3_5": False, "qwen3_5_moe": False, "qwen4_exp": False}
_LINEAR = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
           "linear_value_head_dim": 128, "linear_num_key_heads": 16,
           "linear_num_value_heads": 32, "head_dim": 256, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 32768, "tie_word_embeddings": False,
           "hidden_act": "silu", "attention_bias": False}  # fmt: skip
# transformers' config defaults, where config.json leaves one out
DEFAULTS = {
    "qwen3_next": {**_LINEAR, "vocab_size": 151936, "hidden_size": 2048,
                   "intermediate_size": 5632, "num_hidden_layers": 48,
                   "num_attention_heads": 16, "num_key_value_heads": 2,
                   "decoder_sparse_step": 1, "moe_intermediate_size": 512,
                   "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
                   "num_experts": 512, "norm_topk_prob": True},
    "qwen3_5": {**_LINEAR, "vocab_size": 248320, "hidden_size": 4096,
                "intermediate_size": 12288, "num_hidden_layers": 32, "num_attention_heads": 16,
                "num_key_value_heads": 4},
    "qwen3_5_moe": {**_LINEAR, "vocab_size": 248320, "hidden_size": 2048,
                    "num_hidden_layers": 40, "num_attention_heads": 16,
                    "num_key_value_heads": 2, "moe_intermediate_size": 512,
                    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8,
                    "num_experts": 256},
    "lara_mini": {**_LINEAR, "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 34,
                  "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
                  "linear_num_key_heads": 8, "linear_num_value_heads": 16,
                  "max_position_embeddings": 131072, "tie_word_embeddings": True,
                  "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                  "num_experts_per_tok": 4, "num_experts": 128, "norm_topk_prob": True,
                  "sliding_window": 512},
}  # fmt: skip
DEFAULTS["qwen4_exp"] = {**DEFAULTS["qwen3_5_moe"], **qwen4.DEFAULTS}
_LINEAR_ATTN, _ATTENTION = "linear_attention", "full_attention"
_SLIDING = "sliding_attention"  # LaraMini's rotating window layers (its full ones NoPE)
# LaraMini's released pattern (transformers' default layer_types), period 5
_LARA_PATTERN = (_LINEAR_ATTN, _SLIDING, _LINEAR_ATTN, _ATTENTION, _SLIDING)
# the published Qwen3.5-MoE checkpoints' stacked experts: gate and up [E, 2N, hidden] (gate
# first), down [E, hidden, N]; listed with a `.weight` (`stacked_experts`)
STACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def layer_types(cfg: Mapping[str, Any], n: int, lara: bool = False) -> list[str]:
    """Each layer's type; Qwen4-Exp's "indexed_attention" (attention with its QSA indexer,
    `qwen4_exp_config`) read as attention; ``lara``: LaraMini's (its default pattern, its
    sliding layers)."""
    types = cfg.get("layer_types")
    if types is not None and "hc_count" in cfg:
        types = [_ATTENTION if t == "indexed_attention" else t for t in types]
    if types is None and lara:
        types = [_LARA_PATTERN[i % len(_LARA_PATTERN)] for i in range(n)]
    if types is None:
        every = int(cfg.get("full_attention_interval") or 4)
        types = [_LINEAR_ATTN if (i + 1) % every else _ATTENTION for i in range(n)]
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    known = (_LINEAR_ATTN, _ATTENTION, _SLIDING) if lara else (_LINEAR_ATTN, _ATTENTION)
    unknown = sorted({t for t in types if t not in known})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported in a "
                         f"{'LaraMini' if lara else 'Qwen3-Next / Qwen3.5'} model "
                         f"({' or '.join(known)})")  # fmt: skip
    return list(types)


def overrides(cfg: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`: the partial rotary's default
    (transformers' 0.25), Qwen3.5-MoE's width (experts in every layer: no dense MLP)."""
    out: dict[str, Any] = {}
    params = cfg.get("rope_parameters") or {}
    if arch == "lara_mini":  # its window layers; experts in every layer; a whole rotary
        out["layer_types"] = layer_types(cfg, int(cfg["num_hidden_layers"]), lara=True)
    elif "partial_rotary_factor" not in params and cfg.get("partial_rotary_factor") is None:
        out["partial_rotary_factor"] = 1.0 if arch == qwen4.ARCH else 0.25  # (transformers')
    if arch in ("qwen3_5_moe", qwen4.ARCH, "lara_mini"):
        out["intermediate_size"] = cfg["moe_intermediate_size"]
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a {arch} model "
                         "(silu)")  # fmt: skip
    return out


def mamba(
    cfg: Mapping[str, Any], n: int, extra_conv_rows: int = 0, lara: bool = False
) -> MambaConfig:
    """The Gated DeltaNet layers as recurrent layers (module docstring); `extra_conv_rows`:
    Qwen4-Exp's PLE conv state beside each one's conv state."""
    return delta_rule_mamba(
        (t == _LINEAR_ATTN for t in layer_types(cfg, n, lara)),
        v_heads=int(cfg["linear_num_value_heads"]),
        v_dim=int(cfg["linear_value_head_dim"]),
        k_heads=int(cfg["linear_num_key_heads"]),
        k_dim=int(cfg["linear_key_head_dim"]),
        d_conv=int(cfg["linear_conv_kernel_dim"]),
        attn_output_gate=not lara,
        extra_conv_rows=extra_conv_rows,
    )


def family_fields(cfg: Mapping[str, Any], arch: str, n: int) -> dict[str, Any]:
    lara = arch == "lara_mini"
    fields: dict[str, Any] = {"mamba": mamba(cfg, n, lara=lara), "qk_norm": True}
    if arch == qwen4.ARCH:
        types, h = layer_types(cfg, n), int(cfg["hidden_size"])
        q = fields["qwen4"] = qwen4.read(cfg, types, h)
        extra = q.extra_conv_rows(h, int(cfg["linear_conv_kernel_dim"]))
        fields["mamba"] = mamba(cfg, n, extra)
    if arch == "qwen3_5":
        return fields
    norm = True
    if lara:  # experts in every layer; the window layers rotate, the full ones are NoPE
        layers, norm = (True,) * n, bool(cfg["norm_topk_prob"])
        fields["rope_layers"] = tuple(t == _SLIDING for t in layer_types(cfg, n, lara))
        # Flint's router: float32 logits, softmax top-k (renormalised exactly), and so its
        # shared expert without a gate (`moe.SharedExpertMoE`)
        fields["routing"] = ExpertRouting(renorm_eps=0.0)
    elif arch == "qwen3_next":
        step, dense = int(cfg["decoder_sparse_step"]), set(cfg.get("mlp_only_layers") or ())
        experts = int(cfg["num_experts"])
        layers = tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n))
        norm = bool(cfg["norm_topk_prob"])
    else:  # Qwen3.5-MoE: experts in every layer, renormalised
        layers = (True,) * n
    if any(layers):
        fields.update(num_experts=int(cfg["num_experts"]),
                      num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                      shared_expert_intermediate_size=int(cfg["shared_expert_intermediate_size"]),
                      norm_topk_prob=norm, round_topk_to_model_dtype=True,
                      moe_layers=layers)  # fmt: skip
    return fields


def stacked_experts(names) -> dict[str, str]:
    """The stacked expert tensors among `names` -> the names they are read under (`STACKED`
    with `.weight`: `moe.SparseMoE`'s stacked gate/up and down)."""
    return {n: n + ".weight" for n in names if n.endswith(STACKED)}


def rename_stacked_experts(weights) -> None:
    """List the checkpoint's stacked experts under the names they are read by
    (`stacked_experts`)."""
    for name, new in stacked_experts(list(weights)).items():
        weights.rename(name, new)


def check_experts(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """Every expert layer's experts, per expert ([N, hidden] gate and up, [hidden, N] down) or
    stacked (`STACKED`); ValueError, one line, naming the first missing or misshapen."""
    f, h = c.family, c.hidden_size
    e, n = f.num_experts, f.moe_intermediate_size
    for i in range(c.num_layers):
        if not f.has_experts(i):
            continue
        p = f"model.layers.{i}.mlp.experts."
        if p + "gate_up_proj.weight" in headers:
            want = {p + "gate_up_proj.weight": (e, 2 * n, h), p + "down_proj.weight": (e, h, n)}
        else:
            want = {}
            for x in range(e):
                want.update({f"{p}{x}.gate_proj.weight": (n, h), f"{p}{x}.up_proj.weight": (n, h),
                             f"{p}{x}.down_proj.weight": (h, n)})  # fmt: skip
        for name, shape in want.items():
            if name not in headers:
                raise ValueError(f"checkpoint is missing tensor {name!r}")
            if tuple(headers[name][1]) != shape:
                raise ValueError(f"checkpoint tensor {name} is {list(headers[name][1])}, "
                                 f"config.json (hidden_size {h}, moe_intermediate_size {n}, "
                                 f"num_experts {e}) needs {list(shape)}")  # fmt: skip


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norms and MLP (checked as the other families'): its
    DeltaNet layer (either projection layout), or its gated attention; the router and shared
    expert gate of an expert layer."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out: dict[str, tuple[int, ...]] = {}
    if m.layers[i]:
        x = p + "linear_attn."
        out.update({x + "conv1d.weight": (m.conv_dim, 1, m.d_conv), x + "A_log": (m.n_heads,),
                    x + "dt_bias": (m.n_heads,), x + "norm.weight": (m.head_dim,),
                    x + "out_proj.weight": (h, m.d_inner)})  # fmt: skip
        if c.architecture == "lara_mini":  # one in_proj, rows [q k v z b a]; out_norm
            del out[x + "norm.weight"]
            out.update({x + "in_proj.weight": (m.conv_dim + m.d_inner + 2 * m.n_heads, h),
                        x + "out_norm.weight": (m.head_dim,)})  # fmt: skip
        elif c.architecture == "qwen3_next":
            out.update({x + "in_proj_qkvz.weight": (m.conv_dim + m.d_inner, h),
                        x + "in_proj_ba.weight": (2 * m.n_heads, h)})  # fmt: skip
        else:
            out.update({x + "in_proj_qkv.weight": (m.conv_dim, h),
                        x + "in_proj_z.weight": (m.d_inner, h),
                        x + "in_proj_b.weight": (m.n_heads, h),
                        x + "in_proj_a.weight": (m.n_heads, h)})  # fmt: skip
    else:  # (LaraMini's q_proj without the gate rows)
        a, q = p + "self_attn.", c.num_heads * c.head_dim
        out.update({a + "q_proj.weight": (2 * q if m.attn_output_gate else q, h),
                    a + "q_norm.weight": (c.head_dim,), a + "k_norm.weight": (c.head_dim,)})  # fmt: skip
    if c.family.has_experts(i):
        out[p + "mlp.gate.weight"] = (c.family.num_experts, h)
        if c.architecture != "lara_mini":  # (its shared expert ungated: Flint's)
            out[p + "mlp.shared_expert_gate.weight"] = (1, h)
    if c.family.qwen4 is not None:
        out.update(qwen4.expected_shapes(c, i))
    return out
