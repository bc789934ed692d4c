"""Kimi Linear (Kimi Delta Attention layers among NoPE latent attention layers, DeepSeek-V3's
experts: `model/kimi_linear.py`) against transformers, token for token, on a tiny random
checkpoint transformers writes itself in the published form (tests/runtime/hf_oracle.py:
q/k/v convs in three parts, `block_sparse_moe` with experts' w1/w2/w3, the published config
keys `linear_attn_config`, `num_experts`, `num_expert_group`, ...): float32, logits within
1e-3 of transformers' plain greedy loop (its torch chunked KDA) at every step.

The case is the "kimi-linear" row of tests/runtime/hybrid_cases.py (its checkpoint written
once a session by its `built` fixture): `hybrid_checks.check_chunked_batched_preempted` (16-token
steps carrying the conv and KDA states, three prompts sharing steps with two state slots, again
in reverse order, a one-token prompt, preempted and recomputed) and `check_warm_prefix`.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import case_fixture
from hybrid_cases import check_missing_refused, check_refused
from hybrid_checks import check_chunked_batched_preempted, check_two_ranks_linear, check_warm_prefix

transformers = pytest.importorskip("transformers")

case = case_fixture(["kimi-linear"])


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_the_layers_read_from_the_config(built):
    f = built("kimi-linear", reference=False)[2].config.family
    assert f.mamba.mixer == "kda" and f.mamba.layers == (True, False, True)
    assert f.moe_layers == (False, True, True) and f.routing.n_group == 2 and f.mla is not None


def test_a_warm_prefix_restores_the_kda_state(built, monkeypatch):
    """The conv and KDA states' snapshot at 128 is a chunk start of `kda.chunked`."""
    _, model, loaded, _ = built("kimi-linear")
    check_warm_prefix("kimi-linear", model, loaded, monkeypatch, budgets=(256,))  # (16: qwen3.5's)


def test_estimates_checks_and_a_sparse_config(built, tmp_path):
    """The weights estimate against the built model; the checkpoint check naming a missing KDA
    tensor and a KDA conv part; one rank's share of two; a size the KDA heads do not divide and FP8 refused in one line; a config.json
    with transformers' defaults only (KimiLinearConfig's) read without weights."""
    from model_bytes import check_estimate
    from pagoda.runtime.model.loader import read_model_config

    path, _, loaded, _ = built("kimi-linear")
    mc = loaded.config
    check_estimate(path, rel=0.02)
    check_estimate(path, tp=2, rel=0.02)  # rank 0's heads of the KDA and latent layers
    check_refused("kimi-linear", mc)
    check_missing_refused(loaded, ["model.layers.0.self_attn.f_b_proj.weight",
                                   "model.layers.2.self_attn.k_conv1d.weight",
                                   "model.layers.1.self_attn.kv_b_proj.weight",
                                   "model.layers.1.mlp.experts.3.down_proj.weight"])  # fmt: skip
    cfg = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub = read_model_config(str(tmp_path))
    want = transformers.KimiLinearConfig()
    m, f = hub.family.mamba, hub.family
    assert m.layers == tuple(t == "linear_attention" for t in want.layer_types)
    assert (m.n_heads, m.head_dim, m.d_conv) == (32, 128, 4)
    assert f.moe_layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert f.num_experts == want.num_local_experts and f.mla.q_lora_rank is None
    assert hub.max_position_embeddings == want.max_position_embeddings
    # the published Kimi-Linear-48B-A3B config's keys (sparse; its layer kinds 1-indexed)
    full = [4, 8, 12, 16, 20, 24, 27]
    cfg |= {"hidden_size": 2304, "num_hidden_layers": 27, "q_lora_rank": None,
            "linear_attn_config": {"full_attn_layers": full, "head_dim": 128, "num_heads": 32,
                                   "kda_layers": [i for i in range(1, 28) if i not in full],
                                   "short_conv_kernel_size": 4},
            "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
            "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True,
            "moe_router_activation_func": "sigmoid", "first_k_dense_replace": 1,
            "model_max_length": 1048576, "mla_use_nope": True}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub, want = read_model_config(str(tmp_path)), transformers.KimiLinearConfig(**cfg)
    assert hub.family.mamba.layers == tuple(t == "linear_attention" for t in want.layer_types)
    assert hub.family.mamba.layers[3] is False and hub.family.mamba.layers[4] is True
    assert hub.family.num_experts_per_tok == want.num_experts_per_tok == 8
    assert 45e9 < hub.num_params < 52e9, hub.num_params


def test_weights_from_shapes_as_from_its_tensors(built):
    """On CUDA (no packing): the tiny checkpoint's table (its KDA tensors, NoPE latent attention,
    experts) as counted from the shapes alone (`from_shapes`, the plans `fit` suggests)."""
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("kimi-linear")
    mc = loaded.config
    table = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=0.01)


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (`hybrid_checks.check_two_ranks_linear`): the KDA layers by heads (one a rank: q, k, v, b and the gates'
    second factors by rows, the conv's channels, A, dt_bias and state slots; o_proj by
    columns), the NoPE latent attention and experts as DeepSeek's."""
    check_two_ranks_linear(built, "kimi-linear")
