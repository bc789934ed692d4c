"""HY V4's config.json and checkpoint names (`HYV4ForCausalLM`, model/hy_v4.py), as transformers
reads them; kept apart from the model so that reading a config imports no layer code.

Its attention and experts are GLM-5's as `deepseek_config` reads them (the `hy_v4` rows there:
HYV4Config's defaults, ``indexer_types`` by default full at layer 0 and every fourth from 1, the
indexer's rotary on its last dims, its key norm's eps ``rms_norm_eps``, ``mlp_layer_types`` by
default one dense layer then experts); here what HY V4 adds: the hyper-connections
(`model_configs.HyperConfig`: ``hc_mult``, ``hc_magnitude``, ``hc_eps``, independent: no
Sinkhorn) and the routed experts' clamp ``swiglu_limit`` (<= 0: none).

The checkpoint's names: transformers' conversion mapping ("hy_v4") renames the stored ones at
load (``learnable_sink_param`` → ``sinks``, ``linear_gate`` → ``gate_proj``, ``hc_pre.hc_*`` and
``hc_{attn,mlp}_layer.hc_*`` → ``{attn,ffn}_hc.*``, ``hc_head_*`` → ``hc_head.hc_*``) and
reverses them when it saves (which is why a checkpoint transformers writes names the dense MLP's
gate ``linear_gate`` too): `rename_weights` applies the same renames, in its order, so both the
published names and the ones transformers writes read alike. The experts are stacked
``mlp.experts.gate_up_proj`` [E, 2I, hidden] (gate rows, then up) and ``mlp.experts.down_proj``
[E, hidden, I], listed with a ``.weight`` for `moe.SparseMoE`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model import deepseek_config
from pagoda.runtime.model_configs import HyperConfig

# transformers' conversion_mapping "hy_v4", in its order (stored name -> transformers' module's)
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"\.hc_pre\.hc_", ".hc_"), (r"\.learnable_sink_param", ".sinks"),
    (r"\.linear_gate", ".gate_proj"),
    (r"\.hc_attn_layer\.hc_fn", ".attn_hc.fn"), (r"\.hc_attn_layer\.hc_base", ".attn_hc.base"),
    (r"\.hc_attn_layer\.hc_scale", ".attn_hc.scale"), (r"\.hc_mlp_layer\.hc_fn", ".ffn_hc.fn"),
    (r"\.hc_mlp_layer\.hc_base", ".ffn_hc.base"), (r"\.hc_mlp_layer\.hc_scale", ".ffn_hc.scale"),
    (r"\.hc_head_fn", ".hc_fn"), (r"\.hc_head_base", ".hc_base"),
    (r"\.hc_head_scale", ".hc_scale"),
    (r"\.mlp\.experts\.(gate_up_proj|down_proj)$", r".mlp.experts.\1.weight"),  # (SparseMoE's)
))  # fmt: skip
HC = ("fn", "base", "scale")


def hyper_config(cfg: Mapping[str, Any]) -> HyperConfig:
    return HyperConfig(
        mult=int(cfg.get("hc_mult", 4)),
        sinkhorn_iters=0,  # independent hyper-connections: no comb
        eps=float(cfg.get("hc_eps", 1e-6)),
        norm_eps=float(cfg.get("rms_norm_eps") or 1e-5),
        post_magnitude=float(cfg.get("hc_magnitude", 2.0)),
    )


def family_fields(
    cfg: Mapping[str, Any], n: int, scaling: Mapping[str, Any] | None
) -> dict[str, Any]:
    """GLM-5's fields (`deepseek_config.family_fields`) and the hyper-connections, the clamp."""
    fields = deepseek_config.family_fields(cfg, "hy_v4", n, scaling)
    limit = float(cfg.get("swiglu_limit", 10.0))
    return {**fields, "hyper": hyper_config(cfg), "swiglu_limit": limit if limit > 0 else None}


def rename_weights(weights) -> None:
    """The stored names listed as transformers' modules name them (module docstring)."""
    weights.rename_by(_RENAMES)


def expected_shapes(c, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors beside GLM-5's (`checkpoint_shapes.mla_shapes`, the shared experts):
    the hyper-connections, attention's gate and sinks, the stacked experts; and the head's fold
    (with layer 0's)."""
    hc, h, heads = c.family.hyper, c.hidden_size, c.num_heads
    n, p = hc.mult, f"model.layers.{i}."
    out = {p + "self_attn.gate_proj.weight": (heads * c.family.mla.v_head_dim, h),
           p + "self_attn.sinks": (heads,)}  # fmt: skip
    for block in ("attn_hc.", "ffn_hc."):
        out.update({p + block + "fn": (2 * n, n * h), p + block + "base": (2 * n,),
                    p + block + "scale": (2,)})  # fmt: skip
    if c.family.has_experts(i):
        e, w = c.family.num_experts, c.family.moe_intermediate_size
        out.update({p + "mlp.experts.gate_up_proj.weight": (e, 2 * w, h),
                    p + "mlp.experts.down_proj.weight": (e, h, w)})  # fmt: skip
    if i == 0:
        out.update({"model.hc_head.hc_fn": (n, n * h), "model.hc_head.hc_base": (n,),
                    "model.hc_head.hc_scale": (1,)})  # fmt: skip
    return out
