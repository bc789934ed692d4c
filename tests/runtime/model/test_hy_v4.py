"""HY V4 (`HYV4ForCausalLM`, model/hy_v4.py) against transformers, token for token and logits
within 1e-3 (float32), on a tiny random checkpoint transformers writes itself (its own saved
names: `hy_v4_config.rename_weights`): three layers with HYV4Config's default indexer kinds
(full, full, shared) and MLP kinds (dense, then experts), ``index_topk`` 8 so that the indexer's
choice changes the tokens, 3 hyper-connected streams with ``hc_magnitude`` 1.5, a
``swiglu_limit`` low enough to clamp the routed experts, sinks and gates: prompts of 53, 23 and
48 tokens chunked into 16-token steps in one batch (decodes beside prefill chunks), then on a
warm prefix cache (preemption is GLM-5's: the same cache rows, no other state; test_dsa.py).
Two tensor-parallel ranks as transformers; the refusals (FP8, int8 KV cache)
and a config.json with HY V4's published keys read as transformers reads it."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import built_fixture, check_chunked_cached_batched, prompts
from hf_oracle import make_tiny_model

transformers = pytest.importorskip("transformers")
TINY_HY = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, q_lora_rank=24,
               v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=32, index_head_dim=32, index_n_heads=16, index_topk=8,
               num_hidden_layers=3, hc_mult=3, hc_magnitude=1.5, swiglu_limit=0.05)  # fmt: skip


def write_case(name: str, path):
    model = make_tiny_model(path, "HYV4", **TINY_HY)
    g = torch.Generator().manual_seed(2)  # correction biases that change the experts picked
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)


def test_greedy_matches_transformers_chunked_cached_and_batched(built):
    _, model, loaded, reference = built("hy_v4")
    f = loaded.config.family
    assert f.mla.indexer.full_layers == (True, True, False) and f.moe_layers == (False, True, True)
    assert (f.hyper.mult, f.hyper.post_magnitude, f.swiglu_limit) == (3, 1.5, 0.05)
    # the indexer's choice matters here: transformers keeping every key gives other logits
    ids, full = torch.tensor([prompts()[0]]), [x.self_attn.indexer for x in model.model.layers[:2]]
    with torch.no_grad():
        sparse = model(ids).logits[0, -1]
        for ix in full:
            ix.index_topk = 10**6
        dense = model(ids).logits[0, -1]
        for ix in full:
            ix.index_topk = TINY_HY["index_topk"]
    assert (sparse - dense).abs().max() > 0.05
    llm = check_chunked_cached_batched(loaded, reference, "hy_v4")
    llm.engine.check_integrity()


def test_what_is_not_supported_is_refused_in_one_line(built):
    """--quantization fp8 (where a GPU would take it) and an int8 KV cache: one ValueError
    each, before anything loads."""
    from pagoda.runtime.config import CacheConfig, EngineConfig
    from pagoda.runtime.engine.start_checks import check_dtype

    mc = built("hy_v4")[2].config
    fp8 = EngineConfig(model="m")
    object.__setattr__(fp8, "quantization", "fp8")  # (a CPU config refuses it before)
    for cfg in (fp8, EngineConfig(model="m", cache=CacheConfig(kv_cache_dtype="int8"))):
        with pytest.raises(ValueError, match="not supported for a hy_v4 model") as e:
            check_dtype(cfg, mc)
        assert "\n" not in str(e.value)


# HYV4Config's defaults as a config.json would spell them (tencent/Hy4-preview's keys; 5 layers)
PUBLISHED = {
    "architectures": ["HYV4ForCausalLM"], "model_type": "hy_v4", "vocab_size": 120832,
    "hidden_size": 2816, "intermediate_size": 6912, "moe_intermediate_size": 768,
    "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 32,
    "head_dim": 64, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "routed_scaling_factor": 2.827, "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
    "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16,
    "hc_mult": 4, "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "bos_token_id": 120000, "eos_token_id": 120025, "pad_token_id": 120002,
    "tie_word_embeddings": False,
}  # fmt: skip


def test_published_config_read_as_transformers_reads_it(tmp_path):
    """The indexer and MLP kinds by default (full at 0, 1; dense at 0), the streams, the cache
    row (512 + 64 + 128) and the parameter count transformers gives on the meta device."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    f = ours.family
    assert f.mla.indexer.full_layers == tuple(t == "full" for t in theirs.indexer_types)
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert f.mla.indexer.rope_last and f.mla.indexer.key_norm_eps == 1e-5
    assert (f.hyper.mult, f.hyper.sinkhorn_iters, f.swiglu_limit) == (4, 0, 10.0)
    assert (ours.num_kv_heads, ours.head_dim) == (1, 512 + 64 + 128)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(theirs)
    assert ours.num_params == sum(p.numel() for p in model.parameters())


def test_the_weights_estimate_is_what_the_model_holds(built):
    """`server/weights.py` reads the stored names through the same renames (the head's fold
    outside the layers) and counts what the bf16 model holds, within 2%."""
    from model_bytes import check_estimate

    check_estimate(built("hy_v4")[0], 1)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_from_shapes_as_from_its_tensors(built, tp):
    """`fit`'s count from config.json alone (`from_shapes`, 16 bits, one rank's share) against
    the headers' (as CUDA holds them): the gates, the float32 hyper-connections and sinks."""
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path = built("hy_v4")[0]
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=1e-6)


def test_a_ranks_stacked_experts_are_read_as_its_rows_alone(built, monkeypatch):
    """Rank 1 of two reads its rows of gate and up of an expert layer's stacked gate_up_proj,
    and those columns of down_proj, as slices of the safetensors file (never the whole stack
    on the host), holding them alone: equal to the whole tensors' slices."""
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.device_weights import DeviceWeights
    from pagoda.runtime.model.moe import _ExpertTensors
    from pagoda.runtime.model.safetensors_weights import SafetensorsWeights

    stored = built("hy_v4")[2].weights
    p, width = "model.layers.1.mlp.experts.", TINY_HY["moe_intermediate_size"]
    gate_up, down = stored[p + "gate_up_proj.weight"], stored[p + "down_proj.weight"]
    read_whole, get = [], SafetensorsWeights.__getitem__
    monkeypatch.setattr(SafetensorsWeights, "__getitem__",
                        lambda self, n: read_whole.append(n) or get(self, n))  # fmt: skip
    w = DeviceWeights(stored, torch.device("cpu"), gate_up.dtype, {})
    experts = _ExpertTensors(w, p, ("gate_up_proj", "down_proj"), TINY_HY["n_routed_experts"])
    experts.rows = a, b = TPLayout(1, 2).even(width)
    for e in range(TINY_HY["n_routed_experts"]):
        g, u, d = experts.weights(e)
        assert torch.equal(g, gate_up[e, a:b]) and torch.equal(u, gate_up[e, width + a : width + b])
        assert torch.equal(d, down[e, :, a:b])
    assert read_whole == [] and (a, b) == (16, 32)
    held = [t.untyped_storage().nbytes() for t in experts._stack]
    assert held == [gate_up.nbytes // 2, down.nbytes // 2]


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Two ranks: the latent attention's heads with their gates and sinks, the indexer whole on
    each, the stacked experts and the shared expert by width, the hyper-connections
    replicated; transformers' tokens and logits chunked, preempted and on a warm cache, rank
    0's weights as the estimate counts them."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("hy_v4")
    check_two_ranks(path, loaded, reference, "hy_v4")
    check_estimate(path, 2, rel=0)
