"""Does the model fit? (`server/fit.py`): weights + one full-length sequence against one rank's
memory, the one-line ModelDoesNotFit with what would fit, and `pagoda serve` exiting 2 with it in
the termination message before anything loads."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pagoda.runtime import config
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.model_configs import MlaConfig
from pagoda.runtime.server import fit, memory
from pagoda.runtime.termination import ReasonedError

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=131072)  # fmt: skip
LLAMA_70B = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                 num_heads=64, num_kv_heads=8, head_dim=128, max_position_embeddings=131072)  # fmt: skip
HF_NAMES = dict(num_layers="num_hidden_layers", num_heads="num_attention_heads",
                num_kv_heads="num_key_value_heads")  # fmt: skip


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA device of `total` bytes with `free` of them free, FP8 or not (no GPU needed)."""

    def set_gpu(total: int, free: int | None = None, fp8: bool = True) -> None:
        monkeypatch.setattr(memory, "device_available", lambda d: (free or total, total))
        monkeypatch.setattr(fit, "fp8_runs_on", lambda d: fp8 and d.type == "cuda")
        monkeypatch.setattr(config, "fp8_runs_on", lambda d: fp8 and d.type == "cuda")

    return set_gpu


def test_weights_and_kv_per_rank():
    mc = ModelConfig(**LLAMA_8B)
    bf16 = fit.Plan(torch.bfloat16, False, False, 1, 8192)
    assert bf16.weight_bytes(mc) == pytest.approx(mc.num_params * 2, rel=1e-3)
    fp8 = fit.Plan(torch.bfloat16, True, False, 1, 8192)
    embed = 2 * 128256 * 4096 * 2  # untied embedding and LM head stay 16-bit
    projections = mc.num_params - 2 * 128256 * 4096
    assert fp8.weight_bytes(mc) == pytest.approx(embed + projections, rel=1e-3)
    assert bf16.kv_bytes_per_token(mc) == 32 * 2 * 8 * 128 * 2  # 128 KiB a token
    assert fit.Plan(torch.bfloat16, False, True).kv_bytes_per_token(mc) == 64 << 10
    tp2 = fit.Plan(torch.bfloat16, False, False, 2, 8192)
    assert tp2.weight_bytes(mc) == pytest.approx(bf16.weight_bytes(mc) / 2, rel=1e-3)
    assert tp2.kv_heads(mc) == 4 and fit.Plan(torch.bfloat16, False, False, 16).kv_heads(mc) == 1
    assert bf16.kv_bytes(mc, 17) == 32 * bf16.kv_bytes_per_token(mc)  # whole blocks of 16


def test_fp8_bytes_per_rank_count_each_ranks_part_and_its_scales():
    """FP8 with tensor parallelism (`model.parallel_linear`): q/k/v and gate/up split by rows
    with their scales, o and down by input columns with every row's scale on each rank."""
    mc = ModelConfig(**LLAMA_8B)
    h = 4096
    qkv_rows, o_cols, gate_up_rows, down_cols = (16 + 2 * 4) * 128, 2048, 14336, 7168
    elements = h * (qkv_rows + o_cols + gate_up_rows + down_cols)
    scales = 4 * (qkv_rows + h + gate_up_rows + h)
    embed = 2 * 128256 * h * 2 // 2  # 16-bit, split by vocabulary
    norms = (2 * 32 + 1) * h * 2
    tp2 = fit.Plan(torch.bfloat16, True, False, 2, 8192)
    assert tp2.weight_bytes(mc) == 32 * (elements + scales) + embed + norms
    # 16 ranks over 8 KV heads: k and v replicated, one head each
    tp16 = fit.Plan(torch.bfloat16, False, False, 16)
    layer = h * 128 * (2 * 2 + 2 * 1) + 3 * h * 14336 // 16  # q, o: 2 heads; k, v: 1; MLP
    assert tp16.weight_bytes(mc) == 32 * layer * 2 + 2 * 128256 * h * 2 // 16 + norms


