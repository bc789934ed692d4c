"""GGUFs of MiniMax-M2 (`minimax-m2`) as llama.cpp's converter writes them (its MiniMaxM2Model),
read as `gguf_classic` reads its families: the checkpoint's config.json (transformers'
`MiniMaxM2Config` keys) rebuilt from the file's keys, the common ones by `gguf_classic.hf_config`
(the rotating dims `rope.dimension_count` as its `rotary_dim`), the experts' here (`experts`).

What the converter wrote, read back here: the experts stacked (`gguf_classic`'s expert names,
by `moe_names`), the correction bias as `exp_probs_b`; a sigmoid router whose top-k is
renormalised (llama.cpp's graph, transformers' model: no key for it). Refused in one line:
another router (`expert_gating_func` other than 2) or a scale of the weights
(`expert_weights_scale`), which its config.json cannot say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ENGINE_ARCH = {"minimax-m2": "minimax_m2"}
HF_ARCH = {"minimax_m2": "MiniMaxM2ForCausalLM"}
ARCHS = tuple(HF_ARCH)  # the engine's
Get = Callable[..., Any]  # get(key, default): the file's `minimax-m2.<key>`


def experts(get: Get, count: int, used: int, width: int) -> dict[str, Any]:
    """MiniMax-M2's expert keys: a sigmoid router with its correction bias (`exp_probs_b`),
    the top-k renormalised (llama.cpp's graph, transformers' model); another router or a
    scale of the weights (which its config.json cannot say) refused."""
    gating, scale = get("expert_gating_func"), get("expert_weights_scale")
    if gating is not None and int(gating) != 2:
        raise ValueError(f"GGUF minimax-m2 with expert_gating_func {gating} is not supported "
                         "(its router is a sigmoid: 2)")  # fmt: skip
    if scale not in (None, 0.0, 1.0):
        raise ValueError(f"GGUF minimax-m2 expert_weights_scale {scale} is not supported")
    return {"num_local_experts": count, "num_experts_per_tok": used, "intermediate_size": width,
            "scoring_func": "sigmoid", "use_routing_bias": True}  # fmt: skip
