"""xLSTM's config as transformers 5 reads it (`xLSTMForCausalLM`: NX-AI's xLSTM-7b), for
`model/xlstm.py`; reached through `mamba_config`. Kept apart from the model so that reading a
config imports no layer code.

Every layer ``x + mlstm(norm(x))`` then ``+ ffn(norm(x))`` (RMSNorms, `norm_eps`): the mLSTM
(`MambaConfig.mixer` "mlstm": q and k `hidden_size * qk_dim_factor` wide, v and the output gate
`hidden_size * v_dim_factor`, in `num_heads` heads; input and forget gates one a head, soft-capped
at `gate_soft_cap`; a LayerNorm over each head's output), the FFN SwiGLU
(`hidden_size * ffn_proj_factor` rounded up to `ffn_round_up_to_multiple_of`); the final
`out_norm`, the logits soft-capped at `output_logit_soft_cap`; untied. The state per sequence
and layer: C [heads, dqk, dv], n [heads, dqk] and m [heads] in one SSM slot
[heads, dqk, dv + 2] (float32: C, then n, then m in every row), no conv state.
`weight_mode` "single" (each projection apart) or "fused" (`qkv_opreact`, `ifgate_preact`,
`ffn.proj_up_gate_z`); `use_bias` false only (refused otherwise in one line).

The checkpoint's names (`backbone.embeddings`, `backbone.blocks.{i}.`, `norm_mlstm`, `norm_ffn`,
`ffn.proj_up_gate` / `proj_up` / `proj_down` or `proj_up_gate_z`, `backbone.out_norm`) are read
as Llama's
(`xlstm_name`); the mLSTM's stay under ``mlstm_layer.``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.recurrent_configs import MambaConfig

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

ARCHITECTURES = {"xLSTMForCausalLM": "xlstm"}
# transformers' xLSTMConfig defaults, where config.json leaves one out
DEFAULTS = {
    "xlstm": {"vocab_size": 50304, "hidden_size": 4096, "num_hidden_layers": 32, "num_heads": 8,
              "use_bias": False, "tie_word_embeddings": False, "add_out_norm": True,
              "norm_eps": 1e-6, "qk_dim_factor": 0.5, "v_dim_factor": 1.0, "eps": 1e-6,
              "ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64,
              "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0, "weight_mode": "single",
              "max_position_embeddings": 131072, "bos_token_id": 0, "eos_token_id": 2},
}  # fmt: skip
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^backbone\.blocks\.(\d+)\.norm_mlstm\.", r"model.layers.\1.input_layernorm."),
    (r"^backbone\.blocks\.(\d+)\.norm_ffn\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^backbone\.blocks\.(\d+)\.ffn\.proj_up_gate_z\.", r"model.layers.\1.mlp.gate_up_proj."),
    (r"^backbone\.blocks\.(\d+)\.ffn\.proj_up_gate\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^backbone\.blocks\.(\d+)\.ffn\.proj_up\.", r"model.layers.\1.mlp.up_proj."),
    (r"^backbone\.blocks\.(\d+)\.ffn\.proj_down\.", r"model.layers.\1.mlp.down_proj."),
    (r"^backbone\.blocks\.", "model.layers."), (r"^backbone\.out_norm\.", "model.norm."),
))  # fmt: skip


def xlstm_name(stored: str) -> str:
    """A checkpoint tensor's name as the engine reads it (module docstring)."""
    for pattern, new in _RENAMES:
        stored = pattern.sub(new, stored)
    return stored


def _dims(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """(q/k width, v width, the FFN's width), as transformers' layers compute them."""
    hidden, step = int(cfg["hidden_size"]), int(cfg["ffn_round_up_to_multiple_of"])
    ffn = hidden * float(cfg["ffn_proj_factor"])
    return (int(hidden * float(cfg["qk_dim_factor"])), int(hidden * float(cfg["v_dim_factor"])),
            int((ffn + step - 1) // step * step))  # fmt: skip


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """No attention: heads of 64 stand in; the FFN's width, the RMSNorms' eps."""
    if cfg["weight_mode"] not in ("single", "fused"):
        raise ValueError(f"xlstm weight_mode {cfg['weight_mode']!r} is not supported (single, "
                         "fused)")  # fmt: skip
    if cfg["use_bias"] or not cfg["add_out_norm"]:
        raise ValueError("an xlstm model with use_bias or without add_out_norm is not "
                         "supported")  # fmt: skip
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_heads"])
    qk, v, ffn = _dims(cfg)
    if qk % heads or v % heads:
        raise ValueError(f"num_heads ({heads}) must divide the q/k ({qk}) and v ({v}) widths")
    stand_in = max(1, hidden // 64)
    return {"num_attention_heads": stand_in, "num_key_value_heads": stand_in,
            "head_dim": hidden // stand_in, "intermediate_size": ffn,
            "rms_norm_eps": cfg["norm_eps"], "attention_bias": False}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    heads = int(cfg["num_heads"])
    qk, v, _ = _dims(cfg)
    mamba = MambaConfig(
        layers=(True,) * n,
        n_heads=heads,
        head_dim=v // heads,
        d_state=qk // heads,
        chunk_size=1,  # (its recurrence position by position: `ssd.pack` in chunks of one)
        conv_bias=False,
        ssm_float32=True,
        mixer="mlstm",
        gate_soft_cap=float(cfg["gate_soft_cap"]),
        kernel_eps=float(cfg["eps"]),
        fused_projections=cfg["weight_mode"] == "fused",
    )
    return {"mamba": mamba, "rope_layers": (False,) * n, "hidden_act": "silu",
            "final_logit_softcapping": float(cfg["output_logit_soft_cap"])}  # fmt: skip


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its two norms: the mLSTM's and the FFN's (by weight_mode)."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}.mlstm_layer."
    qk, v, heads, f, s = (
        m.n_heads * m.d_state,
        m.d_inner,
        m.n_heads,
        f"model.layers.{i}.mlp.",
        c.intermediate_size,
    )
    out = {p + "multihead_norm.weight": (v,), p + "out_proj.weight": (h, v),
           f + "down_proj.weight": (h, s)}  # fmt: skip
    if m.fused_projections:
        out.update({p + "qkv_opreact.weight": (2 * qk + 2 * v, h),
                    p + "ifgate_preact.weight": (2 * heads, h), p + "ifgate_preact.bias": (2 * heads,),
                    f + "gate_up_proj.weight": (2 * s, h)})  # fmt: skip
        return out
    out.update({p + "q.weight": (qk, h), p + "k.weight": (qk, h), p + "v.weight": (v, h),
                p + "ogate_preact.weight": (v, h), p + "igate_preact.weight": (heads, h),
                p + "igate_preact.bias": (heads,), p + "fgate_preact.weight": (heads, h),
                p + "fgate_preact.bias": (heads,), f + "gate_proj.weight": (s, h),
                f + "up_proj.weight": (s, h)})  # fmt: skip
    return out


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay: TPLayout):
    """A rank's (rows, columns) of an mLSTM's tensors (`model/xlstm.py`: its heads' rows of q,
    k, v, the output gate, both gates and their biases, the fused matrices' alike, the norm's
    channels; out_proj's input columns), or None for the others (`distributed/tp_families.py`)."""
    if not part.startswith("mlstm_layer."):
        return None
    if part == "mlstm_layer.out_proj.weight":
        return rows, cols // lay.size
    return rows // lay.size, cols
