"""GLM-5-Next (GLM-5.3-Flash's text model: KDA layers with GLM's bounded low-rank forget gate,
NoPE latent attention with the k-pool DSA indexer, mHC hyper-connections, DeepSeek-V3's
experts with every SwiGLU clamped: `model/glm5_next.py`) against transformers, token for
token, on a tiny random `Glm5NextForConditionalGeneration` transformers writes itself (its
published form: KDA convs in q, k, v parts, ``hc_attn_fn``, ``self_attn.A_log``, experts one by
one, a vision tower not read): float32, logits within 1e-3 of transformers' plain greedy loop.
The indexer keeps 4 pools of 4 (index_topk 16) and the unfinished pool: the prompts (23 to 153
tokens) attend sparsely past 19 tokens, a one-token prompt densely. Measured once on a
checkpoint of this shape: attending densely, transformers' tokens differ; without the pools'
position logits or without the SwiGLU clamp, the logits differ from transformers' by 0.4 to 2.7.

The case is the "glm5-next" row of tests/runtime/hybrid_cases.py:
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

NAME = "glm5-next"
case = case_fixture([NAME])


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_a_warm_prefix_restores_the_kda_state(built, monkeypatch):
    _, model, loaded, _ = built(NAME)
    check_warm_prefix(NAME, model, loaded, monkeypatch, budgets=(256,))


def test_refusals(built, tmp_path):
    """Tensor parallelism and FP8 refused in one line; a missing KDA, hyper-connection, expert
    or k-pool indexer tensor, naming it; an unbounded forget gate, an indexer that drops the
    unfinished pool and a "shared" indexer after a layer without one refused when the config
    is read."""
    from pagoda.runtime.model.loader import read_model_config

    loaded = built(NAME, reference=False)[2]
    mc = loaded.config
    f = mc.family
    assert f.mamba.mixer == "kda" and f.mamba.layers == (True, False, False)
    assert f.moe_layers == (False, True, True) and f.routing.n_group == 2
    assert f.mla.qk_rope_head_dim == 0 and f.kda_lower_bound == -4.0
    assert f.mla.indexer.full_layers == (False, True, False) and f.mla.indexer.kpool == 4
    assert f.mla.cache_width == 32 + 2 * 16  # the latent, the indexer key, the gate score
    assert (f.hyper.mult, f.hyper.sinkhorn_iters, f.swiglu_limit) == (2, 4, 1.0)
    check_refused(NAME, mc)
    check_missing_refused(loaded, ["model.layers.0.self_attn.forget_gate.f_b_proj.weight",
                                   "model.layers.0.self_attn.k_conv1d.weight",
                                   "model.layers.2.ffn_hc.fn",
                                   "model.layers.1.self_attn.indexer.index_kpool_compress_ape",
                                   "model.layers.1.mlp.experts.3.down_proj.weight"])  # fmt: skip
    cfg = {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next"}
    for text, words in (({"linear_lower_bound": None}, "linear_lower_bound null is not"),
                        ({"index_kpool_always_select_tail": False},
                         "index_kpool_always_select_tail false is not supported"),
                        ({"num_hidden_layers": 4, "indexer_types": ["full"] * 3 + ["shared"]},
                         "layer 3's indexer is 'shared' but layer 2 runs no indexer")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "text_config": text}))
        with pytest.raises(ValueError, match=words) as e:
            read_model_config(str(tmp_path))
        assert "\n" not in str(e.value)


def test_a_published_style_config(tmp_path):
    """A config.json with transformers' defaults only (Glm5NextConfig's: GLM-5.3-Flash's shape)
    read without weights: the layer, MLP, KDA and indexer schedule, and the parameter count
    transformers' own text model and head have (on the meta device)."""
    import torch
    from pagoda.runtime.model.loader import read_model_config

    cfg = {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
           "text_config": {"model_type": "glm5_next_text"}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub = read_model_config(str(tmp_path))
    want = transformers.Glm5NextTextConfig()
    m, f = hub.family.mamba, hub.family
    assert m.layers == tuple(t == "linear_attention" for t in want.layer_types)
    assert (m.n_heads, m.head_dim, m.d_conv) == (64, 128, 4)
    assert f.moe_layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert f.num_experts == 288 and f.mla.q_lora_rank == 1536 and not hub.tie_word_embeddings
    assert hub.context_length == 1048576 and hub.vocab_size == want.vocab_size
    ix = f.mla.indexer
    assert ix.full_layers == tuple(t == "indexed_attention" for t in want.layer_types)
    assert (ix.topk, ix.kpool, ix.n_heads, ix.head_dim) == (2048, 16, 32, 128)
    with torch.device("meta"):
        text = transformers.Glm5NextTextModel(want)
    n = sum(p.numel() for p in text.parameters()) + want.vocab_size * want.hidden_size
    assert hub.num_params == pytest.approx(n, rel=0.02), (hub.num_params, n)


def test_the_weights_estimate(built):
    """The weights estimate against the built model (`model_bytes.check_estimate`), and on CUDA
    (no packing) the checkpoint's table as counted from the shapes alone (`from_shapes`: the
    float32 hyper-connections and KDA tensors, the k-pool indexers)."""
    import torch
    from model_bytes import check_estimate
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built(NAME, reference=False)
    mc = loaded.config
    check_estimate(path, rel=0.02)
    check_estimate(path, tp=2, rel=0.02)  # rank 0's heads of the KDA and attention layers
    table = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=0.01)


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (`hybrid_checks.check_two_ranks_linear`): Kimi Linear's split of the KDA layer beside the k-pool indexer and
    mHC streams, whole on every rank (the ranks pick the same pools: past 19 tokens sparse)."""
    check_two_ranks_linear(built, NAME)
