"""gpt-oss (`GptOssForCausalLM`) against transformers, token for token, on a tiny random
checkpoint transformers writes itself (tests/runtime/hf_oracle.py): attention sinks (scaled up
so that they matter), window layers alternating with full ones, q/k/v/o biases, a head_dim
that is not hidden / heads, YaRN, the biased router and experts with the clamped SwiGLU (a limit
the activations reach); chunked into 16-token steps, several prompts sharing steps, a warm
prefix cache, a pool small enough to preempt, two tensor-parallel ranks, the Triton attention
kernels and the fused-MoE kernel (under TRITON_INTERPRET=1 on a CPU); bf16 rows bit for bit
whatever the batch. The same model with its experts packed into MXFP4 (the published
checkpoints' form) against transformers running the dequantized weights. The config and
checkpoint checks, the weights estimate against a built model, and the published 20b layout
from its metadata.
"""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from arch_cases import FULL, SLIDING, check, generate, prompts, tokens_without_host_syncs
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model import mxfp4
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
NEW = 6
YARN = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 64, "rope_theta": 150000.0}  # fmt: skip
CONFIG = dict(head_dim=32, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
              sliding_window=9, num_hidden_layers=3, layer_types=[SLIDING, FULL, SLIDING],
              rope_parameters=YARN, swiglu_limit=1.5)  # fmt: skip


def _tiny(path):
    """The checkpoint, with sinks of a few units (transformers draws them near 0) and a swiglu
    limit the scaled-up activations reach; returns the transformers model."""
    model = make_tiny_model(path, "GptOss", **CONFIG)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(
                3 * torch.randn(model.config.num_attention_heads, generator=g)
            )
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt-oss")
    model = _tiny(path)
    return path, model, [hf_greedy_plain(model, p, NEW) for p in prompts()]


def _engine(path, **kw) -> LLM:
    args = dict(dtype="float32", kv_cache_memory=16 << 20, max_num_batched_tokens=16,
                max_num_seqs=4, block_size=16)  # fmt: skip
    return LLM(str(path), loaded=load_model(str(path)), **{**args, **kw})


def test_gpt_oss_matches_transformers_chunked_cached_and_batched(tiny):
    path, _, reference = tiny
    llm = _engine(path)
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"prompt {i}, cold")
        check(warm[i], want, f"prompt {i}, warm")
    assert llm.engine.kv.prefix_hits > 0
    llm.engine.check_integrity()


def test_gpt_oss_matches_transformers_under_preemption(tiny):
    path, _, reference = tiny
    llm = _engine(path, kv_cache_memory=None, num_blocks_override=7, max_model_len=96,
                  max_num_seqs=3)  # fmt: skip
    got = generate(llm, prompts())
    assert llm.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"prompt {i}, preempted")


def test_gpt_oss_bf16_greedy_does_not_depend_on_cache_chunks_or_batch(tiny):
    """In bfloat16 the sinks' softmax and the biased experts keep a row's bits: a prompt alone
    on a plain engine and among others, chunked, on a warm cache give the same tokens and
    logits."""
    from pagoda.runtime.model.linear import bf16_rows_invariant

    if not bf16_rows_invariant():
        pytest.skip("bf16 GEMMs on AMX round a row by the row count (docs/runtime.md)")
    path = tiny[0]
    plain = _engine(path, dtype="bfloat16", enable_prefix_caching=False,
                    enable_chunked_prefill=False, max_num_batched_tokens=None)  # fmt: skip
    alone = [generate(plain, [p])[0] for p in prompts()]
    busy = _engine(path, dtype="bfloat16")
    for run in ("cold", "warm"):
        for i, (tokens, logits) in enumerate(generate(busy, prompts())):
            assert tokens == alone[i][0], (run, i)
            assert all(map(torch.equal, logits, alone[i][1])), (run, i)  # bit for bit


