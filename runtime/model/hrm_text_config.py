"""HRM-Text's config.json (`HrmTextForCausalLM`: Sapient's hierarchical reasoning model) as
transformers' HrmTextConfig reads it, and its checkpoint's names: the `FamilyConfig` fields
`model/hrm_text.py` runs. Kept apart from the model so that reading a config imports no layer
code.

- transformers rewrites `num_hidden_layers` to the attention passes (`num_layers_per_stack` x
  `H_cycles` x (`L_cycles` + 1)) and keeps the stacks' depth as `num_layers_per_stack` (a
  config.json without it names the depth in `num_hidden_layers`): the model's layers are the
  two stacks', `ModelConfig.num_kv_layers` the passes;
- `model.L_module.layers.{i}.` and `model.H_module.layers.{i}.` are read as layers i and
  `num_layers_per_stack` + i, their fused `attn.gqkv_proj` (gate, q, k, v) and
  `mlp.gate_up_proj` cut as transformers cuts them; attention is multi-head (no
  `num_key_value_heads`);
- `prefix_lm`'s bidirectional instruction block needs `token_type_ids`, which a request does not
  carry: every token attends causally, as transformers' generate without them.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.runtime.model_configs import HrmCycles

ARCHITECTURES = {"HrmTextForCausalLM": "hrm_text"}
MODEL_CLASSES = {"hrm_text": ("hrm_text", "HrmTextModel")}
# transformers' HrmTextConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "hrm_text": {"vocab_size": 151_808, "hidden_size": 1536, "intermediate_size": 4096,
                 "num_hidden_layers": 16, "num_attention_heads": 12, "head_dim": 128,
                 "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                 "tie_word_embeddings": False, "initializer_range": 0.02, "H_cycles": 2,
                 "L_cycles": 3},
}  # fmt: skip
_STACK = re.compile(r"^model\.([LH])_module\.layers\.(\d+)\.")
# the stored fused matrices (transformers' conversion_mapping "hrm_text"), cut in equal rows
_FUSED = {"attn.gqkv_proj.weight": ("self_attn.gate_proj.weight", "self_attn.q_proj.weight",
                                    "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
          "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}  # fmt: skip
_RENAMED = {"attn.o_proj.weight": "self_attn.o_proj.weight"}


def overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """The two stacks' layers as `num_hidden_layers`, multi-head attention."""
    per_stack = int(cfg.get("num_layers_per_stack") or cfg["num_hidden_layers"])
    return {"num_layers_per_stack": per_stack, "num_hidden_layers": 2 * per_stack,
            "num_key_value_heads": cfg["num_attention_heads"]}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of an HRM-Text config.json; ValueError, one line, for what it does
    not run."""
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"hrm_text {key} is not supported (the published model has none)")
    h, low = int(cfg["H_cycles"]), int(cfg["L_cycles"])
    if h < 1 or low < 0:
        raise ValueError(f"hrm_text needs H_cycles >= 1 and L_cycles >= 0, got {h} and {low}")
    scale = cfg.get("embedding_scale")
    scale = 1.0 / float(cfg["initializer_range"]) if scale is None else float(scale)
    return {"hrm": HrmCycles(int(cfg["num_layers_per_stack"]), h, low, scale)}


def rename_tensors(weights) -> None:
    """The L stack's layers listed as 0.., the H stack's after them, and the stored fused
    matrices as transformers splits them (`attn.gqkv_proj`: gate, q, k, v rows;
    `mlp.gate_up_proj`: gate, up; `attn.o_proj`), module docstring."""
    names = list(weights)
    per_stack = 1 + max((int(m.group(2)) for n in names if (m := _STACK.match(n))), default=-1)
    for name in names:
        m = _STACK.match(name)
        if m is None:
            continue
        i = int(m.group(2)) + (per_stack if m.group(1) == "H" else 0)
        new, rest = f"model.layers.{i}.", name[m.end() :]
        if rest in _FUSED:
            rows = weights.dtype_and_shape(name)[1][0]
            n = rows // len(_FUSED[rest])
            weights.split_rows(name, [(new + part, k * n, (k + 1) * n)
                                      for k, part in enumerate(_FUSED[rest])])  # fmt: skip
        else:
            weights.rename(name, new + _RENAMED.get(rest, rest))


def expected_shapes(c) -> dict[str, tuple[int, ...]]:
    """What HRM-Text holds besides Llama's projections: each layer's attention gate, z_L_init
    (its norms are weightless: none)."""
    q = c.num_heads * c.head_dim
    out = {f"model.layers.{i}.self_attn.gate_proj.weight": (q, c.hidden_size)
           for i in range(c.num_layers)}  # fmt: skip
    return {**out, "model.z_L_init": (c.hidden_size,)}


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """`checkpoint_shapes.expected_shapes`' tensors without norm weights (HRM-Text's norms are
    weightless), with attention's gates and z_L_init (`expected_shapes`)."""
    for name in [n for n in out if n.endswith("norm.weight")]:
        del out[name]
    out.update(expected_shapes(c))
