"""The weights' in-memory bytes from checkpoint metadata (`server/weights.py`) against the bytes a
model built by the loader really holds: the embedded GGUF (dequantized to bf16, or its blocks
kept by `qgemm` in float32), tiny transformers checkpoints at another dtype (tied and untied,
Gemma 3 with a capped head, Qwen3-MoE, Mixtral), one tensor-parallel rank's share, FP8; Granite's
dense head, Qwen2-MoE's shared expert and GraniteMoe's stacked experts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hf_oracle import make_tiny_model
from model_bytes import build, held_bytes
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.model.loader import builtin_model_path, read_model_config
from pagoda.runtime.server import rank_share, weights
from pagoda.runtime.server.placement import Placement, packed_shape
from pagoda.runtime.server.stored import Checkpoint, Stored

SMOL = "smollm2-135m"


def estimate(path, dtype: str, **kwargs) -> weights.Weights:
    cfg = EngineConfig.create(str(path), device="cpu", dtype=dtype, **kwargs)
    return weights.estimate(read_model_config(str(path)), cfg, path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_embedded_gguf_as_loaded(dtype):
    """94 MB of Q4_1/Q8_0: bf16 holds every weight at 2 bytes plus the tied LM head's packed
    copy (~310 MiB); float32 here keeps the blocks (`qgemm`, where it loads) and shares them."""
    path = builtin_model_path(SMOL)
    got = estimate(path, dtype)
    held = held_bytes(build(path, getattr(torch, dtype)))
    assert got.bytes == pytest.approx(held, rel=0.02), got
    assert "93.8 MiB Q4_1/Q8_0 GGUF" in got.how
    if dtype == "bfloat16":
        assert got.bytes > 3 * path.stat().st_size and "dequantized" in got.how


MLA = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
           n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           first_k_dense_replace=1)  # fmt: skip
# V2-Lite's shape (q_proj fused with kv_a_proj_with_mqa, two shared experts); V3's (q_a_proj
# fused with it, a float32 router with its correction bias)
DEEPSEEK = {"DeepseekV2": dict(MLA, q_lora_rank=None, n_shared_experts=2),
            "DeepseekV3": dict(MLA, q_lora_rank=24, n_group=2, topk_group=1),
            "DeepseekV32": dict(MLA, q_lora_rank=24, n_group=2, topk_group=1, index_n_heads=4,
                                index_head_dim=32, index_topk=8),
            # A.X-K2: q_b_proj with the output gate, the norms' gate matrices
            "AXK2": dict(MLA, q_lora_rank=24, index_n_heads=4, index_head_dim=32, index_topk=8,
                         gated_norm_rank=8)}  # fmt: skip


def _resave(model, src, dst, dtype):
    model.to(dtype).save_pretrained(dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("Llama", {}),
        ("Llama", {"tie_word_embeddings": True, "attention_bias": True}),
        ("Gemma3Text", {"head_dim": 32, "final_logit_softcapping": 6.0}),
        ("Qwen3Moe", {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
                      "moe_intermediate_size": 32, "mlp_only_layers": [1]}),
        ("Mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
        ("Gemma2", {"head_dim": 32, "final_logit_softcapping": 6.0}),
        ("Phi3", {}),
        ("DeepseekV2", DEEPSEEK["DeepseekV2"]),
        ("DeepseekV3", DEEPSEEK["DeepseekV3"]),
        ("DeepseekV32", DEEPSEEK["DeepseekV32"]),  # its indexers (float32 weights_proj)
    ],
    ids=["llama", "llama-tied-bias", "gemma3-capped", "qwen3moe", "mixtral", "gemma2-capped",
         "phi3-fused", "deepseek-v2-lite", "deepseek-v3", "deepseek-v3.2"],
)  # fmt: skip
def test_transformers_checkpoints_at_another_dtype(tmp_path, arch, overrides):
    """float32 files served as bf16 (half), bf16 files as float32 (read in place where `qgemm`
    loads: still 2 bytes) and as bf16: the estimate is what the built model holds."""
    f32 = tmp_path / "f32"
    model = make_tiny_model(f32, arch, **overrides)
    bf16 = tmp_path / "bf16"
    _resave(model, f32, bf16, torch.bfloat16)
    for path, dtype in ((f32, "bfloat16"), (bf16, "float32"), (bf16, "bfloat16")):
        got = estimate(path, dtype)
        held = held_bytes(build(path, getattr(torch, dtype)))
        assert got.bytes == pytest.approx(held, rel=0.02), (path.name, dtype, got)
    files = sum(f.stat().st_size for f in f32.glob("*.safetensors"))
    assert estimate(f32, "bfloat16").bytes < 0.75 * files  # not the file's size


@pytest.mark.parametrize(("arch", "tp", "kv_heads"), [("Llama", 2, 2), ("Llama", 4, 2),
                                                     ("Phi3", 4, 2)])  # fmt: skip
def test_one_tensor_parallel_ranks_share(tmp_path, arch, tp, kv_heads):
    """Rank 0 of a group built without communication (the layers read only the layout): q, the
    MLP and the vocabulary split, k and v replicated past the KV heads, norms whole (Phi-3:
    its fused q/k/v and gate/up matrices cut the same way)."""
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout

    bias = {"attention_bias": True} if arch == "Llama" else {}
    make_tiny_model(tmp_path, arch, num_key_value_heads=kv_heads, vocab_size=301,
                    tie_word_embeddings=True, **bias)  # fmt: skip
    group = TPGroup(TPLayout(0, tp), torch.device("cpu"), None, None)
    held = held_bytes(build(tmp_path, torch.bfloat16, tp=group))
    got = estimate(tmp_path, "bfloat16", tensor_parallel_size=tp)
    assert got.bytes == pytest.approx(held, rel=0.02), got
    assert f"one rank's share of {tp}" in got.how
    assert got.bytes < estimate(tmp_path, "bfloat16").bytes


def test_granite_scaled_logits_come_from_a_dense_head(tmp_path):
    """Granite's logits_scaling keeps the LM head dense (`granite.head_blocks`): a tied bf16
    head served in float32 holds a float32 copy, not the blocks (counted at 0.41 of it)."""
    test_transformers_checkpoints_at_another_dtype(
        tmp_path, "Granite", {"tie_word_embeddings": True, "logits_scaling": 4.0}
    )


SHARED_AND_STACKED = {
    "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=48, mlp_only_layers=[1]),
    "GraniteMoe": dict(num_local_experts=4),
    **DEEPSEEK,  # latent attention split by heads, the bottleneck and latent whole
}  # fmt: skip


@pytest.mark.parametrize("arch", list(SHARED_AND_STACKED))
def test_shared_and_stacked_experts_split_over_two_ranks(tmp_path, arch):
    """Qwen2-MoE's shared expert and GraniteMoe's stacked gate/up (`input_linear`) and down
    (`output_linear`) split by width like the other experts (GraniteMoe's counted whole on
    each rank: 1.7 times what rank 0 holds)."""
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout

    make_tiny_model(tmp_path, arch, **SHARED_AND_STACKED[arch])
    group = TPGroup(TPLayout(0, 2), torch.device("cpu"), None, None)
    held = held_bytes(build(tmp_path, torch.bfloat16, tp=group))
    got = estimate(tmp_path, "bfloat16", tensor_parallel_size=2)
    assert got.bytes == pytest.approx(held, rel=0.02), got


def test_a_rank_keeps_only_its_rows_of_a_float32_embedding(tmp_path):
    """Served in the checkpoint's own float32 on a CPU, rank 0 of 2 holds its half of the
    embedding table (a copy), not a view that keeps the whole loaded table alive: DeepSeek-V3's
    float32 table is 3.7 GB, 1.8 GB of it another rank's."""
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout

    make_tiny_model(tmp_path, "DeepseekV3", **DEEPSEEK["DeepseekV3"])
    group = TPGroup(TPLayout(0, 2), torch.device("cpu"), None, None)
    held = held_bytes(build(tmp_path, torch.float32, tp=group))
    got = estimate(tmp_path, "float32", tensor_parallel_size=2)
    assert got.bytes == pytest.approx(held, rel=0.01), got