def test_a_model_too_big_for_fp8_alone_is_offered_fp8_on_fewer_gpus(tmp_path, gpu):
    gpu(80 * GIB)
    mc = ModelConfig(**{**LLAMA_70B, "num_layers": 400})  # ~350B parameters
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, EngineConfig.create("m", device="cuda", max_model_len=8192), tmp_path)
    fixes = str(err.value).split("; would fit: ")[1]
    assert "--tensor-parallel-size 16 (" in fixes and not fixes.startswith("--quantization")
    assert "--quantization fp8 --tensor-parallel-size 8 (" in fixes
    fit.check(mc, EngineConfig.create("m", device="cuda", max_model_len=8192, quantization="fp8",
                                      tensor_parallel_size=8), tmp_path, 8)  # fmt: skip


def test_70b_on_one_80gib_gpu_names_fp8_and_two_gpus(tmp_path, gpu):
    gpu(80 * GIB)
    mc = ModelConfig(**LLAMA_70B)
    cfg = EngineConfig.create("m", device="cuda", max_model_len=8192)
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, cfg, tmp_path)
    e = err.value
    assert e.reason == "ModelDoesNotFit"
    msg = str(e)
    assert msg.startswith(
        "the model (70.6B parameters) needs 133.9 GiB: weights 131.4 GiB as bfloat16 (from the "
        "config's shapes: no weight files)"
    )
    assert "+ KV cache 2.5 GiB for one 8192-token sequence" in msg
    assert "is usable on cuda (80.0 GiB in all × gpu-memory-utilization 0.9" in msg
    fixes = msg.split("; would fit: ")[1]
    assert fixes.startswith("--quantization fp8 (") and "--tensor-parallel-size 2 (" in fixes
    assert "--max-model-len" not in fixes  # the weights alone are too large
    assert "\n" not in msg and len(msg) < 600
    # FP8 as suggested fits
    assert fit.check(mc, EngineConfig.create("m", device="cuda", max_model_len=8192,
                                             quantization="fp8"), tmp_path).fp8_weights  # fmt: skip


def test_a_gpu_without_fp8_is_offered_more_gpus_or_a_shorter_context(tmp_path, gpu):
    gpu(24 * GIB, fp8=False)
    mc = ModelConfig(**LLAMA_8B)
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, EngineConfig.create("m", device="cuda", max_model_len=131072), tmp_path)
    msg = str(err.value)
    assert "KV cache 16.0 GiB for one 131072-token sequence" in msg and "fp8" not in msg
    fixes = msg.split("; would fit: ")[1]
    assert fixes.startswith("--tensor-parallel-size 2 (")
    tokens = int(fixes.split("--max-model-len ")[1].split()[0])
    plan = fit.Plan(torch.bfloat16, False, False, 1, tokens)
    usable = int(24 * GIB * 0.9) - memory.GPU_HEADROOM
    assert plan.need(mc) <= usable < plan.need(mc) + 16 * plan.kv_bytes_per_token(mc)
    # and so it does
    fit.check(mc, EngineConfig.create("m", device="cuda", max_model_len=tokens), tmp_path)


def test_cpu_counts_host_memory_and_suggests_a_smaller_cache(tmp_path, monkeypatch):
    """On a CPU the KV cache has a size (2 GiB by default, or --kv-cache-memory); one smaller than
    a full sequence shortens the context, so that size is what must fit, and what to lower."""
    monkeypatch.setattr(memory, "host_available", lambda: (16 * GIB, "MemAvailable"))
    mc = ModelConfig(**LLAMA_8B)
    cfg = EngineConfig.create("m", device="cpu", dtype="bfloat16", max_model_len=131072)
    with pytest.raises(ReasonedError, match=r"KV cache 2\.0 GiB for --kv-cache-memory \(bfloat16 "
                                            r"KV\), but 16\.0 GiB is on this machine \(MemAvailable"
                                            r"\); would fit: --kv-cache-memory \d+MiB \(") as err:  # fmt: skip
        fit.check(mc, cfg, tmp_path)
    assert "tensor-parallel" not in str(err.value) and "fp8" not in str(err.value)
    fit.check(mc, EngineConfig.create("m", device="cpu", dtype="bfloat16", max_model_len=4096,
                                      kv_cache_memory=512 << 20), tmp_path)  # fmt: skip


