"""Dory's config.json (`DoryForCausalLM`: a looped normalised transformer, nGPT) as transformers'
DoryConfig reads it, and its checkpoint's names: the `FamilyConfig` fields `model/dory.py`
runs. Kept apart from the model so that reading a config imports no layer code.

- The published configs list each layer as an attention block then an "mlp" block
  (`layer_types` with "mlp" entries, every count doubled): read as one layer each, as
  transformers does; by default every fourth layer full attention, the rest sliding;
- `n_input_layers` run once, then the `n_recurrent_layers` after them `n_recurrent_loops`
  times, then the last `n_output_layers` once; each loop's pass keeps a KV cache of its own
  (`recurrent_kv_cache_mode` "per_loop"; "last_loop", whose earlier loops read the last
  loop's cache without writing theirs, is refused): `ModelConfig.num_kv_layers` counts them;
- rotary by layer kind (`rope_parameters`: 1e4 sliding, 1e7 full by default);
- nGPT's scaled parameters (`sqk`, `s_gate`, `suv_*`, `lambda_*`, `logit_scale`) are used times
  their scale over `initializer_range`.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.runtime.model_configs import DoryLoops

ARCHITECTURES = {"DoryForCausalLM": "dory"}
MODEL_CLASSES = {"dory": ("dory", "DoryModel")}
FULL, SLIDING = "full_attention", "sliding_attention"
DEFAULTS: dict[str, dict[str, Any]] = {
    "dory": {"vocab_size": 131_072, "hidden_size": 2560, "intermediate_size": 7168,
             "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
             "head_dim": 256, "max_position_embeddings": 8192, "initializer_range": 0.0177,
             "sliding_window": 1024, "ngpt_alpha_init": 0.05, "n_input_layers": 8,
             "n_output_layers": 8, "n_recurrent_loops": 2,
             "recurrent_kv_cache_mode": "per_loop", "tie_word_embeddings": False},
}  # fmt: skip
NULLABLE = {"dory": ("n_recurrent_layers",)}
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "default", "rope_theta": 10_000_000.0}}  # fmt: skip


def overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """The published two-block layout read as one layer per (attention, mlp) pair."""
    types = cfg.get("layer_types")
    if not types or "mlp" not in types:
        return {}
    out = {"layer_types": types[::2]}
    for key in ("num_hidden_layers", "n_input_layers", "n_output_layers", "n_recurrent_layers"):
        if cfg.get(key) is not None:
            out[key] = int(cfg[key]) // 2
    return out


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Dory config.json (its layers: `n`); ValueError, one line, for
    what it does not run."""
    types = cfg.get("layer_types") or [FULL if (i + 1) % 4 == 0 else SLIDING for i in range(n)]
    if len(types) != n:
        raise ValueError(f"dory layer_types names {len(types)} layers, the model has {n}")
    if cfg["recurrent_kv_cache_mode"] != "per_loop":
        raise ValueError(f"dory recurrent_kv_cache_mode {cfg['recurrent_kv_cache_mode']!r} is not "
                         "supported (per_loop: a KV cache per loop)")  # fmt: skip
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("dory attention_bias / mlp_bias are not supported")
    first, last = int(cfg["n_input_layers"]), int(cfg["n_output_layers"])
    middle = cfg.get("n_recurrent_layers")
    middle = n - first - last if middle is None else int(middle)
    loops = DoryLoops(inputs=first, recurrent=middle, outputs=last,
                      loops=int(cfg["n_recurrent_loops"]),
                      alpha=float(cfg["ngpt_alpha_init"]),
                      init_range=float(cfg["initializer_range"]))  # fmt: skip
    if middle < 1:
        raise ValueError(
            f"dory needs at least one recurrent layer, got n_recurrent_layers {middle}"
        )
    if first + middle + last != n:
        raise ValueError(f"dory n_input_layers + n_recurrent_layers + n_output_layers "
                         f"({first} + {middle} + {last}) must be num_hidden_layers {n}")  # fmt: skip
    sliding = tuple(t == SLIDING for t in types)
    params = cfg.get("rope_parameters") or DEFAULT_ROPE
    local = params.get(SLIDING) or DEFAULT_ROPE[SLIDING]
    return {
        "sliding_window": int(cfg["sliding_window"]) if any(sliding) else None,
        "window_layers": sliding if any(sliding) else (),
        "local_rope_theta": float(local.get("rope_theta") or 10_000.0),
        "dory": loops,
    }  # fmt: skip


# the published two-block layout: layer 2i's `mixer` is layer i's attention, 2i + 1's its MLP
_PAIR = re.compile(r"^model\.layers\.(\d+)\.(mixer|attn_alpha|mlp_alpha)(?=\.|$)")


def read_checkpoint_names(weights) -> None:
    """List the tensors as `model/dory.py` reads them, from the files' names: `backbone.` as
    `model.`, its `embeddings` as `embed_tokens`, the two-block layout collapsed (as
    transformers' `LayerPairCollapse`), the output gate `g_proj` as `gate_proj`."""
    moves = {}
    for name in list(weights):
        new = re.sub(r"^backbone\.", "model.", weights.stored_name(name))
        new = new.replace("model.embeddings.", "model.embed_tokens.")
        new = new.replace(".self_attn.g_proj.", ".self_attn.gate_proj.")
        m = _PAIR.match(new)
        if m is not None:
            i, part = int(m[1]), m[2]
            part = {"attn_alpha": "lambda_1", "mlp_alpha": "lambda_2"}.get(
                part, ("self_attn", "mlp")[i % 2])  # fmt: skip
            new = f"model.layers.{i // 2}.{part}" + new[m.end() :]
            new = new.replace(".self_attn.g_proj.", ".self_attn.gate_proj.")
        if new != name:
            moves[name] = new
    weights.rename_all(moves)


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """`checkpoint_shapes.expected_shapes`' tensors without norm weights (Dory's norms are
    weightless), with attention's gate and nGPT's scaled parameters, the head's logit scale."""
    for name in [n for n in out if n.endswith("norm.weight")]:
        del out[name]
    h, q, n = c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size
    out["lm_head.logit_scale"] = (c.vocab_size,)
    for x in range(c.num_layers):
        p = f"model.layers.{x}."
        out.update({p + "self_attn.gate_proj.weight": (q, h),
                    p + "self_attn.sqk": (q,), p + "self_attn.s_gate": (q,),
                    p + "lambda_1": (h,), p + "lambda_2": (h,),
                    p + "mlp.suv_gate": (n,), p + "mlp.suv_up": (n,)})  # fmt: skip


_BY_ROWS = ("self_attn.sqk", "self_attn.s_gate", "mlp.suv_gate", "mlp.suv_up")


def rank_rows(layer: int, part: str, rows: int, cols: int, c, lay):
    """A rank's elements of nGPT's per-channel scales (`model/dory.py`: its heads' `sqk` and
    `s_gate`, its MLP rows' `suv_*`), or None for the other tensors (the output gate's rows
    by the shared rules' gate_proj; `distributed/tp_families.py`)."""
    return (rows // lay.size, cols) if part in _BY_ROWS else None
