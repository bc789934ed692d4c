"""Phi-3 / Phi-4 (`Phi3ForCausalLM`: Phi-3-mini/medium, Phi-3.5-mini, phi-4, Phi-4-mini).

The decoder is Llama's (`llama.py`); what differs is read as Llama's:

- the checkpoint fuses q/k/v into one `self_attn.qkv_proj` and gate/up into one
  `mlp.gate_up_proj`: `split_fused` lists their rows under Llama's names (nothing is copied;
  each part is read alone), so tensor parallelism cuts q by heads, k and v by KV heads and
  gate/up by width exactly as for a Llama checkpoint;
- `rope_scaling` type longrope (or its older names su / yarn, which transformers' Phi-3 config
  reads as longrope): short and long factors, the attention factor (`ops.rope_inv_freq`) and
  the per-sequence switch past `original_max_position_embeddings` (`longrope.py`);
- `partial_rotary_factor` (Phi-4-mini): only the first dims of each head rotate;
- `sliding_window`, when set, on every layer (as Mistral's).
"""

from __future__ import annotations

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights

# fused module -> its parts (Llama's modules), in the fused matrix's row order
FUSED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
         "mlp.gate_up_proj": ("gate_proj", "up_proj")}  # fmt: skip
_FAMILIES = {"phi3": "Phi-3", "glm": "GLM", "glm4": "GLM-4"}  # (GLM's gate_up_proj: glm4.py)
_SCALES = ("weight_scale", "weight_scale_inv", "input_scale")


def split_fused(weights: SafetensorsWeights, config: ModelConfig) -> None:
    """List each layer's fused matrices as their parts (module docstring); ValueError, one line,
    for a fused matrix that is missing, of the wrong height, or quantized to FP8."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for layer in range(config.num_layers):
        for fused, parts in FUSED.items():
            prefix = f"model.layers.{layer}.{fused}."
            module = prefix.rsplit(".", 2)[0] + "."  # model.layers.N.self_attn.
            if f"{module}{parts[0]}.weight" in weights:
                continue  # stored apart already
            if prefix + "weight" not in weights:
                raise ValueError(f"checkpoint is missing tensor {prefix + 'weight'!r}")
            if any(prefix + s in weights for s in _SCALES):
                family = _FAMILIES.get(config.architecture, config.architecture)
                raise ValueError(f"checkpoint tensor {prefix}weight is FP8-quantized: FP8 "
                                 f"{family} checkpoints (fused qkv/gate_up) are not supported")  # fmt: skip
            if len(parts) == 3:
                sizes = [q, kv, kv]
            else:  # gate and up: halves
                sizes = [weights.dtype_and_shape(prefix + "weight")[1][0] // 2] * 2
            for kind in ("weight", "bias"):
                if prefix + kind not in weights:
                    continue
                edges, start = [], 0
                for part, size in zip(parts, sizes):
                    edges.append((f"{module}{part}.{kind}", start, start + size))
                    start += size
                weights.split_rows(prefix + kind, edges)