def test_the_cpus_int8_kv_cache_counts_its_bytes_and_scales(tmp_path, monkeypatch):
    """``--kv-cache-dtype int8`` (the CPU's): a row is its head_dim bytes and a float32 scale,
    as the engine allocates it (`memory.kv_bytes_per_token`), not the model dtype's; the
    message names int8 KV. DeepSeek-V3's latent row: 61 x (576 + 4) bytes a token."""
    monkeypatch.setattr(memory, "host_available", lambda: (8 * GIB, "MemAvailable"))
    mc = ModelConfig(**LLAMA_8B)
    cfg = EngineConfig.create("m", device="cpu", dtype="bfloat16", max_model_len=4096,
                              kv_cache_dtype="int8")  # fmt: skip
    plan = fit.plan_of(cfg, tmp_path)
    want = memory.kv_bytes_per_token(mc, torch.bfloat16, "int8")
    assert plan.kv_bytes_per_token(mc) == want == 32 * 2 * 8 * (128 + 4)
    with pytest.raises(ReasonedError, match=r"KV cache 264\.0 MiB for one 4096-token sequence "
                                            r"\(int8 KV\)"):  # fmt: skip
        fit.check(mc, cfg, tmp_path)
    v3 = {**LLAMA_8B, "num_layers": 61, "num_kv_heads": 1, "head_dim": 576, "num_heads": 128}
    mla = dataclasses.replace(ModelConfig(**v3), family=config.FamilyConfig(mla=MlaConfig(
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)))  # fmt: skip
    assert plan.kv_bytes_per_token(mla) == 61 * 580


