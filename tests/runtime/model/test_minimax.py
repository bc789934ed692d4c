"""MiniMax-Text-01 (lightning attention layers among softmax attention layers, Mixtral's
experts, residual weights by sublayer: `model/minimax.py`) against transformers, token for
token, on a tiny random checkpoint transformers writes itself: float32, logits within 1e-3 of
transformers' plain greedy loop (its block form of lightning attention, blocks of 8 here) at
every step.

The case is the "minimax" row of tests/runtime/hybrid_cases.py:
`hybrid_checks.check_chunked_batched_preempted` (16-token steps carrying the lightning states in
the state slots, three prompts sharing steps with two slots, again in reverse order on the
warm prefix cache, a one-token prompt, preempted and recomputed), `check_decode_slots_out_of_order`
(the torch decode step) and `check_warm_prefix`."""

from __future__ import annotations

import json

import pytest
from arch_cases import case_fixture
from hybrid_cases import check_missing_refused, check_refused
from hybrid_checks import (
    check_chunked_batched_preempted,
    check_decode_slots_out_of_order,
    check_two_ranks_linear,
    check_warm_prefix,
)

transformers = pytest.importorskip("transformers")

case = case_fixture(["minimax"])


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_decode_slots_out_of_order_in_torch(built, monkeypatch):
    """The decode rows' torch step (CUDA's; the CPU's native one above): gathered and
    scattered back where the slots are not one run, updated in place where they are."""
    _, model, loaded, _ = built("minimax")
    check_decode_slots_out_of_order(model, loaded, monkeypatch, native=False)


def test_a_warm_prefix_restores_the_lightning_state(built, monkeypatch):
    _, model, loaded, _ = built("minimax")
    check_warm_prefix("minimax", model, loaded, monkeypatch, budgets=(256,))


def test_estimates_checks_and_a_sparse_config(built, tmp_path):
    """The weights estimate against the built model; the checkpoint check naming a missing
    lightning tensor and an expert; tensor parallelism and FP8 refused in one line; a
    config.json with transformers' defaults only read as transformers reads it."""
    from model_bytes import check_estimate
    from pagoda.runtime.model.loader import read_model_config

    path, _, loaded, _ = built("minimax", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert (m.mixer, m.layers, m.chunk_size, mc.num_kv_layers) == (
        "lightning", (False, True, True), 8, 1)  # fmt: skip
    assert (m.minimax.full_attn, m.minimax.linear_attn, m.minimax.mlp) == (
        (1.5, 0.9), (1.3, 0.7), (1.2, 0.8))  # fmt: skip
    check_estimate(path, rel=0.001)  # (the decay buffers not counted: 0.4% here)
    check_estimate(path, tp=2, rel=0.001)  # rank 0's heads of every layer, half the experts
    check_refused("minimax", mc)
    check_missing_refused(loaded, ["model.layers.1.self_attn.output_gate.weight",
                                   "model.layers.2.self_attn.norm.weight",
                                   "model.layers.0.block_sparse_moe.experts.3.w2.weight",
                                   "model.layers.2.block_sparse_moe.gate.weight"])  # fmt: skip
    cfg = {"architectures": ["MiniMaxForCausalLM"], "model_type": "minimax"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub, want = read_model_config(str(tmp_path)), transformers.MiniMaxConfig()
    assert hub.family.mamba.layers == tuple(t == "linear_attention" for t in want.layer_types)
    assert (hub.family.mamba.n_heads, hub.head_dim, hub.family.num_experts) == (32, 128, 8)
    assert hub.rope_theta == want.rope_parameters["rope_theta"]


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (`hybrid_checks.check_two_ranks_linear`): the lightning layers by heads (q/k/v interleaved per head, the
    output gate, the decays), the norm over all heads from both ranks' sums of squares."""
    check_two_ranks_linear(built, "minimax")
