"""Hunyuan V1's config.json (`HunYuanDenseV1ForCausalLM`: tencent/Hunyuan-0.5B/1.8B/4B/7B;
`HunYuanMoEV1ForCausalLM`: tencent/Hunyuan-A13B) as transformers' HunYuanDenseV1Config and
HunYuanMoEV1Config read it: the `FamilyConfig` fields `model/hunyuan.py` runs, and its rotary.
Kept apart from the model so that reading a config imports no layer code.

transformers builds every MoE layer with experts and one shared MLP, all of `intermediate_size`
(the released configs' `moe_intermediate_size`, `moe_topk` and `num_shared_expert` are per-layer
lists of one value); configs it would run otherwise than they say (widths that differ, top-k
that changes by layer, other than one shared expert, cross-layer attention) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model.ops import rope_kind
from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"HunYuanDenseV1ForCausalLM": "hunyuan_v1_dense",
                 "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe"}  # fmt: skip
MODEL_CLASSES = {"hunyuan_v1_dense": ("hunyuan", "HunYuanModel"),
                 "hunyuan_v1_moe": ("hunyuan", "HunYuanMoeModel")}  # fmt: skip
_COMMON = {"vocab_size": 290_943, "hidden_size": 4096, "intermediate_size": 11_008,
           "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 2048, "tie_word_embeddings": False, "bos_token_id": 1,
           "eos_token_id": 2}  # fmt: skip
DEFAULTS: dict[str, dict[str, Any]] = {
    "hunyuan_v1_dense": _COMMON,
    "hunyuan_v1_moe": {**_COMMON, "num_experts": 1, "moe_topk": 1},
}


def _one(cfg: Mapping[str, Any], key: str, want: int | None = None) -> int | None:
    """`key`'s value, an integer or a per-layer list of one value (None where left out);
    ValueError where the layers differ or it is not `want`."""
    value = cfg.get(key)
    if value is None:
        return None
    values = set(value) if isinstance(value, list) else {value}
    if len(values) != 1 or (want is not None and values != {want}):
        need = "one value for every layer" + ("" if want is None else f" ({want})")
        raise ValueError(f"Hunyuan's {key} {value!r} is not supported: transformers runs "
                         f"{need}")  # fmt: skip
    return int(values.pop())


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a Hunyuan V1 config.json, as transformers reads them;
    ValueError, one line, for what it does not run."""
    if cfg.get("use_cla"):
        raise ValueError("Hunyuan's cross-layer attention (use_cla) is not supported")
    if arch == "hunyuan_v1_dense":
        return {}
    width = int(cfg["intermediate_size"])
    _one(cfg, "moe_intermediate_size", width)
    _one(cfg, "num_shared_expert", 1)
    experts = _one(cfg, "num_experts")
    return {
        "routing": ExpertRouting(),  # float32 softmax, greedy, renormalised
        "num_experts": experts,
        "num_experts_per_tok": _one(cfg, "moe_topk"),
        "moe_intermediate_size": width,
        "norm_topk_prob": True,
        "shared_expert_intermediate_size": width,
    }


def rope(cfg: Mapping[str, Any], theta: float, scaling: Mapping[str, Any] | None, head_dim: int):
    """(theta, rope_scaling) as Hunyuan's rotary runs them: a "dynamic" rotary with an `alpha`
    is transformers' fixed NTK-alpha one, the base theta x alpha ** (d / (d - 2))."""
    if scaling and rope_kind(dict(scaling)) == "dynamic" and scaling.get("alpha"):
        return theta * float(scaling["alpha"]) ** (head_dim / (head_dim - 2)), None
    return theta, scaling


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its q/k norms (`query_layernorm`, `key_layernorm`: one weight a head size) in
    `checkpoint_shapes.expected_shapes`' tensors."""
    for i in range(c.num_layers):
        a = f"model.layers.{i}.self_attn."
        out[a + "query_layernorm.weight"] = out[a + "key_layernorm.weight"] = (c.head_dim,)
