"""LaraMini (`LaraMiniForCausalLM`: Qwen3.5's Gated DeltaNet layers, Qwen3 attention in a
window with rotary or global without, Flint's experts; `model/lara_mini.py`) against
transformers, token for token, on the tiny random checkpoint transformers writes itself
(tests/runtime/hf_oracle.py; its "lara-mini" row of tests/runtime/hybrid_cases.py, saved as
the published checkpoints are: the DeltaNet's projections fused into one `in_proj`, its gated
norm `out_norm`, the experts stacked): float32, logits within 1e-3 of transformers' plain
greedy loop at every step, chunked in 16-token steps, batched with two state slots, again
from the prefix cache, preempted and recomputed (`check_chunked_batched_preempted`).
"""

from __future__ import annotations

import json

import pytest
from hybrid_cases import check_missing_refused, check_refused
from hybrid_checks import check_chunked_batched_preempted

transformers = pytest.importorskip("transformers")


def test_greedy_matches_transformers_chunked_batched_and_preempted(built):
    path, model, loaded, reference = built("lara-mini")
    f = loaded.config.family
    assert f.window_layers == (False, True, False, True) and f.sliding_window == 8
    assert f.rope_layers == (False, True, False, True)
    check_chunked_batched_preempted(("lara-mini", path, model, loaded, reference))


def test_estimates_checks_and_a_sparse_config(built, tmp_path):
    """The weights estimate against the built model; the checkpoint check naming a missing
    fused `in_proj` and `out_norm`; a tensor parallel size that does not divide the key heads,
    and FP8, refused in one line (and a partial rotary, which transformers' LaraMini does not
    read); a config.json with LaraMiniConfig's defaults only
    (Lara-4-Mini's shape: the period-5 layer pattern, its window) read without weights, its
    parameter count as transformers counts it on the meta device."""
    import torch
    from model_bytes import check_estimate
    from pagoda.runtime.model.loader import read_model_config

    path, _, loaded, _ = built("lara-mini")
    check_estimate(path, rel=0.02)
    check_refused("lara-mini", loaded.config)
    check_missing_refused(loaded, ["model.layers.0.linear_attn.in_proj.weight",
                                   "model.layers.0.linear_attn.out_norm.weight"])  # fmt: skip
    cfg = {"architectures": ["LaraMiniForCausalLM"], "model_type": "lara_mini"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub = read_model_config(str(tmp_path))
    f, want = hub.family, transformers.LaraMiniConfig()
    assert want.layer_types[:5] == ["linear_attention", "sliding_attention", "linear_attention",
                                    "full_attention", "sliding_attention"]  # fmt: skip
    assert f.mamba.layers == tuple(t == "linear_attention" for t in want.layer_types)
    assert f.window_layers == tuple(t == "sliding_attention" for t in want.layer_types)
    assert f.sliding_window == 512 and hub.tie_word_embeddings and not f.mamba.attn_output_gate
    assert (f.num_experts, f.num_experts_per_tok, hub.head_dim) == (128, 4, 128)
    with torch.device("meta"):
        count = sum(p.numel() for p in transformers.LaraMiniForCausalLM(want).parameters())
    assert hub.num_params == count, (hub.num_params, count)
    rope = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_parameters": rope}))
    with pytest.raises(
        ValueError, match=r"partial rotary embedding .* not supported for lara_mini"
    ):
        read_model_config(str(tmp_path))