def test_fp8_projections_at_one_byte_and_a_scale_per_row(tmp_path, monkeypatch):
    """--quantization fp8 where the FP8 kernels run (here: Triton's interpreter on the CPU): the
    decoder's projections at one byte a weight plus a float32 scale per output row."""
    from pagoda.kernels._common import interpreter_enabled
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME

    if not interpreter_enabled():
        pytest.skip("FP8 kernels run on the CPU under TRITON_INTERPRET=1 only")
    make_tiny_model(tmp_path, "Llama")
    held = held_bytes(build(tmp_path, torch.bfloat16, fp8=ONLINE_SCHEME))
    got = estimate(tmp_path, "bfloat16", quantization="fp8")
    assert got.bytes == pytest.approx(held, rel=0.02), got
    # Qwen2-MoE's shared expert runs in FP8 too (it was counted at 2 bytes: 5% over here)
    make_tiny_model(tmp_path / "moe", "Qwen2Moe", **SHARED_AND_STACKED["Qwen2Moe"])
    held = held_bytes(build(tmp_path / "moe", torch.bfloat16, fp8=ONLINE_SCHEME))
    got = estimate(tmp_path / "moe", "bfloat16", quantization="fp8")
    assert got.bytes == pytest.approx(held, rel=0.02), got
    assert got.how.startswith("as FP8 projections + bfloat16")