@pytest.mark.slow
@pytest.mark.skipif(os.environ["TRITON_INTERPRET"] != "1", reason="needs TRITON_INTERPRET=1")
def test_gpt_oss_on_the_triton_backend_matches_transformers(tiny):
    """The sinks through the Triton kernels in the engine (decode kernel beside prefill
    chunks; every path of the kernels: tests/kernels/test_kernel_attention.py)."""
    pytest.importorskip("triton")
    path, _, reference = tiny
    llm = _engine(path, attention_backend="triton", batch_invariant=False)
    for i, (got, want) in enumerate(zip(generate(llm, prompts()[:2]), reference[:2])):
        check(got, want, f"prompt {i}")


def test_gpt_oss_over_two_ranks_matches_transformers(tiny):
    """Tensor parallelism (gloo, rank 1 a spawned process): each rank its heads' sinks and
    q/k/v biases, every expert's intermediate columns (gate/up rows, down columns; down's bias
    added by rank 0 alone before the sum); chunked, preempted, then over a warm cache."""
    path, _, reference = tiny
    pool = dict(num_blocks_override=7, max_model_len=96, max_num_seqs=3, kv_cache_memory=None)
    with _engine(path, tensor_parallel_size=2, **pool) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        assert two.engine.scheduler.num_preemptions > 0 and two.engine.kv.prefix_hits > 0
        two.engine.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i % len(reference)], f"two ranks, prompt {i}")


@pytest.mark.slow
@pytest.mark.skipif(os.environ["TRITON_INTERPRET"] != "1", reason="needs TRITON_INTERPRET=1")
def test_gpt_oss_experts_in_the_fused_kernel_match_transformers(tiny, monkeypatch):
    """The CUDA path of the experts (stacked [E, 2I, hidden] gate rows then up rows, biases and
    the clamped SwiGLU in the fused-MoE kernel's epilogues), run here by Triton's interpreter."""
    pytest.importorskip("triton")
    from pagoda.kernels.fused_moe import fused_experts
    from pagoda.runtime.model import gpt_oss

    monkeypatch.setattr(gpt_oss, "fused_kernel", lambda device: fused_experts)
    path, _, reference = tiny
    llm = _engine(path)
    assert llm.engine.runner.model.layers[0].mlp.experts == []  # the fused path, not Linears
    for i, (got, want) in enumerate(zip(generate(llm, prompts()[1:]), reference[1:])):
        check(got, want, f"prompt {i + 1}")


@pytest.mark.gpu
def test_gpt_oss_on_cuda_matches_transformers(tiny):
    """On a GPU (benchmarks/gpu_check.sh's `families` step): the sinks in the compiled Triton
    kernels, the experts in the fused-MoE kernel (biases, clamped SwiGLU), decodes in CUDA
    graphs, float32: transformers' tokens and logits, chunked, batched, on a warm cache; eager
    decodes give the graphs' tokens, and no step's launch syncs with the host."""
    if not torch.cuda.is_available() or os.environ["TRITON_INTERPRET"] == "1":
        pytest.skip("needs a CUDA device with compiled Triton kernels")
    path, _, reference = tiny
    llm = _engine(path, device="cuda")
    assert llm.engine.runner.model.layers[0].mlp.fused is not None
    assert llm.engine.runner.cuda_graphs is not None
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"prompt {i}, cold")
        check(warm[i], want, f"prompt {i}, warm")
    eager = generate(_engine(path, device="cuda", enable_cuda_graphs=False), prompts())
    assert [t for t, _ in eager] == [t for t, _ in cold]
    synced = tokens_without_host_syncs(_engine(path, device="cuda", async_scheduling=False),
                                       prompts())  # fmt: skip
    assert synced == [t for t, _ in cold]


def test_gpt_oss_config_reads_sinks_windows_experts_and_yarn(tiny):
    path, model, _ = tiny
    c = read_model_config(str(path))
    f = c.family
    assert c.architecture == "gpt_oss" and c.attention_bias and c.head_dim == 32
    assert f.attention_sinks and f.window_layers == (True, False, True) and f.sliding_window == 9
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (4, 2, 64)
    assert (f.swiglu_alpha, f.swiglu_limit) == (model.config.swiglu_alpha, 1.5)
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["truncate"] is False


