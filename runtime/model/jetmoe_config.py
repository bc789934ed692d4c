"""JetMoE's config.json (`JetMoeForCausalLM`: jetmoe/jetmoe-8b) as transformers' JetMoeConfig
reads it: `kv_channels` is the head size, `activation_function` the experts' activation (silu),
the query heads `num_key_value_heads x num_experts_per_tok` (JetMoeConfig derives them, whatever
config.json says: `config_keys.derived`), and `num_local_experts` experts of width
`intermediate_size` in both the attention (a mixture of attention heads) and the MLP of every
layer, the top `num_experts_per_tok` picked by the softmax over their logits. `jetmoe.JetMoeModel`
runs it. Kept apart from the model so that reading a config imports no layer code.

Its tensors (per layer `model.layers.N.`): `self_attention.kv_proj` [2 Hkv D, hidden] (keys,
then values), `self_attention.experts.{input_linear [E, Hkv D, hidden], output_linear [E, hidden,
Hkv D], bias [hidden], router.layer [E, hidden]}`, `mlp.{input_linear [E, 2 N, hidden] (gate,
then up), output_linear [E, hidden, N], bias [hidden], router.layer [E, hidden]}`,
`input_layernorm`, `post_attention_layernorm` (`expected_shapes`).

Tensor parallelism (`distributed/tp_families.py`): the KV heads split over the ranks, never
replicated (`tp_problem`), each with every expert's query heads of it; `kv_proj`'s rows of a
rank's KV heads (`rank_rows`); the experts' projections by the shared rules (`input_linear`'s
rows, `output_linear`'s columns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

ARCHITECTURES = {"JetMoeForCausalLM": "jetmoe"}
MODEL_CLASSES = {"jetmoe": ("jetmoe", "JetMoeModel")}
# transformers' JetMoeConfig defaults (under the names `config_keys` reads them as); tied
DEFAULTS: dict[str, dict[str, Any]] = {
    "jetmoe": {"vocab_size": 32_000, "hidden_size": 2048, "num_hidden_layers": 12,
               "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 5632,
               "max_position_embeddings": 4096, "num_local_experts": 8,
               "num_experts_per_tok": 2, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
               "rope_theta": 10_000.0, "bos_token_id": 1, "eos_token_id": 2},
}  # fmt: skip
# the norms inside each layer: JetMoeRMSNorm's default eps, whatever rms_norm_eps says (which
# only the final norm reads)
LAYER_NORM_EPS = 1e-6


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a JetMoE config.json: its experts (the MLP's; the attention's
    are as many, picked as many)."""
    e, k = int(cfg["num_local_experts"]), int(cfg["num_experts_per_tok"])
    if k > e:
        raise ValueError(f"num_experts_per_tok {k} is more than num_local_experts {e}")
    return {
        "num_experts": e,
        "num_experts_per_tok": k,
        "moe_intermediate_size": int(cfg["intermediate_size"]),
        "norm_topk_prob": True,  # the softmax over the top-k logits
        "round_topk_to_model_dtype": True,  # (`type_as(hidden_states)`)
    }


def expected_shapes(c, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s attention and MLP tensors (module docstring), for `checkpoint_shapes`."""
    h, e, n = c.hidden_size, c.family.num_experts, c.family.moe_intermediate_size
    kv = c.num_kv_heads * c.head_dim
    a, m = f"model.layers.{i}.self_attention.", f"model.layers.{i}.mlp."
    return {a + "kv_proj.weight": (2 * kv, h),
            a + "experts.input_linear.weight": (e, kv, h),
            a + "experts.output_linear.weight": (e, h, kv),
            a + "experts.bias": (h,), a + "experts.router.layer.weight": (e, h),
            m + "input_linear.weight": (e, 2 * n, h), m + "output_linear.weight": (e, h, n),
            m + "bias": (h,), m + "router.layer.weight": (e, h)}  # fmt: skip


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split JetMoE's attention (one line), or None: its KV heads must
    divide by `size` (every expert's query heads of a KV head sit on that head's rank)."""
    if c.num_kv_heads % size == 0:  # (`tp_families` asks only for JetMoE)
        return None
    return (f"--tensor-parallel-size {size} does not divide JetMoE's KV heads (num_key_value_heads "
            f"{c.num_kv_heads}: each is split with its attention experts' query heads, not "
            "replicated)")  # fmt: skip


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay: TPLayout):
    """A rank's (rows, columns) of `kv_proj` (the keys and values of its KV heads), or None for
    the other tensors (`distributed/tp_families.py`)."""
    if part != "self_attention.kv_proj.weight":
        return None
    h0, h1 = lay.even(c.num_kv_heads)
    return 2 * (h1 - h0) * c.head_dim, cols