def test_without_weight_files_the_shapes_count_and_pickles_their_tensors(tmp_path):
    """A config.json alone counts from its shapes; transformers' pytorch_model.bin from its
    tensors' dtypes and shapes (memory-mapped, as exact as safetensors' headers), no longer
    from its file size."""
    hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf))
    mc = read_model_config(str(tmp_path))
    got = estimate(tmp_path, "bfloat16")
    assert got.bytes == pytest.approx(2 * mc.num_params, rel=0.01)
    assert "from the config's shapes" in got.how
    f32, bf16, pickled = tmp_path / "f32", tmp_path / "bf16", tmp_path / "bin"
    model = make_tiny_model(f32, "Llama")
    _resave(model, f32, bf16, torch.bfloat16)  # the safetensors twin
    shutil.copytree(bf16, pickled, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    got = estimate(pickled, "float32")  # bf16 matrices read in place where `qgemm` loads
    assert "BF16 .bin" in got.how, got
    assert got.bytes == estimate(bf16, "float32").bytes  # (checked against `build` above)


def _llama_checkpoint(mc, kind: str = "BF16") -> Checkpoint:
    """The tensor table of a Llama-shaped safetensors checkpoint (no files: metadata only)."""
    h, d, i = mc.hidden_size, mc.head_dim, mc.intermediate_size
    shapes = {
        rank_share.EMBED: (mc.vocab_size, h),
        rank_share.NORM: (h,),
        rank_share.HEAD: (mc.vocab_size, h),
    }
    for n in range(mc.num_layers):
        p = f"model.layers.{n}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (mc.num_heads * d, h),
                   p + "self_attn.k_proj.weight": (mc.num_kv_heads * d, h),
                   p + "self_attn.v_proj.weight": (mc.num_kv_heads * d, h),
                   p + "self_attn.o_proj.weight": (h, mc.num_heads * d),
                   p + "self_attn.rotary_emb.inv_freq": (d // 2,),  # not read
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}  # fmt: skip
    tensors = {k: Stored(k, kind, s, 2 * torch.Size(s).numel()) for k, s in shapes.items()}
    return Checkpoint("safetensors", tensors, sum(t.nbytes for t in tensors.values()))


@pytest.mark.parametrize("tp", [1, 2, 16])
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_ranks_agree_with_the_layout_arithmetic(tp, fp8):
    """On CUDA (no packing; the layers read their tensors as they are): a Llama-3-8B-shaped
    table per rank, 16-bit or FP8 projections, equals the shape arithmetic of the layout's rules
    (`from_shapes`: q/o/MLP/vocabulary split, 8 KV heads replicated over 16 ranks)."""
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME

    mc = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128)  # fmt: skip
    place = Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(_llama_checkpoint(mc), mc, place)
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, fp8, tp), rel=1e-6)


