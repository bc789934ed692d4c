"""Where a mixture-of-experts family keeps its tensors under a layer's ``model.layers.{i}.``,
for the families whose names are not DeepSeek's (``mlp.gate.weight``, the correction bias
``mlp.gate.e_score_correction_bias``, ``mlp.shared_experts.``): one table that the model
classes (`moe.SparseMoE` reads their attributes), the checkpoint check and the weights estimate
share. Kept apart from the models so that checking a checkpoint imports no layer code."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeNames:
    block: str = "mlp."  # the MLP's prefix in the layer
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # experts.{e}.<name>
    router: str = "gate.weight"
    bias: str = "gate.e_score_correction_bias"  # the choice-only correction bias, if routed so
    bias_rows: bool = False  # the bias stored as one row [1, E] (ERNIE's moe_statics)
    shared: str = "shared_experts."  # the ungated shared expert, where the family has one


DEEPSEEK = MoeNames()
NAMES: dict[str, MoeNames] = {
    "ernie4_5_moe": MoeNames(bias="moe_statics.e_score_correction_bias", bias_rows=True),
    "hunyuan_v1_moe": MoeNames(router="gate.wg.weight", shared="shared_mlp."),
    "afmoe": MoeNames(router="router.gate.weight", bias="expert_bias"),
    "exaone_moe": MoeNames(bias="e_score_correction_bias"),
    "hy_v3": MoeNames(router="router.gate.weight", bias="expert_bias", shared="shared_mlp."),
    "laguna": MoeNames(bias="experts.e_score_correction_bias", shared="shared_expert."),
    "lara_mini": MoeNames(shared="shared_expert."),  # (its experts stacked: qwen3_next_config)
    "flint": MoeNames(shared="shared_expert."),
    "jamba": MoeNames(block="feed_forward.", router="router.weight"),
    "aria_text": MoeNames(router="router.weight"),  # (its experts stacked: aria_config)
    "phimoe": MoeNames(block="block_sparse_moe.", experts=("w1", "w3", "w2")),
    "minimax": MoeNames(block="block_sparse_moe.", experts=("w1", "w3", "w2")),
    "minimax_m2": MoeNames(
        block="block_sparse_moe.", experts=("w1", "w3", "w2"), bias="e_score_correction_bias"
    ),
}


def of(architecture: str) -> MoeNames:
    """The names of `architecture`'s experts (DeepSeek's where the table has none)."""
    return NAMES.get(architecture, DEEPSEEK)
