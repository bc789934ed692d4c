"""Aria's text model's config.json (`AriaTextForCausalLM`: the language model of rhymes-ai/Aria)
as transformers' AriaTextConfig reads it. Its model (`moe.AriaTextModel`) is Llama's attention
with experts in every layer:

- `mlp.router.weight` [E, hidden]: the top-`moe_topk` router logits, weighted by their softmax
  (the renormalised top-k of a full softmax: `ExpertRouting` softmax with `norm_topk_prob`);
- `moe_num_experts` SiLU-gated experts of `intermediate_size`, stacked as transformers keeps
  them for `grouped_mm`: `mlp.experts.gate_up_proj` [E, hidden, 2N] (gate, then up) and
  `mlp.experts.down_proj` [E, N, hidden], read transposed (`moe._ExpertTensors`); the published
  checkpoints' `mlp.experts.fc1.weight` / `fc2.weight` (transformers' conversion mapping) are
  listed under those names;
- beside them an ungated shared MLP (`mlp.shared_experts.`) of `intermediate_size` x
  `moe_num_shared_experts`, added.

Refused in one line: a `hidden_act` other than silu (the routed experts are SiLU-gated whatever
it says, the shared MLP follows it; one activation runs both here). Kept apart from the model so
that reading a config imports no layer code.
"""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model_configs import ExpertRouting

# AriaForConditionalGeneration (rhymes-ai/Aria): its text model, read text-only (the vision
# tower and projector are not read); its head untied unless the top-level flag says
ARCHITECTURES = {"AriaTextForCausalLM": "aria_text", "AriaForConditionalGeneration": "aria_text"}
TEXT_MODEL_TYPES = {"AriaForConditionalGeneration": {"aria_text": "aria_text"}}
WRAPPER_TIES = {"aria": False}  # (AriaConfig's)
MODEL_CLASSES = {"aria_text": ("moe", "AriaTextModel")}
# transformers' AriaTextConfig defaults (LlamaConfig's, Aria's own), where config.json leaves
# one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "aria_text": {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 4096,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
                  "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1,
                  "eos_token_id": 2, "pad_token_id": 2, "tie_word_embeddings": False,
                  "moe_num_experts": 8, "moe_topk": 2, "moe_num_shared_experts": 2},
}  # fmt: skip
# the published (pre-transformers 5) names of the stacked experts -> transformers 5's
_RENAMES = ((".mlp.experts.fc1.weight", ".mlp.experts.gate_up_proj"),
            (".mlp.experts.fc2.weight", ".mlp.experts.down_proj"))  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of an Aria text config.json, as transformers reads them;
    ValueError, one line, for what it does not run."""
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"aria_text hidden_act {cfg['hidden_act']!r} is not supported: its "
                         "experts are SiLU-gated, and only silu runs both them and the shared "
                         "MLP here")  # fmt: skip
    width = int(cfg["intermediate_size"])
    return {
        "routing": ExpertRouting(),  # softmax; greedy top-k, renormalised
        "norm_topk_prob": True,
        "round_topk_to_model_dtype": True,  # (transformers' softmax in the model's dtype)
        "num_experts": int(cfg["moe_num_experts"]),
        "num_experts_per_tok": int(cfg["moe_topk"]),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width * int(cfg["moe_num_shared_experts"]),
    }


def expert_shapes(c) -> dict[str, tuple[int, ...]]:
    """Each layer's stacked experts as stored ([E, hidden, 2N], [E, N, hidden])."""
    e, h, n = c.family.num_experts, c.hidden_size, c.family.moe_intermediate_size
    out: dict[str, tuple[int, ...]] = {}
    for i in range(c.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        out.update({p + "gate_up_proj": (e, h, 2 * n), p + "down_proj": (e, n, h)})
    return out


def rename_tensors(weights) -> None:
    """The published experts' names listed as transformers 5's (the same layouts)."""
    for name in list(weights):
        for old, new in _RENAMES:
            if name.endswith(old):
                weights.rename(name, name[: -len(old)] + new)


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its stacked experts, stored [in, out] (`expert_shapes`), in
    `checkpoint_shapes.expected_shapes`' tensors."""
    out.update(expert_shapes(c))