def test_a_gguf_on_a_gpu_is_dequantized_once():
    """The embedded Q4_1 GGUF on CUDA: every weight at 2 bytes, the tied head reading the table
    (no packed copy): ~2.9x the file (3.5x for an all-Q4 file)."""
    from pagoda.runtime.model.loader import builtin_model_path, read_model_config

    path, mc = builtin_model_path(SMOL), read_model_config(SMOL)
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda"))
    assert got == 2 * sum(t.numel for t in ckpt.tensors.values()) == 2 * mc.num_params
    assert got > 2.5 * path.stat().st_size


def _write_gguf(path, experts: int = 0) -> None:
    """A 2-layer Llama (Mixtral with `experts`) GGUF of random blocks in mixed kinds: K-quants,
    IQ4_XS, Q8_0, and a Q2_K up projection that `qgemm` does not read (its gate/up layer then
    stays float32); an untied Q6_K head."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q

    h, ffn, vocab = 256, 512, 512
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, 2), (w.add_context_length, 128),
                       (w.add_embedding_length, h), (w.add_feed_forward_length, ffn),
                       (w.add_head_count, 4), (w.add_head_count_kv, 2),
                       (w.add_layer_norm_rms_eps, 1e-5)):  # fmt: skip
        add(value)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    rng = np.random.default_rng(0)

    def put(name: str, shape: tuple[int, ...], kind) -> None:
        if kind == Q.F32:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.1)
            return
        per, nbytes = gguf.GGML_QUANT_SIZES[kind]
        raw = rng.integers(0, 64, (*shape[:-1], shape[-1] // per * nbytes), dtype=np.uint8)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)

    put("token_embd.weight", (vocab, h), Q.Q8_0)
    put("output.weight", (vocab, h), Q.Q6_K)
    put("output_norm.weight", (h,), Q.F32)
    for n in range(2):
        b = f"blk.{n}."
        put(b + "attn_norm.weight", (h,), Q.F32)
        put(b + "ffn_norm.weight", (h,), Q.F32)
        put(b + "attn_q.weight", (h, h), Q.Q4_K)
        put(b + "attn_k.weight", (128, h), Q.Q6_K)
        put(b + "attn_v.weight", (128, h), Q.Q5_K)
        put(b + "attn_output.weight", (h, h), Q.Q8_0)
        if experts:
            put(b + "ffn_gate_inp.weight", (experts, h), Q.F32)
            put(b + "ffn_gate_exps.weight", (experts, ffn, h), Q.Q4_K)
            put(b + "ffn_up_exps.weight", (experts, ffn, h), Q.Q4_K)
            put(b + "ffn_down_exps.weight", (experts, h, ffn), Q.Q6_K)
        else:
            put(b + "ffn_gate.weight", (ffn, h), Q.Q4_K)
            put(b + "ffn_up.weight", (ffn, h), Q.Q2_K)
            put(b + "ffn_down.weight", (h, ffn), Q.IQ4_XS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("experts", [0, 4], ids=["dense", "stacked-experts"])
def test_a_gguf_of_mixed_kinds(tmp_path, experts):
    """K-quants and IQ4_XS packed by `qgemm` in float32 (a layer with a Q2_K part stays float32),
    stacked experts sliced per expert; everything dequantized in bf16."""
    from pagoda.runtime.attention import get_attention_backend
    from pagoda.runtime.model import gguf_loader
    from pagoda.runtime.model.ops import select_ops
    from pagoda.runtime.model.registry import build_model

    path = tmp_path / "mixed.gguf"
    _write_gguf(path, experts)
    reader = gguf_loader._reader(path)
    mc = gguf_loader.read_config(reader)  # the tokenizer is not needed to build the model
    loaded = gguf_loader.GGUFWeights(reader, mc)
    cpu = torch.device("cpu")
    backend = get_attention_backend("torch", cpu, mc.num_heads, mc.num_kv_heads, mc.head_dim, 1.0)
    for dtype in ("float32", "bfloat16"):
        model = build_model(mc, loaded, quantized=loaded.blocks(), dtype=getattr(torch, dtype),
                            device=cpu, backend=backend, ops=select_ops(cpu, backend.name),
                            max_positions=64)  # fmt: skip
        cfg = EngineConfig.create(str(path), device="cpu", dtype=dtype)
        got = weights.estimate(mc, cfg, path)
        assert got.bytes == pytest.approx(held_bytes(model), rel=0.02), (dtype, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_packed_shape_is_onednns_for_one_row_too(dtype):
    """A CPU `Linear`'s packed copy, counted by shape: one row (Qwen2-MoE's shared_expert_gate,
    [1, hidden]) stays one row in float32 where 2 rows pad to 64 (it was counted as 64: a
    tiny float32 Qwen2-MoE 4% over)."""
    from pagoda.runtime.model import linear

    if not linear._can_pack(dtype):
        pytest.skip(f"no oneDNN packing of {dtype} here")
    for rows, cols in ((1, 64), (2, 64), (6, 64), (65, 64), (1, 100)):
        packed = linear._pack(torch.zeros(rows, cols, dtype=dtype))
        n, k = packed_shape(rows, cols, dtype)
        assert n * k * dtype.itemsize == torch.ops.mkldnn._nbytes(packed), (rows, cols)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
def test_a_shared_expert_from_shapes_as_from_its_tensors(tp, fp8):
    """Qwen/Qwen1.5-MoE-A2.7B's shapes (two of its 24 layers) on CUDA: the shared expert runs in
    FP8 with the projections (`_runs_in_fp8`), so `from_shapes` counts it at one byte a weight
    too (it was counted in the dtype: Qwen2-57B-A14B's 6.2e9 shared weights, 6 GB over)."""
    from pagoda.runtime.config import FamilyConfig, ModelConfig
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME

    family = FamilyConfig(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                          norm_topk_prob=False, shared_expert_intermediate_size=5632)  # fmt: skip
    mc = ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_layers=2,
                     num_heads=16, num_kv_heads=16, head_dim=128, family=family)  # fmt: skip
    h, e, s = 2048, 1408, 5632
    table = _llama_checkpoint(mc).tensors
    for n in range(mc.num_layers):
        p = f"model.layers.{n}.mlp."
        for name in ("gate_proj", "up_proj", "down_proj"):
            del table[f"model.layers.{n}.mlp.{name}.weight"]
        shapes = {p + "gate.weight": (60, h), p + "shared_expert_gate.weight": (1, h),
                  p + "shared_expert.gate_proj.weight": (s, h),
                  p + "shared_expert.up_proj.weight": (s, h),
                  p + "shared_expert.down_proj.weight": (h, s)}  # fmt: skip
        for x in range(60):
            shapes |= {p + f"experts.{x}.gate_proj.weight": (e, h),
                       p + f"experts.{x}.up_proj.weight": (e, h),
                       p + f"experts.{x}.down_proj.weight": (h, e)}  # fmt: skip
        table |= {k: Stored(k, "BF16", v, 2 * torch.Size(v).numel()) for k, v in shapes.items()}
    ckpt = Checkpoint("safetensors", table, 0)
    place = Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(ckpt, mc, place)
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, fp8, tp), rel=1e-4)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("arch", list(DEEPSEEK))
def test_latent_attention_from_shapes_as_from_its_tensors(tmp_path, arch, fp8, tp):
    """DeepSeek's latent attention projections, shared experts and float32 router counted from
    the config's shapes as from the checkpoint's tensors (on CUDA: no packing), FP8 and one of
    two ranks too."""
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME

    make_tiny_model(tmp_path, arch, **DEEPSEEK[arch])
    mc = read_model_config(str(tmp_path))
    ckpt = weights.read_checkpoint(tmp_path, mc.architecture)
    place = Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(ckpt, mc, place)
    assert got == weights.from_shapes(mc, torch.bfloat16, fp8, tp)