def _mxfp4_copy(src, dst, model):
    """`src`'s checkpoint with its experts packed into MXFP4 (blocks, scales) under `dst`, and
    `model` given the dequantized experts (what transformers runs for an MXFP4 checkpoint on a
    machine without its kernels: `convert_moe_packed_tensors`)."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        blocks, scales = mxfp4.quantize(tensors.pop(name).transpose(1, 2))  # [E, rows, cols]
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        module, attr = name.rsplit(".", 1)
        deq = mxfp4.dequantize(blocks, scales, torch.float32).transpose(1, 2)
        with torch.no_grad():
            getattr(model.get_submodule(module), attr).copy_(deq)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (dst / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def packed(tiny, tmp_path_factory):
    """(the MXFP4 checkpoint, transformers' model with its dequantized experts)."""
    src, _, _ = tiny
    tmp = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    model = _tiny(tmp / "model")  # a copy transformers runs with the dequantized experts
    _mxfp4_copy(src, tmp / "mxfp4", model)
    return tmp / "mxfp4", model


def test_gpt_oss_mxfp4_experts_match_transformers_dequantized(packed):
    path, model = packed
    prompt = prompts()[0]
    want = hf_greedy_plain(model, prompt, NEW)
    got = generate(_engine(path), [prompt])[0]
    check(got, want, "mxfp4")


@pytest.mark.parametrize(("which", "dtype", "tp", "fp8"), [("tiny", "bfloat16", 1, False),
                         ("tiny", "float32", 1, False), ("packed", "bfloat16", 1, False),
                         ("packed", "bfloat16", 2, False), ("packed", "bfloat16", 1, True)])  # fmt: skip
def test_gpt_oss_weight_estimate_is_what_the_engine_holds(request, which, dtype, tp, fp8):
    """`server/weights.py` from the headers alone against the bytes a built model holds: the
    float32 files as bf16 and float32, the MXFP4 experts dequantized, one rank of two, and
    with --quantization fp8 (attention's projections in FP8; router and experts 16-bit)."""
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights

    if fp8 and os.environ["TRITON_INTERPRET"] != "1":
        pytest.skip("FP8 kernels run on the CPU under TRITON_INTERPRET=1 only")
    path = request.getfixturevalue(which)[0]
    group = None if tp == 1 else TPGroup(TPLayout(0, tp), torch.device("cpu"), None, None)
    scheme = ONLINE_SCHEME if fp8 else None
    held = held_bytes(build(path, getattr(torch, dtype), tp=group, fp8=scheme))
    cfg = EngineConfig.create(str(path), device="cpu", dtype=dtype, tensor_parallel_size=tp,
                              quantization="fp8" if fp8 else None)  # fmt: skip
    got = weights.estimate(read_model_config(str(path)), cfg, path)
    assert got.bytes == pytest.approx(held, rel=1e-3), got
    if which == "packed":
        assert "dequantized" in got.how


def test_mxfp4_dequantize_is_transformers_convert_moe_packed_tensors():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(110, 140, (3, 5, 4), dtype=torch.uint8, generator=g)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, cols, rows]
    assert torch.equal(mxfp4.dequantize(blocks, scales, torch.float32), want.transpose(1, 2))
    x = mxfp4.dequantize(blocks, scales, torch.float32)
    again = mxfp4.quantize(x)  # values already on the grid come back as they were
    assert torch.equal(mxfp4.dequantize(*again, torch.float32), x)


