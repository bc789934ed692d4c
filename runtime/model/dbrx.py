"""DBRX (`DbrxForCausalLM`: databricks/dbrx-base, dbrx-instruct; config in `dbrx_config.py`):
MPT's layer (`bloom.MptModel`: LayerNorms with a weight and no bias, eps 1e-5; q, k and v
stacked in `Wqkv`, clamped to [-clip_qkv, clip_qkv]) with the rotary in the rotate-half layout
instead of ALiBi, grouped KV heads (`attn_config.kv_n_heads`), and Mixtral-style experts in
every layer (`moe.SparseMoE`: a softmax router, top-`moe_top_k`, renormalised where
`moe_normalize_expert_weights` is 1, SwiGLU experts), an untied head.

Its tensors are read under Llama's names (`safetensors_weights`: `transformer.blocks.N.
norm_attn_norm.{norm_1,attn.Wqkv,attn.out_proj,norm_2}`, `ffn.router.layer` as `mlp.gate`,
`wte`, `norm_f`). Each layer's experts are stored as three matrices of E x N rows
(`ffn.experts.mlp.w1`, `v1`, `w2`, each [E N, hidden]): `split_experts` lists expert e's rows
of w1 and v1 as its gate_proj and up_proj and of w2, read transposed, as its down_proj [hidden,
N], so that tensor parallelism, the checkpoint check and the weights estimate see Mixtral's
per-expert matrices (nothing is copied at listing; each part is read alone).
"""

from __future__ import annotations

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.bloom import MptModel
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights

# the stacked matrix -> the per-expert one it holds E of, and whether read transposed
_STACKS = {"w1": ("gate_proj", False), "v1": ("up_proj", False), "w2": ("down_proj", True)}
_FP8 = ("weight_scale", "weight_scale_inv", "input_scale")


def split_experts(weights: SafetensorsWeights, config: ModelConfig) -> None:
    """List each layer's stacked experts as Mixtral's per-expert matrices (module docstring);
    ValueError, one line, for a stack that is missing, of the wrong height, or FP8."""
    e, n = config.family.num_experts, config.family.moe_intermediate_size
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}.mlp.experts."
        for stack, (name, transposed) in _STACKS.items():
            if f"{prefix}0.{name}.weight" in weights:
                continue  # listed already
            if prefix + stack not in weights:
                raise ValueError(f"checkpoint is missing tensor {prefix + stack!r}")
            if any(f"{prefix}{stack}_{s}" in weights for s in _FP8):
                raise ValueError(f"checkpoint tensor {prefix}{stack} is FP8-quantized: FP8 DBRX "
                                 "checkpoints are not supported")  # fmt: skip
            parts = [(f"{prefix}{x}.{name}.weight", x * n, (x + 1) * n) for x in range(e)]
            weights.split_rows(prefix + stack, parts, transposed=transposed)


class DbrxModel(MptModel):
    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp
