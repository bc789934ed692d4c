"""PhiMoE (`PhimoeForCausalLM`: Phi-3.5-MoE) against transformers, token for token and logits
within 1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts chunked
into 16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small enough
to preempt.

- phimoe: LayerNorms with biases, q/k/v/o biases, an LM head bias, sparsemixer's two experts of
  8 (a jitter eps wide enough that the softmax of each pick spans several logits), LongRoPE
  with PhiMoE's `short_mscale` (the prompts within the original context), as Phi-3.5-MoE;
- phimoe-window: no biases, a sliding window on every layer (prompts longer than it), the
  default jitter eps, the plain rotary.

Also: the long table's attention factor (`long_mscale`), the weights estimate against what the
built model holds, and two tensor-parallel ranks (gloo).
"""

from __future__ import annotations

import pytest
import torch
from arch_cases import (
    built_fixture,
    check_chunked_cached_batched,
    check_on_cuda_with_graphs,
    check_preempted,
    check_two_ranks,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 128,
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0, 9.0, 10.0, 12.0, 16.0],
            "short_mscale": 1.2, "long_mscale": 1.4}  # fmt: skip
CASES = {
    "phimoe": dict(num_local_experts=8, intermediate_size=32, head_dim=16, attention_bias=True,
                   lm_head_bias=True, router_jitter_noise=0.3, num_hidden_layers=3,
                   rope_parameters=LONGROPE),
    "phimoe-window": dict(num_local_experts=6, intermediate_size=24, sliding_window=11),
}  # fmt: skip


def write_case(name: str, path):
    return make_tiny_model(path, "Phimoe", **CASES[name])


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_config_and_the_long_tables_attention_factor(built):
    """The family fields; the long table (sequences past the original context) rotates with
    the long factors as transformers' longrope computes them, times `long_mscale`."""
    from pagoda.runtime.model.ops import build_cos_sin_cache
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path, model, _, _ = built("phimoe")
    c = read_model_config(str(path))
    f = c.family
    assert c.architecture == "phimoe" and f.layer_norm_bias and c.attention_bias
    assert (f.routing.topk_method, f.routing.jitter_eps, f.num_experts_per_tok) == (
        "sparsemixer", 0.3, 2)  # fmt: skip
    table = build_cos_sin_cache(c.head_dim, c.rope_theta, c.rope_scaling, 300)
    inv, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, "cpu", seq_len=200)
    freqs = torch.outer(torch.arange(300, dtype=torch.float32), inv)
    want = torch.cat([freqs.cos() * 1.4, freqs.sin() * 1.4], dim=-1)
    assert torch.allclose(table[300:], want, atol=1e-6)


def test_the_released_config_format_reads_as_transformers(tmp_path):
    """Phi-3.5-MoE-instruct's config.json (shrunk): `PhiMoEForCausalLM`, a top-level
    rope_theta, `rope_scaling` of type longrope with its mscales, a window as long as the
    context, both biases: read as transformers 5 reads it."""
    import json

    cfg = dict(architectures=["PhiMoEForCausalLM"], model_type="phimoe", hidden_size=64,
               intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
               max_position_embeddings=131072, original_max_position_embeddings=4096,
               rope_theta=10000.0, sliding_window=131072, attention_bias=True,
               lm_head_bias=True, router_jitter_noise=0.01, input_jitter_noise=0.01,
               rms_norm_eps=1e-05, vocab_size=300, rope_scaling={
                   "type": "longrope", "long_mscale": 1.243163121016122,
                   "short_mscale": 1.243163121016122, "original_max_position_embeddings": 4096,
                   "long_factor": [1.0 + i for i in range(8)], "short_factor": [1.0] * 8})  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = read_model_config(str(tmp_path))
    assert ours.architecture == "phimoe" and ours.attention_bias
    assert ours.rope_theta == theirs["rope_theta"] == 10000.0
    scaling = ours.rope_scaling
    assert scaling["type"] == theirs["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 4096
    assert (scaling["short_mscale"], scaling["long_mscale"]) == (
        theirs["short_mscale"], theirs["long_mscale"])  # fmt: skip
    assert ours.family.sliding_window == 131072 and ours.family.routing.jitter_eps == 0.01


def test_the_sparsemixer_picks_as_transformers():
    """Two experts a token, each weighted by a softmax over the logits near it, ties and a
    wide eps included."""
    from pagoda.runtime.model.moe_routing import sparsemixer
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as theirs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 8, generator=g)
    logits[0] = 1.0  # a tie
    for eps in (0.0, 0.01, 0.3, 2.0):
        weights, ids = sparsemixer(logits, eps)
        want_weights, want_ids = theirs(logits, eps, training=False)
        assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the LayerNorms'
    biases, the LM head's bias, the float32 router."""
    from model_bytes import check_estimate

    path, _, _, _ = built("phimoe")
    check_estimate(path, tp)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
def test_the_weights_from_shapes_as_from_its_tensors(built, tp, fp8):
    """`fit`'s count from config.json alone (`from_shapes`) against the headers' on a GPU:
    the q/k/v biases (by the rank's heads), o's and the LM head's (whole) counted; they
    were left out"""
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights

    path, _, _, _ = built("phimoe")
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    place = weights.Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(ckpt, mc, place)
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, fp8, tp), rel=1e-6)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("phimoe")
    check_two_ranks(path, loaded, reference, "phimoe", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    assert runner.model.layers[-1].mlp.fused is not None
