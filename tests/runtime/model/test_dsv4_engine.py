"""DeepSeek-V4 in the engine (model/dsv4_engine.py): `LLM` over a tiny checkpoint transformers'
``DeepseekV4ForCausalLM.save_pretrained`` writes (sliding, CSA with its indexer's top-2, HCA
16:1 layers; hash and sqrtsoftplus MoE; mHC) gives transformers' plain greedy tokens and logits:
the three prompts of unequal length batched in 16-token steps (chunked prefill), again in
reverse order on the warm prefix cache (CSA's window slots restored from the cached blocks'
Ca tails; with the restores dropped the warm run leaves transformers'), in a KV pool so
small that requests are preempted (recomputed), and all in one step (a prompt hitting the
blocks another fills in that step); plus the
one-line refusals (block size, a missing tensor, tensor parallelism, FP8) and the memory the
runner allocates against the estimates'."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from arch_cases import NEW, check, check_chunked_cached_batched, check_preempted, generate, prompts
from hf_oracle import hf_greedy_plain, save_tiny
from pagoda.runtime import LLM
from pagoda.runtime.model import dsv4_engine

transformers = pytest.importorskip("transformers")
V = 300


def _write(path):
    """The tiny checkpoint; the transformers model (float32, eval). Matrices get noise of std
    0.5 so greedy picks are well separated; 16 indexer heads, so that no query's indexer
    scores tie at zero (ReLU: with few heads transformers' top-k would break ties by length);
    3 Sinkhorn iterations (20 by default) keep transformers' forward cheap."""
    cfg = transformers.DeepseekV4Config(
        hidden_size=32, head_dim=16, partial_rotary_factor=0.5, num_hidden_layers=3,
        num_attention_heads=4, q_lora_rank=16, index_n_heads=16, index_head_dim=8, index_topk=2,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"], sliding_window=8, o_groups=2, o_lora_rank=8,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        vocab_size=V, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        hc_mult=3, hc_sinkhorn_iters=3, swiglu_limit=0.5, max_position_embeddings=512, eos_token_id=2, bos_token_id=1,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 1 else 0.2))
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):
                gate.tid2eid.copy_(torch.randint(0, 4, gate.tid2eid.shape, generator=g))
            else:
                gate.e_score_correction_bias.copy_(torch.randn(4, generator=g))
    return save_tiny(model, path, V)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    from pagoda.runtime.model.loader import load_model

    path = tmp_path_factory.mktemp("dsv4")
    model = _write(path)
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    return path, model, load_model(str(path)), reference


def test_engine_matches_transformers_chunked_batched_warm_preempted(case, monkeypatch):
    _, _, loaded, reference = case
    restored = []
    prepare = dsv4_engine.Dsv4Slots.prepare

    def counted(self, reqs, starts, qlens):
        host = prepare(self, reqs, starts, qlens)
        restored.extend([] if host.restored is None else starts[host.restored].tolist())
        return host

    monkeypatch.setattr(dsv4_engine.Dsv4Slots, "prepare", counted)
    llm = check_chunked_cached_batched(loaded, reference, "deepseek_v4")
    assert restored and all(s % 16 == 0 for s in restored)  # prefix hits: slots from the tails
    runner = llm.engine.runner
    caches = runner.kv_caches  # the pool's bytes: what a block is counted as, each layer
    held = sum(t.numel() * t.element_size() for c in caches
               for t in (c.rows, *c.entries.values(), *c.tails.values()))  # fmt: skip
    assert held == runner.num_blocks * runner.bytes_per_block
    c, dtype = loaded.config.family.dsv4, torch.float32
    assert dsv4_engine.bytes_per_token(c, dtype, 16) * 16 == runner.bytes_per_block
    assert runner.seq_state.nbytes == dsv4_engine.slots_bytes(c, dtype, 4)
    check_preempted(loaded, reference, "deepseek_v4")
    # the three prompts in one step: prompt 2 hits the two blocks prompt 0 fills in that same
    # step, its slots restored from the tails written earlier in each layer
    one = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=256, max_num_seqs=3)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(one, prompts()), reference, strict=True)):
        check(got, want, f"one step: prompt {i}")
    assert one.engine.kv.prefix_hits == 32
    # the same warm run with the restores dropped (each hit's slot read as it was left by
    # another request) leaves transformers' logits
    monkeypatch.setattr(
        dsv4_engine.Dsv4Slots, "prepare", lambda *a: replace(prepare(*a), restored=None)
    )
    with pytest.raises(AssertionError):
        warm = generate(llm, prompts()[::-1])[::-1]
        for i, want in enumerate(reference):
            check(warm[i], want, f"prompt {i}, warm, no restore")


def test_refusals(case):
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.engine.core import check_block_size, check_dtype
    from pagoda.runtime.model.checkpoint_check import check_checkpoint

    loaded = case[2]
    mc = loaded.config
    blocks = SimpleNamespace(cache=SimpleNamespace(block_size=8))
    with pytest.raises(ValueError, match=re.escape("--block-size 8 is not a multiple of "
                                                   "DeepSeek-V4's compress rate 16")):  # fmt: skip
        check_block_size(blocks, mc)
    with pytest.raises(ValueError, match="--tensor-parallel-size 2 is not supported for a "
                                         "deepseek_v4 model"):  # fmt: skip
        tp_check(mc, 2)
    fp8 = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16)
    with pytest.raises(ValueError, match="fp8 is not supported for a deepseek_v4 model"):
        check_dtype(fp8, mc)
    headers = {k: ("F32", list(loaded.weights.dtype_and_shape(k)[1])) for k in loaded.weights}
    check_checkpoint(mc, headers)
    del headers["model.layers.1.self_attn.compressor.indexer.kv_proj.weight"]
    with pytest.raises(ValueError, match=r"^checkpoint is missing tensor 'model\.layers\.1\.self"
                                         r"_attn\.compressor\.indexer\.kv_proj\.weight'"):  # fmt: skip
        check_checkpoint(mc, headers)


def test_published_style_config_reads_as_the_engines(tmp_path):
    """A sparse config.json (transformers' defaults: DeepSeek-V4-Flash-Base's widths, 43
    layers) read by the loader: one KV head of 512 (the token row), 1M positions, every tensor
    counted (`dsv4_config.num_params`, transformers' meta-device count in test_dsv4_config.py),
    blocks of 128 tokens (the HCA rate) asked for."""
    import json

    from pagoda.runtime.engine.core import check_block_size
    from pagoda.runtime.model import dsv4_config
    from pagoda.runtime.model.loader import read_model_config

    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    assert (mc.architecture, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.head_dim) == (
        "deepseek_v4", 43, 64, 1, 512)  # fmt: skip
    assert mc.context_length == 1 << 20
    assert mc.num_params == dsv4_config.num_params(mc.family.dsv4) == 284_328_206_295
    check_block_size(SimpleNamespace(cache=SimpleNamespace(block_size=128)), mc)
    with pytest.raises(ValueError, match="use --block-size 128"):
        check_block_size(SimpleNamespace(cache=SimpleNamespace(block_size=64)), mc)
    # bf16: 512-wide rows in 43 layers, plus the blocks' entries and CSA's tails
    assert dsv4_engine.bytes_per_token(mc.family.dsv4, torch.bfloat16, 128) == 53_816
