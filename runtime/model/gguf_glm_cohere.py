"""GLM-4 (`glm4`: GLM-4-0414, GLM-Z1) and Cohere (`command-r`: Command R / R+, Aya; `cohere2`:
Command R7B, Command A) GGUFs as llama.cpp's converter writes them, read into the names and
`FamilyConfig` fields of `glm4.py` and `cohere.py` (the safetensors loader's).

- No Q/K permutation: both families rotate interleaved pairs, llama.cpp's "normal" rotary, so
  the converter stores q and k as they are.
- GLM-4: the fused `gate_up_proj` stays whole as `ffn_up` (2 x feed_forward_length rows, gate
  then up: llama.cpp's SwiGLU splits it so); its two extra norms are `post_attention_norm`
  (after attention) and `post_ffw_norm` (after the MLP), `ffn_norm` the MLP's input norm; a
  partial rotary as `rope.dimension_count` (half the head).
- Cohere: LayerNorm eps in `attention.layer_norm_epsilon`, `logit_scale` multiplies the logits,
  the per-head q/k norms of Command R+ as `attn_q_norm`/`attn_k_norm`; tied embeddings.
- Cohere 2: `attention.sliding_window`; llama.cpp's window pattern is fixed (every fourth layer
  global; `attention.sliding_window_pattern` where a file has one), the global layers NoPE.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ENGINE_ARCH = {"glm4": "glm4", "command-r": "cohere", "cohere2": "cohere2"}
COHERE2_SWA_PATTERN = 4  # llama.cpp's cohere2: every fourth layer global (no key for it)
GLM4_NAMES = {  # llama.cpp's GLM-4 norms -> glm4.py's (the rest as Llama's)
    "post_attention_norm": "post_self_attn_layernorm",
    "post_ffw_norm": "post_mlp_layernorm",
}
FUSED = {("glm4", "ffn_up"): ("mlp.gate_proj", "mlp.up_proj")}  # halves of the rows, in order


_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def fused_names(name: str, architecture: str) -> tuple[str, ...]:
    """The HF names a fused GGUF tensor holds, its rows split evenly among them in order (GLM-4's
    `ffn_up`: gate_proj then up_proj); () for any other tensor."""
    m = _BLOCK.match(name)
    parts = FUSED.get((architecture, m.group(2))) if m else None
    if not parts:
        return ()
    return tuple(f"model.layers.{m.group(1)}.{part}.{m.group(3)}" for part in parts)


def eps_key(gguf_arch: str) -> str:
    """The key of the norms' eps: Cohere's (and StarCoder2's) LayerNorm has its own."""
    if gguf_arch in ("command-r", "cohere2", "starcoder2"):
        return "attention.layer_norm_epsilon"
    return "attention.layer_norm_rms_epsilon"


def partial_rotary(gguf_arch: str, rotated: int | None, head_dim: int) -> dict | None:
    """GLM-4's (and GLM-4.5's) `rope_scaling` for a `rope.dimension_count` below the head size
    (None for a whole-head rotary); another family's partial rotary is refused by the caller."""
    if gguf_arch not in ("glm4", "glm4moe") or rotated is None or int(rotated) == head_dim:
        return None
    return {"partial_rotary_factor": int(rotated) / head_dim}


def family_fields(
    get: Callable[..., Any], gguf_arch: str, layers: int, tensor_names: set[str]
) -> dict[str, Any]:
    """`FamilyConfig` fields of these families from the file's keys (`get(key, default)`,
    the architecture's prefix left out)."""
    if gguf_arch == "glm4":
        return {"rope_interleaved": True, "glm4_norms": True}
    fields: dict[str, Any] = {
        "cohere_layer": True,
        "rope_interleaved": True,
        "logit_scale": float(get("logit_scale", 1.0)),
        "qk_norm": "blk.0.attn_q_norm.weight" in tensor_names,
    }
    if gguf_arch == "cohere2":
        window = get("attention.sliding_window")
        if not window:
            raise ValueError("GGUF cohere2 without attention.sliding_window is not supported")
        pattern = get("attention.sliding_window_pattern", COHERE2_SWA_PATTERN)
        if isinstance(pattern, list):
            if len(pattern) != layers:
                raise ValueError(f"GGUF attention.sliding_window_pattern must name each of the "
                                 f"{layers} layers")  # fmt: skip
            sliding = tuple(bool(x) for x in pattern)
        else:
            sliding = tuple(bool((i + 1) % int(pattern)) for i in range(layers))
        fields.update(sliding_window=int(window), window_layers=sliding, rope_layers=sliding)
    return fields
