"""BailingHybrid (Ling 3: KDA layers with full-rank forget and output gates beside rotated
latent attention gated per head, DeepSeek-V3's experts: `model/bailing_hybrid.py`) against
transformers, token for token, on a tiny random checkpoint transformers writes itself in the
published form (tests/runtime/hf_oracle.py: `word_embeddings`, `attention.`, `dense`, q/k/v
convs in three parts, `expert_bias`; the published config keys `num_experts`,
`num_expert_group`, ...): float32, logits within 1e-3 of transformers' plain greedy loop.

The case is the "bailing-hybrid" row of tests/runtime/hybrid_cases.py:
`check_chunked_batched_preempted` (16-token steps carrying the conv and KDA states, three
prompts sharing steps with two state slots, again in reverse order, a one-token prompt,
preempted and recomputed) and `check_warm_prefix`.
"""

from __future__ import annotations

import json

import pytest
from arch_cases import case_fixture
from hybrid_cases import check_missing_refused, check_refused
from hybrid_checks import check_chunked_batched_preempted, check_two_ranks_linear, check_warm_prefix

transformers = pytest.importorskip("transformers")

case = case_fixture(["bailing-hybrid"])


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_a_warm_prefix_restores_the_kda_state(built, monkeypatch):
    _, model, loaded, _ = built("bailing-hybrid")
    check_warm_prefix("bailing-hybrid", model, loaded, monkeypatch, budgets=(256,))


def test_checks_refusals_and_a_sparse_config(built, tmp_path):
    """The checkpoint check naming a missing KDA tensor, a conv part and the head gate; tensor
    parallelism, FP8, SwiGLU clipping and the unbounded forget gate refused in one line; a
    config.json
    with transformers' defaults only (BailingHybridConfig's) read without weights."""
    from pagoda.runtime.model.loader import read_model_config

    loaded = built("bailing-hybrid")[2]
    mc = loaded.config
    f = mc.family
    assert f.mamba.mixer == "kda" and f.mamba.layers == (True, False)
    assert f.rope_layers == (False, True) and f.kda_lower_bound == -4.0
    assert f.moe_layers == (False, True) and f.routing.n_group == 2
    check_refused("bailing-hybrid", mc)
    check_missing_refused(loaded, ["model.layers.0.self_attn.f_proj.weight",
                                   "model.layers.0.self_attn.k_conv1d.weight",
                                   "model.layers.1.self_attn.g_proj.weight",
                                   "model.layers.1.mlp.experts.3.down_proj.weight"])  # fmt: skip
    cfg = {"architectures": ["BailingHybridForCausalLM"], "model_type": "bailing_hybrid"}
    clipped = {**cfg, "num_hidden_layers": 2, "expert_swiglu_limit_list": [0, 7.0]}
    unbounded = {**cfg, "kda_safe_gate": False}
    for edit, words in ((clipped, "expert_swiglu_limit_list .*SwiGLU clipping"),
                        (unbounded, "kda_safe_gate false is not supported")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(edit))
        with pytest.raises(ValueError, match=words) as e:
            read_model_config(str(tmp_path))
        assert "\n" not in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub = read_model_config(str(tmp_path))
    want = transformers.BailingHybridConfig()
    m, f = hub.family.mamba, hub.family
    assert m.layers == tuple(t == "linear_attention" for t in want.layer_types)
    assert (m.n_heads, m.head_dim, m.d_conv) == (32, 128, 4)
    assert f.moe_layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert f.num_experts == want.num_local_experts and f.mla.q_lora_rank is None
    assert hub.max_position_embeddings == want.max_position_embeddings
    assert hub.rope_theta == want.rope_parameters["rope_theta"]
    with __import__("torch").device("meta"):
        n = sum(p.numel() for p in transformers.BailingHybridForCausalLM(want).parameters())
    assert hub.num_params == pytest.approx(n, rel=0.02), (hub.num_params, n)


def test_the_weights_estimate(built):
    """The weights estimate against the built model, and on CUDA (no packing) the tiny
    checkpoint's table as counted from the shapes alone (`from_shapes`)."""
    import torch
    from model_bytes import check_estimate
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("bailing-hybrid")
    mc = loaded.config
    check_estimate(path, rel=0.02)
    check_estimate(path, tp=2, rel=0.02)  # rank 0's heads of the KDA and attention layers
    table = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=0.01)


def test_bfloat16_rounds_where_transformers_does(built):
    """In bfloat16 the KDA conv runs in float32 (transformers keeps its weight so) and its SiLU
    output, the forget gate and the heads' gates are rounded where transformers rounds them:
    the same 8 greedy tokens as transformers' bfloat16 model (with the conv in bfloat16 they
    part at the 7th)."""
    import torch
    from pagoda.runtime import LLM, SamplingParams

    path = built("bailing-hybrid", reference=False)[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids = [5, 17, 42, 99, 7, 3, 250, 11]
    want = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, 8:].tolist()
    llm = LLM(str(path), dtype="bfloat16", device="cpu", kv_cache_memory=4 << 20)
    got = llm.generate([ids], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert got[0].outputs[0].token_ids == want


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (`hybrid_checks.check_two_ranks_linear`): Kimi Linear's split with full-rank KDA gates by rows and the
    attention's per-head gate by heads."""
    check_two_ranks_linear(built, "bailing-hybrid")
