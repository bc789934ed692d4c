"""DeepSeek-V4 in the engine (model/dsv4_engine.py): `LLM` over a tiny checkpoint transformers'
``DeepseekV4ForCausalLM.save_pretrained`` writes (sliding, CSA with its indexer's top-2, HCA
16:1 layers; hash and sqrtsoftplus MoE; mHC) gives transformers' plain greedy tokens and logits:
the three prompts of unequal length batched in 16-token steps (chunked prefill), again in
reverse order on the warm prefix cache (CSA's window slots restored from the cached blocks'
Ca tails; with the restores dropped the warm run leaves transformers'), in a KV pool so
small that requests are preempted (recomputed), and all in one step (a prompt hitting the
blocks another fills in that step); the same on two tensor-parallel ranks (`dsv4_shard`), a
rank's weights against the estimates'; plus the one-line refusals (block size, a missing
tensor, output groups that do not split, FP8) and the memory the runner allocates against the
estimates'."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from arch_cases import (
    NEW,
    SMALL_POOL,
    check,
    check_chunked_cached_batched,
    check_preempted,
    generate,
    prompts,
)
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


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(case):
    """Tensor parallelism over gloo, two ranks (`dsv4_shard`): each rank two of the four query
    heads and their sinks, one of the two output groups, half the experts' width and of the
    vocabulary; the token rows, entries, Ca tails and window slots whole on both. The small
    pool (16-token chunks, preempted, then warm: CSA's slots restored from the tails, the
    step's slots sent to rank 1 with its inputs) gives transformers' tokens and logits."""
    path, _, loaded, reference = case
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        runner, c = core.runner, loaded.config.family.dsv4
        assert runner.model.core.layers[0][2].heads == 2  # rank 0's query heads
        # a rank's cache is the whole cache (MQA: one row a token, its entries, tails, slots)
        assert runner.bytes_per_block == dsv4_engine.bytes_per_token(c, torch.float32, 16) * 16
        assert runner.seq_state.nbytes == dsv4_engine.slots_bytes(c, torch.float32, 3)
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i % 3], f"deepseek_v4: prompt {i}, two ranks")


def test_a_ranks_weights_are_what_the_estimates_count(case, monkeypatch):
    """Rank 0 of two (`dsv4_shard`: half the heads' q_b_proj and sinks, one output group,
    half the experts' width and the vocabulary; the rest whole) holds what the start-up
    estimate (`server/weights.py`) and `fit`'s (`from_shapes`) count, float32 (unpacked)."""
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model import linear
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.weights_from_shapes import from_shapes

    monkeypatch.setattr(linear, "_can_pack", lambda dtype: False)  # (oneDNN pads tiny packs)
    path, mc = case[0], case[2].config
    held = {}
    for tp in (1, 2):
        group = None if tp == 1 else TPGroup(TPLayout(0, tp), torch.device("cpu"), None, None)
        held[tp] = held_bytes(build(path, torch.float32, tp=group))
        cfg = EngineConfig.create(str(path), device="cpu", dtype="float32",
                                  tensor_parallel_size=tp)  # fmt: skip
        assert weights.estimate(mc, cfg, path).bytes == held[tp]
        assert from_shapes(mc, torch.float32, False, tp) == held[tp]
    assert 0.5 * held[1] < held[2] < 0.75 * held[1]


def test_refusals(case):
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.engine.start_checks import check_block_size, check_dtype
    from pagoda.runtime.model.checkpoint_check import check_checkpoint

    loaded = case[2]
    mc = loaded.config
    blocks = SimpleNamespace(cache=SimpleNamespace(block_size=8))
    with pytest.raises(ValueError, match=re.escape("--block-size 8 is not a multiple of "
                                                   "DeepSeek-V4's compress rate 16")):  # fmt: skip
        check_block_size(blocks, mc)
    tp_check(mc, 2)  # 4 heads, 2 output groups, experts 24 wide
    with pytest.raises(ValueError, match=re.escape("--tensor-parallel-size 4 does not divide "
                                                   "DeepSeek-V4's output projection groups "
                                                   "(o_groups 2)")):  # fmt: skip
        tp_check(mc, 4)
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

    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.engine.start_checks import check_block_size
    from pagoda.runtime.model import dsv4_config
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server.weights_from_shapes import from_shapes

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
    # eight ranks (its 8 output groups: no more): each holds an eighth of the query and output
    # projections, of the experts and of the vocabulary, the rest whole (2.4% more in all)
    whole, eighth = (from_shapes(mc, torch.bfloat16, False, n) for n in (1, 8))
    assert whole / 8 < eighth < 1.03 * whole / 8
    tp_check(mc, 8)
    with pytest.raises(ValueError, match=r"does not divide DeepSeek-V4's output projection "
                                         r"groups \(o_groups 8\)"):  # fmt: skip
        tp_check(mc, 16)


# DeepSeek-V4's released format (model/dsv4_quant.py), written here from its definition: FP8
# E4M3 codes with a power-of-two (UE8M0) scale per 128x128 tile; the routed experts MXFP4: E2M1
# codes two a byte (the low nibble first) with a power-of-two scale per 32 values of a row
_FP8_MATRICES = re.compile(r"\.(wq_a|wq_b|wkv|wo_a|wo_b|compressor\.wkv|compressor\.wgate|"
                           r"shared_experts\.w[123])\.weight$")  # fmt: skip
_EXPERTS = re.compile(r"\.experts\.\d+\.w[123]\.weight$")
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_at_least(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(x.clamp_min(2.0**-126))))


def _quantize_fp8(w: torch.Tensor, block: int = 128):
    n, k = w.shape
    tiles = (-(-n // block), -(-k // block))
    padded = torch.nn.functional.pad(w.float(), (0, tiles[1] * block - k, 0, tiles[0] * block - n))
    amax = padded.view(tiles[0], block, tiles[1], block).abs().amax(dim=(1, 3))
    scale = _pow2_at_least(amax / 448.0)  # codes within E4M3's 448
    full = scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    codes = (w.float() / full).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes, scale.to(torch.float8_e8m0fnu), codes.float() * full


def _quantize_fp4(w: torch.Tensor):
    n, k = w.shape
    groups = -(-k // 32)
    padded = torch.nn.functional.pad(w.float(), (0, groups * 32 - k)).view(n, groups, 32)
    scale = _pow2_at_least(padded.abs().amax(dim=-1) / 6.0)  # codes within E2M1's 6
    x = (padded / scale[..., None]).flatten(1)[:, :k]
    mag = (x.abs()[..., None] - _E2M1).abs().argmin(dim=-1)  # the nearest E2M1 magnitude
    code = (mag + 8 * (x < 0)).to(torch.uint8)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).view(torch.int8)
    values = _E2M1[mag] * torch.where(x < 0, -1.0, 1.0)
    return packed, scale.to(torch.float8_e8m0fnu), values * scale.repeat_interleave(32, 1)[:, :k]


def _released(src, quantized, dequantized):
    """`src`'s checkpoint written in the released format to `quantized` (with an MTP layer, in
    FP8 too, as the released files hold one), and in float32 as it dequantizes to
    `dequantized` (transformers' oracle)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    packed, plain = {}, {}
    for name, w in tensors.items():
        fp4, fp8 = _EXPERTS.search(name), _FP8_MATRICES.search(name)
        if fp4 or fp8:
            codes, scale, w = (_quantize_fp4 if fp4 else _quantize_fp8)(w)
            if fp4 and ".experts.0." in name:  # the same bytes as torch's FP4 dtype (F4)
                codes = codes.view(torch.float4_e2m1fn_x2)
            packed[name], packed[name.removesuffix("weight") + "scale"] = codes, scale
        else:
            packed[name] = w
        plain[name] = w.float().contiguous()
    mtp = _quantize_fp8(torch.randn(32, 64))
    packed |= {"mtp.0.e_proj.weight": mtp[0], "mtp.0.e_proj.scale": mtp[1],
               "mtp.0.enorm.weight": torch.ones(32)}  # fmt: skip
    cfg = json.loads((src / "config.json").read_text())
    for out, tensors in ((quantized, packed), (dequantized, plain)):
        shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors*"))
        save_file(tensors, out / "model.safetensors")
    cfg |= {"num_nextn_predict_layers": 1, "expert_dtype": "fp4",
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]}}  # fmt: skip
    (quantized / "config.json").write_text(json.dumps(cfg))


def _held(model) -> list[torch.Tensor]:
    """Every weight a `Dsv4EngineModel` holds, in a fixed order (its CPU Linears unpacked)."""
    experts = [x.weight for moe in model._moes for pair in moe.experts for x in pair]
    shared = [layer[5].s13 for layer in model.core.layers]
    return [*model.core.w.values(), *experts, *shared, model.lm_head.inner.weight]


def test_released_fp8_fp4_checkpoint_matches_transformers_on_its_dequantized_weights(
    case, tmp_path, monkeypatch
):
    """The released format read dequantized to the dtype: transformers running the same
    dequantized weights gives the same greedy tokens (batched); its MTP layer is skipped; the
    start-up estimate counts what the engine holds (the 16/32-bit checkpoint's bytes); a
    missing or misshapen scale is refused in one line. Each of two tensor-parallel ranks
    dequantizes, then takes its share: the same tensors as its share of the dequantized
    checkpoint (what the two-rank test runs)."""
    from model_bytes import build
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model import linear
    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.server import weights as weights_of

    path = case[0]
    _released(path, tmp_path / "q", tmp_path / "dq")
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(tmp_path / "dq").float().eval()
    model.config._attn_implementation = "eager"
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    assert reference[0][0] != case[3][0][0] or reference[1][0] != case[3][1][0]  # (quantized)
    loaded = load_model(str(tmp_path / "q"))
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=64, max_num_seqs=3)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference, strict=True)):
        check(got, want, f"released format: prompt {i}")
    monkeypatch.setattr(linear, "_can_pack", lambda dtype: False)  # (weights readable)
    for rank in (0, 1):
        group = TPGroup(TPLayout(rank, 2), torch.device("cpu"), None, None)
        got, want = (
            _held(build(p, torch.float32, tp=group)) for p in (tmp_path / "q", tmp_path / "dq")
        )
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert got[-1].shape == (V // 2, 32)  # (its half of the vocabulary)
    mc = loaded.config
    held = {}
    for p in (path, tmp_path / "q"):
        cfg = EngineConfig.create(str(p), device="cpu", dtype="float32")
        held[p] = weights_of.estimate(mc, cfg, p).bytes
    assert held[path] == held[tmp_path / "q"]
    headers = {k: loaded.weights.dtype_and_shape(k) for k in loaded.weights}
    scale = "model.layers.1.mlp.experts.2.down_proj.scale"
    assert headers[scale] == ("F8_E8M0", [32, 1])
    assert headers["model.layers.1.mlp.experts.0.down_proj.weight"] == ("F4", [32, 24])
    bad = dict(headers) | {scale: ("F8_E8M0", [32, 2])}
    with pytest.raises(ValueError, match=r"^checkpoint tensor .*experts\.2\.(w2|down_proj)\."
                                         r"scale is F8_E8M0 \[32, 2\]; the I8 matrix \[32, 12\] "
                                         r"needs \[32, 1\]"):  # fmt: skip
        check_checkpoint(mc, bad)
    del headers["model.layers.0.self_attn.q_a_proj.scale"]
    with pytest.raises(ValueError, match=r"^checkpoint tensor .*q_a_proj\.weight is F8_E4M3 "
                                         r"without its scales"):  # fmt: skip
        check_checkpoint(mc, headers)