@pytest.mark.parametrize(
    ("tensor", "shape", "needs"),
    [
        ("model.layers.1.self_attn.sinks", [3], "[4]"),
        ("model.layers.0.mlp.experts.down_proj", [4, 64, 32], "[4, 64, 64]"),
        ("model.layers.2.mlp.router.bias", [5], "[4]"),
    ],
)
def test_gpt_oss_checkpoint_of_other_shapes_is_refused_in_one_line(tiny, tmp_path, tensor,
                                                                   shape, needs):  # fmt: skip
    from safetensors.torch import load_file, save_file

    src, _, _ = tiny
    shutil.copytree(src, tmp_path / "bad")
    tensors = load_file(str(src / "model.safetensors"))
    tensors[tensor] = torch.zeros(shape)
    save_file(tensors, str(tmp_path / "bad" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{tensor} is .*needs .*{needs[1:-1]}") as e:
        load_model(str(tmp_path / "bad"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("tp", [1, 2])
def test_gpt_oss_weights_from_shapes_as_from_its_tensors(packed, tp):
    """`fit`'s count from config.json alone (`from_shapes`) is the headers' count on a GPU
    (no packed copies): the dequantized experts, biases, float32 sinks and norms."""
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path = packed[0]
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp))
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=1e-6)


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_a_ranks_sinks_hold_its_heads_share_alone(stored):
    """Rank 1 of two keeps its heads' sinks in float32, in a storage of its share (a copy,
    not a view of the whole vector: the per-rank weights estimate counts its share)."""
    from types import SimpleNamespace

    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.gpt_oss import read_sinks

    model = SimpleNamespace(config=SimpleNamespace(num_heads=8))
    ctx = SimpleNamespace(tp=SimpleNamespace(layout=TPLayout(1, 2)))
    whole = torch.arange(8, dtype=stored) / 2
    sinks = read_sinks(model, {"x.self_attn.sinks": whole}, "x.", ctx)
    assert sinks.dtype == torch.float32 and sinks.tolist() == [2.0, 2.5, 3.0, 3.5]
    assert sinks.untyped_storage().nbytes() == 4 * 4


def test_gpt_oss_mxfp4_checkpoint_checks_and_fingerprint(packed, tmp_path):
    """MXFP4 blocks of another shape are refused in one line; mxfp4 on another architecture
    too; the fingerprint of the MXFP4 checkpoint is the bf16 one's (its experts run
    dequantized: quantization "none")."""
    from pagoda.runtime.model.shape_fingerprint import model_fingerprint
    from safetensors.torch import load_file, save_file

    path, _ = packed
    assert model_fingerprint(str(path), None)["quantization"] == "none"
    shutil.copytree(path, tmp_path / "bad")
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.mlp.experts.down_proj_blocks"
    tensors[name] = tensors[name][:, :, :1].contiguous()  # one block of 32 per row, not two
    save_file(tensors, str(tmp_path / "bad" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=rf"{name} is U8 \[4, 64, 1, 16\].*needs U8 \[4, 64, 2, 16\]"
    ):
        load_model(str(tmp_path / "bad"))
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "bad" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantization 'mxfp4' is not supported"):
        read_model_config(str(tmp_path / "bad"))


# (layers, experts, file bytes, bytes held on one GPU in bf16) of openai/gpt-oss-20b and -120b
PUBLISHED = {"20b": (24, 32, 13.76e9, 41.83e9), "120b": (36, 128, 65.25e9, 233.66e9)}


@pytest.mark.parametrize("size", list(PUBLISHED))
def test_the_published_gpt_oss_layouts_are_checked_and_counted(tmp_path, size):
    """openai/gpt-oss-20b and -120b as published (their config.json's fields, their tensors'
    names, dtypes and shapes: MXFP4 experts and bf16 rest), from metadata alone: the checks
    pass, and one GPU holds 41.8 GB (20b) or 233.7 GB (120b) once the experts are dequantized
    to bf16 (what `from_shapes` counts too), a quarter of it on each of four ranks; the shape
    fingerprint tells the two apart (a profile tuned for one is not taken for the other)."""
    import math

    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from pagoda.runtime.model.shape_fingerprint import shape_fingerprint
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement
    from pagoda.runtime.server.stored import Checkpoint, Stored

    layers, e, file_bytes, held_bytes = PUBLISHED[size]
    h, v = 2880, 201088
    cfg = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "eos_token_id": 200002,
           "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": h,
           "initial_context_length": 4096, "intermediate_size": 2880, "layer_types": [
               SLIDING if i % 2 == 0 else FULL for i in range(layers)],
           "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
           "num_experts_per_tok": 4, "num_hidden_layers": layers, "num_key_value_heads": 8,
           "num_local_experts": e, "pad_token_id": 199999, "quantization_config": {
               "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                          "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
           "rms_norm_eps": 1e-05, "rope_scaling": {
               "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "rope_type": "yarn",
               "original_max_position_embeddings": 4096, "truncate": False},
           "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
           "tie_word_embeddings": False, "vocab_size": v}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    assert mc.context_length == 131072 and mc.family.window(0) == 128 and not mc.family.window(1)
    headers = {"model.embed_tokens.weight": ("BF16", [v, h]), "lm_head.weight": ("BF16", [v, h]),
               "model.norm.weight": ("BF16", [h])}  # fmt: skip
    for i in range(layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for proj, rows in (("q", 4096), ("k", 512), ("v", 512)):
            headers[f"{a}{proj}_proj.weight"] = ("BF16", [rows, h])
            headers[f"{a}{proj}_proj.bias"] = ("BF16", [rows])
        headers.update({
            a + "o_proj.weight": ("BF16", [h, 4096]), a + "o_proj.bias": ("BF16", [h]),
            a + "sinks": ("BF16", [64]), f"model.layers.{i}.input_layernorm.weight": ("BF16", [h]),
            f"model.layers.{i}.post_attention_layernorm.weight": ("BF16", [h]),
            m + "router.weight": ("BF16", [e, h]), m + "router.bias": ("BF16", [e]),
            m + "experts.gate_up_proj_blocks": ("U8", [e, 5760, 90, 16]),
            m + "experts.gate_up_proj_scales": ("U8", [e, 5760, 90]),
            m + "experts.gate_up_proj_bias": ("BF16", [e, 5760]),
            m + "experts.down_proj_blocks": ("U8", [e, h, 90, 16]),
            m + "experts.down_proj_scales": ("U8", [e, h, 90]),
            m + "experts.down_proj_bias": ("BF16", [e, h])})  # fmt: skip
    check_checkpoint(mc, headers)
    size = {"BF16": 2, "U8": 1}
    stored = {n: Stored(n, k, tuple(s), math.prod(s) * size[k])
              for n, (k, s) in headers.items()}  # fmt: skip
    ckpt = Checkpoint("safetensors", stored, sum(t.nbytes for t in stored.values()))
    assert ckpt.file_bytes == pytest.approx(file_bytes, rel=1e-3)
    for tp in (1, 4):
        held, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp))
        assert held == pytest.approx(held_bytes / tp, rel=2e-3)
        assert held == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=1e-6)
    fingerprint = shape_fingerprint(mc, "none")
    assert (fingerprint["num_layers"], fingerprint["num_experts"]) == (layers, e)


def test_gpt_oss_int8_kv_cache_keeps_transformers_tokens(tiny):
    """An int8 KV cache (the torch attention backend's, a float32 scale per row) with the sinks
    in its softmax: transformers' tokens, logits within the cache's rounding, over a warm
    prefix cache too."""
    path, _, reference = tiny
    llm = _engine(path, kv_cache_dtype="int8")
    got = generate(llm, prompts()) + generate(llm, prompts()[::-1])[::-1]
    assert llm.engine.kv.prefix_hits > 0
    for i, (tokens, logits) in enumerate(got):
        want_tokens, want_logits = reference[i % len(reference)]
        assert tokens == want_tokens, i
        worst = max(float((a - b).abs().max()) for a, b in zip(logits, want_logits))
        assert worst < 0.05, (i, worst)
