"""GLM-5-Next (GLM-5.3-Flash's text model: KDA layers with GLM's bounded low-rank forget gate,
NoPE latent attention with the k-pool DSA indexer, mHC hyper-connections, DeepSeek-V3's
experts with every SwiGLU clamped: `model/glm5_next.py`) against transformers, token for
token, on a tiny random `Glm5NextForConditionalGeneration` transformers writes itself (its
published form: KDA convs in q, k, v parts, ``hc_attn_fn``, ``self_attn.A_log``, experts one by
one, a vision tower not read): float32, logits within 1e-3 of transformers' plain greedy loop.

The case is the "glm5-next" row of tests/runtime/hybrid_cases.py:
`check_chunked_batched_preempted` (16-token steps carrying the conv and KDA states, three
prompts sharing steps with two state slots, again in reverse order, a one-token prompt,
preempted and recomputed) and `check_warm_prefix`.
"""

from __future__ import annotations

import json

import pytest
from arch_cases import case_fixture
from hybrid_cases import (
    check_chunked_batched_preempted,
    check_missing_refused,
    check_refused,
    check_warm_prefix,
)

transformers = pytest.importorskip("transformers")

NAME = "glm5-next"
case = case_fixture([NAME])


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_a_warm_prefix_restores_the_kda_state(built, monkeypatch):
    _, model, loaded, _ = built(NAME)
    check_warm_prefix(NAME, model, loaded, monkeypatch, budgets=(256,))


def test_refusals_and_the_context_cap(built, tmp_path):
    """Tensor parallelism and FP8 refused in one line; a --max-model-len past the indexer's
    dense reach (index_topk 256 + pools of 4 - 1 = 259 tokens) too, the context capped there;
    a missing KDA, hyper-connection or expert tensor, naming it; an unbounded forget gate and
    an indexer that drops the unfinished pool refused when the config is read."""
    from pagoda.runtime.engine.core import check_max_model_len
    from pagoda.runtime.model.loader import read_model_config

    loaded = built(NAME, reference=False)[2]
    mc = loaded.config
    f = mc.family
    assert f.mamba.mixer == "kda" and f.mamba.layers == (True, False, False)
    assert f.moe_layers == (False, True, True) and f.routing.n_group == 2
    assert f.mla.qk_rope_head_dim == 0 and f.kda_lower_bound == -4.0
    assert (f.hyper.mult, f.hyper.sinkhorn_iters, f.swiglu_limit) == (2, 20, 3.0)
    check_refused(NAME, mc)
    assert mc.context_length == 259 and check_max_model_len(None, mc) == 259
    with pytest.raises(ValueError, match=r"^max_model_len 260 is not supported for a glm5_next "
                       r"model: its DSA indexer's sparse k-pool selection \(past .* 259 "
                       r"tokens\) is not implemented"):  # fmt: skip
        check_max_model_len(260, mc)
    check_missing_refused(loaded, ["model.layers.0.self_attn.forget_gate.f_b_proj.weight",
                                   "model.layers.0.self_attn.k_conv1d.weight",
                                   "model.layers.2.ffn_hc.fn",
                                   "model.layers.1.mlp.experts.3.down_proj.weight"])  # fmt: skip
    cfg = {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next"}
    for text, words in (({"linear_lower_bound": None}, "linear_lower_bound null is not"),
                        ({"index_kpool_always_select_tail": False},
                         "index_kpool_always_select_tail false is not supported")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "text_config": text}))
        with pytest.raises(ValueError, match=words) as e:
            read_model_config(str(tmp_path))
        assert "\n" not in str(e.value)


def test_a_published_style_config(tmp_path):
    """A config.json with transformers' defaults only (Glm5NextConfig's: GLM-5.3-Flash's shape)
    read without weights: the layer, MLP and KDA schedule, the context capped at the indexer's
    dense reach (2048 + 16 - 1), and the parameter count transformers' own text model and head
    have (on the meta device)."""
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
    assert hub.context_length == 2063 and hub.vocab_size == want.vocab_size
    with torch.device("meta"):
        text = transformers.Glm5NextTextModel(want)
    n = sum(p.numel() for p in text.parameters()) + want.vocab_size * want.hidden_size
    assert hub.num_params == pytest.approx(n, rel=0.02), (hub.num_params, n)


def test_the_weights_estimate(built):
    """The weights estimate against the built model (`model_bytes.check_estimate`)."""
    from model_bytes import check_estimate

    check_estimate(built(NAME, reference=False)[0], rel=0.02)