def test_an_fp8_checkpoint_counts_as_fp8_only_where_fp8_runs(tmp_path, gpu):
    hf = {**{HF_NAMES.get(k, k): v for k, v in LLAMA_8B.items()},
          "architectures": ["LlamaForCausalLM"],
          "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf))
    gpu(80 * GIB, fp8=True)
    assert fit.plan_of(EngineConfig.create("m", device="cuda"), tmp_path).fp8_weights
    gpu(80 * GIB, fp8=False)  # dequantized at load: 16-bit weights
    assert not fit.plan_of(EngineConfig.create("m", device="cuda"), tmp_path).fp8_weights


def test_pagoda_serve_exits_2_with_model_does_not_fit_in_the_termination_message(tmp_path):
    """A 70B-shaped config.json (no weights: nothing loads before the check) on this CPU."""
    model = tmp_path / "model"
    model.mkdir()
    hf = {HF_NAMES.get(k, k): v for k, v in LLAMA_70B.items()}
    (model / "config.json").write_text(json.dumps({**hf, "architectures": ["LlamaForCausalLM"]}))
    log = tmp_path / "termination-log"
    env = {**os.environ, "PAGODA_TERMINATION_LOG": str(log)}
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--model", str(model),
           "--device", "cpu", "--dtype", "bfloat16", "--port", "0"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagoda serve: error: the model (70.6B"), lines
    written = log.read_text()
    assert written.startswith("ModelDoesNotFit: the model (70.6B parameters) needs ")
    assert "+ KV cache 2.0 GiB for --kv-cache-memory" in written and written.count("\n") == 1


def test_the_embedded_gguf_counts_as_dequantized_bf16(monkeypatch):
    """Weights as loaded (`weights.py`), not the 94 MB file: 310.6 MiB in bf16 here, the blocks
    (~92 MiB) where float32 on this CPU keeps them for the quantized GEMM."""
    from pagoda.runtime.model.loader import builtin_model_path, read_model_config

    path, mc = builtin_model_path("smollm2-135m"), read_model_config("smollm2-135m")
    monkeypatch.setattr(memory, "host_available", lambda: (200 << 20, "MemAvailable"))
    cfg = EngineConfig.create("m", device="cpu", dtype="bfloat16", max_model_len=2048,
                              kv_cache_memory=16 << 20)  # fmt: skip
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, cfg, path)
    msg = str(err.value)
    assert "weights 310.6 MiB as bfloat16 (93.8 MiB Q4_1/Q8_0 GGUF dequantized" in msg, msg
    from pagoda.runtime.cpu import qgemm

    if qgemm.load() is None:  # no compiler or no AVX2 here: float32 holds 4 bytes a weight
        assert "nothing smaller fits" in msg
        return
    fix = msg.split("; would fit: ")[1]
    assert fix.startswith("--dtype float32 (108.1 MiB: the stored blocks read in place)"), msg
    fit.check(mc, dataclasses.replace(cfg, dtype="float32"), path)  # and so it does


def test_a_gguf_is_offered_the_fp8_kv_cache_not_fp8_weights(gpu):
    """`--quantization fp8` is refused on a GGUF (`quantization.fp8.check_checkpoint_form`), so
    the fixes never name it there; an FP8 KV cache alone still fits."""
    from pagoda.runtime.model.loader import builtin_model_path, read_model_config

    gguf = builtin_model_path("smollm2-135m")
    gpu(1580 << 20)  # ~398 MiB usable: bf16 weights + a bf16 8192-token sequence need 437 MiB
    cfg = EngineConfig.create(str(gguf), device="cuda", max_model_len=8192)
    with pytest.raises(ReasonedError) as err:
        fit.check(read_model_config(str(gguf)), cfg, gguf)
    fixes = str(err.value).split("; would fit: ")[1]
    assert fixes.startswith("--kv-cache-dtype fp8 (") and "--quantization" not in fixes, fixes


def test_only_group_sizes_the_model_splits_into_are_offered():
    """A model of 9 heads (the embedded one's) splits over no power of two: no
    --tensor-parallel-size is offered (each would be refused at start, `layout.check`); with 8
    heads the smallest group that holds it is."""
    nine = ModelConfig(**{**LLAMA_8B, "num_heads": 9, "num_kv_heads": 3, "head_dim": 448})
    plan = fit.Plan(torch.bfloat16, False, False, max_model_len=8192)
    have = plan.need(nine) * 2 // 3  # two ranks would hold it
    offers = fit.would_fit(nine, plan, plan.weight_bytes(nine), have, False, cuda=True)
    assert not any("--tensor-parallel-size" in o for o in offers), offers
    eight = dataclasses.replace(nine, num_heads=8, num_kv_heads=8, head_dim=504)
    offers = fit.would_fit(eight, plan, plan.weight_bytes(eight), have, False, cuda=True)
    assert any(o.startswith("--tensor-parallel-size 2 (") for o in offers), offers


def test_a_draft_model_is_counted_and_one_that_does_not_fit_is_refused(tmp_path, monkeypatch):
    """Speculative decoding's draft model (`spec/draft_model.py`): its weights (read from its
    checkpoint as the target's are) and its KV rows of the sequence count beside the target's;
    where the target alone would fit and both do not, one line names the draft and offers
    neither FP8 weights nor more GPUs (both refused beside speculation)."""
    from hf_oracle import make_tiny_llama
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import weights

    target, draft = tmp_path / "t", tmp_path / "d"
    make_tiny_llama(target)
    make_tiny_llama(draft, num_hidden_layers=1)
    mc, dc = read_model_config(str(target)), read_model_config(str(draft))
    common = dict(device="cpu", dtype="float32", max_model_len=128)
    plain = EngineConfig.create(str(target), **common)
    spec = {"model": str(draft), "num_speculative_tokens": 2}
    drafted = EngineConfig.create(str(target), speculative_config=spec, **common)
    monkeypatch.setattr(memory, "host_available", lambda: (64 * GIB, "MemAvailable"))
    alone, both = fit.check(mc, plain, target), fit.check(mc, drafted, target)
    assert alone.draft is None and both.draft == dc
    assert both.kv_bytes(mc) == alone.kv_bytes(mc) + alone.kv_bytes(dc)  # 2 + 1 layers' rows
    assert both.weight_bytes(mc) == alone.weight_bytes(mc) + alone.weight_bytes(dc)
    need = weights.estimate(mc, plain, target).bytes + alone.kv_bytes(mc)
    monkeypatch.setattr(memory, "host_available", lambda: (need, "MemAvailable"))
    fit.check(mc, plain, target)
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, drafted, target)
    text = str(err.value)
    assert "\n" not in text and err.value.reason == fit.REASON
    held = weights.estimate(dc, EngineConfig.create(str(draft), **common), draft)
    assert f", and {held} for the draft model {draft}" in text
    assert "fp8" not in text and "tensor-parallel" not in text
