"""Compile kernels for an H100/H200 (sm_90) on a machine without a GPU; run as a script.

The interpreter (``TRITON_INTERPRET=1``) checks what kernels compute, not that they compile:
it never type-checks a function's returns, and it has no shared-memory limit. This script runs
the real launchers on CPU tensors with Triton's compiler in place of the launch: each kernel
is compiled for sm_90 (frontend, TTGIR, LLVM, PTX, ``ptxas``) and never run. It prints one JSON
line per compiled kernel, ``{"case", "kernel", "shared", "error"}``, then
``{"cases", "shared_limit"}``.

``python sm90_compile.py [--registers] [--fast | --slow | CASE...]`` with the cases of
:data:`CASES` (all when none are named; ``--fast``/``--slow``: those outside or in :data:`SLOW`);
``--registers`` adds each kernel's ``registers`` and ``spilled`` bytes (`registers`), and the
summary names the cases allowed to spill (:data:`KNOWN_SPILLS`).
Needs Triton's NVIDIA backend and its bundled ``ptxas`` (in the Linux wheels), no CUDA driver.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, before Triton decorates the kernels

import torch
import triton.runtime.jit as jit
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

TARGET = GPUTarget("cuda", 90, 32)
DEVICE_NAME = "NVIDIA H200"  # whose packaged configs the launchers look up
SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB)


class _CompileOnlyDriver:
    """What ``JITFunction.run`` asks the active driver, answered for an sm_90 GPU."""

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


def registers(ptx: str, log: str = "") -> dict:
    """Registers per thread and the bytes spilled to local memory (stores and loads) of a
    kernel's PTX for sm_90a: from `log`, the ``ptxas -v`` output of Triton's own compile of it
    (its flags, as on a GPU), or where Triton found the kernel in its cache (no log), from
    ``ptxas -v`` run here with the ``ptxas`` Triton compiles with.

    Kept beside Triton's cache, keyed by the PTX and the ``ptxas`` version: a kernel Triton
    finds in its cache is not assembled again, and its ``ptxas -v`` need not be either (on a
    2-core machine the 45 fast cases' runs took 17 s of the test's 21 s of CPU). With a cold
    cache (CI's) the kernels are assembled once, not twice: 16.5 s less of the fast cases' ~91 s."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas

    tool = get_ptxas(TARGET.arch)
    key = hashlib.sha256(f"{tool.version}\0{' '.join(PTXAS_FLAGS)}\0{ptx}".encode()).hexdigest()
    cached = Path(knobs.cache.dir, "pagoda-ptxas-registers", f"{key}.json")
    if cached.is_file():
        return json.loads(cached.read_text())
    found = _read_ptxas_log(log) if "Used " in log else _ptxas_registers(tool.path, ptx)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(found))
    partial.replace(cached)  # whole or absent, with another run beside this one
    return found


# The flags Triton 3.9 assembles a kernel with (`CUDABackend.make_cubin`; FP fusion on), so that
# a kernel's figures are the same whether Triton's log or this module's run gives them (plain
# `ptxas -v` differed by up to 8 registers and a few hundred spilled bytes in 14 of the fast
# cases' 42 kernels, 2026-12-07; the same cases spill either way)
PTXAS_FLAGS = ("-lineinfo", "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a")


def _ptxas_registers(ptxas: str, ptx: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder, "kernel.ptx")
        src.write_text(ptx)
        log = subprocess.run(
            [str(ptxas), *PTXAS_FLAGS, str(src), "-o", str(Path(folder, "k.cubin"))],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    return _read_ptxas_log(log)


def _read_ptxas_log(log: str) -> dict:
    used = re.search(r"Used (\d+) registers", log)
    spilled = re.findall(r"(\d+) bytes spill (?:stores|loads)", log)
    return {"registers": int(used.group(1)) if used else None,
            "spilled": sum(int(x) for x in spilled)}  # fmt: skip


def install(results: list[dict], case: str, with_registers: bool = False) -> None:
    """Make every launch compile for sm_90 and record (kernel, shared memory, error), with
    ``with_registers`` its registers and spills too (`registers`)."""
    driver.set_active(_CompileOnlyDriver())
    run = jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        log = io.StringIO()  # Triton's `ptxas -v` output where it assembles the kernel
        try:
            with contextlib.redirect_stdout(log):
                kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
            results.append({"case": case[0], "kernel": self._fn_name,
                            "shared": kernel.metadata.shared, "error": None})  # fmt: skip
        except Exception as e:  # the root cause is the report
            while e.__cause__ or e.__context__:
                e = e.__cause__ or e.__context__
            results.append({"case": case[0], "kernel": self._fn_name, "shared": None,
                            "error": " ".join(str(e).split())[:400]})  # fmt: skip
            return
        if with_registers:
            results[-1].update(registers(kernel.asm["ptx"], log.getvalue()))

    jit.JITFunction.run = compile_only
    if with_registers:
        from triton import knobs

        knobs.nvidia.dump_ptxas_log = True  # printed to stdout, which compile_only reads

    from pagoda.kernels import config

    config.device_name = lambda device: DEVICE_NAME
    config.num_sms = lambda device: 132
    import pagoda.kernels.attention as attention

    attention.num_sms = config.num_sms
    from pagoda.kernels import _common

    _common.shared_memory_limit = lambda device: SHARED_LIMIT  # what the H200 would report
    for name in ("attention", "kv_cache", "norm", "rotary", "activation", "matmul", "fused_moe",
                 "fp8_matmul", "fp8_quant"):  # fmt: skip
        module = __import__(f"pagoda.kernels.{name}", fromlist=["check_device"])
        if hasattr(module, "check_device"):  # CPU tensors stand in for CUDA ones
            module.check_device = lambda *tensors: tensors[0].device


def _attention(*, head_dim, heads, kv_heads, dtype, kv_dtype, seqs, tuned=None, sinks=False,
               latent=False, alibi=False, spans=False, **kwargs) -> None:  # fmt: skip
    """One `paged_attention` call; ``tuned``: {kernel: config} saved as the device's tuned file
    (one bucket each, at head size 64), searched first for this call; ``latent``: one tensor
    as both caches (DeepSeek's latent cache, `test_kernel_latent.py`); ``spans``: image
    spans (Gemma 3's images: the prefill kernel's HAS_SPANS variant)."""
    if tuned:
        from pagoda.kernels import config

        with tempfile.TemporaryDirectory() as folder:
            for kernel, cfg in tuned.items():
                shape = {"head_dim": 64, "max_query_len": 1}
                if kernel == "decode_attention":
                    shape = {"head_dim": 64, "num_seqs": 1, "max_seq_len": 512}
                config.save_kernel_config(kernel, shape, cfg, device=DEVICE_NAME, directory=folder)
            previous = config.set_config_dirs([folder])
            try:
                _attention(head_dim=head_dim, heads=heads, kv_heads=kv_heads, dtype=dtype,
                           kv_dtype=kv_dtype, seqs=seqs, sinks=sinks, latent=latent,
                           alibi=alibi, spans=spans, **kwargs)  # fmt: skip
            finally:
                config.set_config_dirs(previous)
        return
    from pagoda.kernels import paged_attention

    tokens = sum(q for q, _ in seqs)
    k_cache = torch.empty((8, 16, kv_heads, head_dim), dtype=kv_dtype)
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor([q for q, _ in seqs]), 0)
    scales = {}
    if kv_dtype == FP8:
        scales = {"k_scale": torch.ones(1), "v_scale": torch.ones(1)}
    if sinks:  # gpt-oss's attention sinks (`attn_common.add_sink`)
        scales["sinks"] = torch.zeros(heads)
    if alibi:  # BLOOM's and MPT's per-head slopes (`attn_common.add_alibi`)
        scales["alibi_slopes"] = torch.full((heads,), 0.5)
    if spans:  # Gemma 3's image spans (`image_spans`): [T, 2] int32
        scales["image_spans"] = torch.zeros((tokens, 2), dtype=torch.int32)
    paged_attention(
        q=torch.empty((tokens, heads, head_dim), dtype=dtype), k_cache=k_cache,
        v_cache=k_cache if latent else torch.empty_like(k_cache), block_tables=torch.zeros((len(seqs), 4), dtype=torch.int32),
        seq_lens=torch.tensor([s for _, s in seqs], dtype=torch.int32), query_start_loc=qsl,
        max_query_len=max(q for q, _ in seqs), scale=0.1, **scales, **kwargs,
    )  # fmt: skip


def _gemm(
    *,
    gemm: str,
    config: dict | None,
    dtype: torch.dtype,
    tokens: int = 64,
    hidden: int = 512,
    inter: int = 512,
    experts: int = 4,
    top_k: int = 2,
    invariant: bool = True,
) -> None:
    """One GEMM launcher with an explicit launch config (as a config file may hold), or with
    ``config=None`` the one it looks up (the packaged files) for the shapes given: ``hidden``
    (K) and ``inter`` (N: the experts' w13 is [E, 2N, K]) of ``experts`` experts, ``top_k``
    picks for each of ``tokens`` tokens (``invariant``: the batch-invariant bucket, else
    the one of ``tokens``)."""
    from pagoda import kernels
    from pagoda.kernels.fp8 import quantize_weight

    x = torch.empty((tokens, hidden), dtype=dtype)
    if gemm == "linear":
        kernels.linear(x=x, weight=torch.empty((512, hidden), dtype=dtype), config=config)
    elif gemm == "fp8_linear":
        w8, scale = quantize_weight(torch.zeros((512, hidden)))
        kernels.fp8_linear(x=x, weight=w8, weight_scale=scale, weight_only=True, config=config)
    else:
        ids = torch.arange(tokens * top_k, dtype=torch.int32).view(tokens, top_k) % experts
        extra = {}
        if gemm == "fused_experts_oai":  # gpt-oss's: biases and the clamped SwiGLU
            extra = dict(activation="swiglu_oai", limit=7.0,
                         w13_bias=torch.zeros((experts, 2 * inter), dtype=dtype),
                         w2_bias=torch.zeros((experts, hidden), dtype=dtype))  # fmt: skip
        kernels.fused_experts(x, torch.empty((experts, 2 * inter, hidden), dtype=dtype),
                              torch.empty((experts, hidden, inter), dtype=dtype),
                              torch.ones((tokens, top_k)), ids, config=config,
                              batch_invariant=invariant, **extra)  # fmt: skip


# The deepest pipeline a config file may hold: 8 stages of 256 x 256 x 256 tiles (2-4 MB).
DEEP = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 256, "GROUP_M": 8, "num_warps": 8,
        "num_stages": 8}  # fmt: skip
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
FP8 = torch.float8_e4m3fn
# name -> a `paged_attention` call (shapes and flags) or a GEMM launcher's (`_gemm`); each
# compiles the kernels it launches.
CASES: dict[str, dict] = {
    # An FP8 KV cache read by the split-KV decode kernel (four segments, then the merge).
    "fp8-decode": dict(head_dim=128, heads=32, kv_heads=8, dtype=BF16, kv_dtype=FP8,
                       seqs=[(1, 5)] * 3, max_seq_len=32768),
    # ... by the unified kernel (flash_prefill=False): decodes and a chunk in one launch.
    "fp8-unified": dict(head_dim=128, heads=32, kv_heads=8, dtype=BF16, kv_dtype=FP8,
                        seqs=[(1, 5), (64, 600)], max_seq_len=600, num_decodes=1,
                        flash_prefill=False, batch_invariant=True),
    # Gemma-wide heads in float32 under the H200's head_dim-64 decode config (128-key tiles).
    "fp32-d256-decode": dict(head_dim=256, heads=8, kv_heads=4, dtype=FP32, kv_dtype=FP32,
                             seqs=[(1, 5)] * 16, max_seq_len=2048),
    # 512-key tiles, valid in a config file (tuned for head size 64), used at head size 128.
    "tile512-d128": dict(head_dim=128, heads=8, kv_heads=2, dtype=BF16, kv_dtype=BF16,
                         seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768, num_decodes=3,
                         tuned={k: {"TILE_SIZE": 512} for k in ("decode_attention",
                                "prefill_attention")}),
    "tile512-d128-unified": dict(head_dim=128, heads=8, kv_heads=2, dtype=BF16, kv_dtype=BF16,
                                 seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                                 flash_prefill=False, batch_invariant=True,
                                 tuned={"paged_attention": {"TILE_SIZE": 512}}),
    # GEMMs: a config's stages beyond the device's shared memory (`_common.fit_stages`).
    "deep-matmul": dict(gemm="linear", config={**DEEP, "BLOCK_K": 64}, dtype=BF16),
    "deep-fp8-w8a16": dict(gemm="fp8_linear", config={**DEEP, "BLOCK_K": 64}, dtype=BF16),
    "deep-moe": dict(gemm="fused_experts", config={**DEEP, "BLOCK_M": 64, "BLOCK_K": 64},
                     dtype=FP32),
    # ALiBi (BLOOM, MPT: multi-head, 128-wide heads) in the split-KV decodes, the
    # batch-invariant launches and the unified kernel
    "alibi-split-decode": dict(head_dim=128, heads=16, kv_heads=16, dtype=BF16, kv_dtype=BF16,
                               seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768,
                               num_decodes=3, num_kv_splits=4, alibi=True),
    "alibi-invariant": dict(head_dim=128, heads=16, kv_heads=16, dtype=BF16, kv_dtype=BF16,
                            seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                            batch_invariant=True, alibi=True),
    "alibi-unified-fp16": dict(head_dim=128, heads=16, kv_heads=16, dtype=FP16, kv_dtype=FP16,
                               seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                               flash_prefill=False, alibi=True),
    # gpt-oss: attention sinks in the split-KV decodes (four segments, the sink in the merge)
    # and the prefill kernel beside them; in every row's prefill kernel (batch-invariant); its
    # experts' biases and clamped SwiGLU in the fused-MoE epilogues.
    "sinks-split-decode": dict(head_dim=64, heads=64, kv_heads=8, dtype=BF16, kv_dtype=BF16,
                               seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768, num_decodes=3,
                               num_kv_splits=4, sliding_window=128, sinks=True),
    "sinks-invariant": dict(head_dim=64, heads=64, kv_heads=8, dtype=BF16, kv_dtype=BF16,
                            seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                            batch_invariant=True, sinks=True),
    # ... in bf16, where every stage stays in shared memory (4 stages: 295 kB before the fix)
    "deep-moe-bf16": dict(gemm="fused_experts", config={**DEEP, "BLOCK_M": 64, "BLOCK_K": 64},
                          dtype=BF16),
    "moe-swiglu-oai": dict(gemm="fused_experts_oai", config={**DEEP, "BLOCK_M": 64,
                           "BLOCK_K": 64}, dtype=BF16),
    # gpt-oss's sinks in the unified kernel (flash_prefill=False), in fp16 and over an FP8 cache
    "sinks-unified": dict(head_dim=64, heads=64, kv_heads=8, dtype=BF16, kv_dtype=BF16,
                          seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                          flash_prefill=False, sliding_window=128, sinks=True),
    "sinks-split-decode-fp16": dict(head_dim=64, heads=64, kv_heads=8, dtype=FP16,
                                    kv_dtype=FP16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                    max_seq_len=32768, num_decodes=3, num_kv_splits=4,
                                    sinks=True),
    "sinks-fp8-split-decode": dict(head_dim=64, heads=64, kv_heads=8, dtype=BF16, kv_dtype=FP8,
                                   seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768,
                                   num_decodes=3, num_kv_splits=4, sinks=True),
    # DeepSeek-V2/V3 and V2-Lite: the latent attention expanded per head at 192 (128 + a 64-wide
    # rotary part; V's 128 zero-padded), 256 wide in the kernels: split-KV decodes and the
    # prefill kernel, the unified kernel, every row's prefill kernel, an FP8 cache; bf16, fp16
    "mla-d192-split-decode": dict(head_dim=192, heads=16, kv_heads=16, dtype=BF16,
                                  kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                  max_seq_len=32768, num_decodes=3, num_kv_splits=4),
    "mla-d192-split-decode-fp16": dict(head_dim=192, heads=16, kv_heads=16, dtype=FP16,
                                       kv_dtype=FP16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                       max_seq_len=32768, num_decodes=3, num_kv_splits=4),
    "mla-d192-unified": dict(head_dim=192, heads=16, kv_heads=16, dtype=BF16, kv_dtype=BF16,
                             seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                             flash_prefill=False),
    "mla-d192-invariant-fp16": dict(head_dim=192, heads=16, kv_heads=16, dtype=FP16,
                                    kv_dtype=FP16, seqs=[(1, 5), (70, 90)], max_seq_len=90,
                                    num_decodes=1, batch_invariant=True),
    "mla-d192-fp8-decode": dict(head_dim=192, heads=16, kv_heads=16, dtype=BF16, kv_dtype=FP8,
                                seqs=[(1, 5)] * 3, max_seq_len=32768),
    # GLM-4-9B: 32 query heads over 2 KV heads (16 per KV head) at 128
    "gqa16-d128": dict(head_dim=128, heads=32, kv_heads=2, dtype=BF16, kv_dtype=BF16,
                       seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768, num_decodes=3),
    "gqa16-d128-unified": dict(head_dim=128, heads=32, kv_heads=2, dtype=FP16, kv_dtype=FP16,
                               seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                               flash_prefill=False),
    # Experts at the new models' shapes under the packaged configs (batch-invariant bucket and
    # a large batch's): gpt-oss's (2880 x 2880, biases, clamped SwiGLU), DeepSeek-V3's
    # (7168 x 2048, top 8) and V2-Lite's (2048 x 1408); the deepest file config in fp16
    "moe-oai-gpt-oss-bf16": dict(gemm="fused_experts_oai", config=None, dtype=BF16,
                                 hidden=2880, inter=2880, experts=8, top_k=4),
    "moe-oai-gpt-oss-fp16": dict(gemm="fused_experts_oai", config=None, dtype=FP16,
                                 hidden=2880, inter=2880, experts=8, top_k=4, tokens=1024,
                                 invariant=False),
    "moe-oai-deep-fp16": dict(gemm="fused_experts_oai", config={**DEEP, "BLOCK_M": 64,
                              "BLOCK_K": 64}, dtype=FP16),
    "moe-deepseek-v3-bf16": dict(gemm="fused_experts", config=None, dtype=BF16, hidden=7168,
                                 inter=2048, experts=8, top_k=8, tokens=1024, invariant=False),
    "moe-v2-lite-fp16": dict(gemm="fused_experts", config=None, dtype=FP16, hidden=2048,
                             inter=1408, experts=8, top_k=6),
    # Llama 4 Scout/Maverick: chunked attention (8192-key chunks) at 40 query heads over 8 KV
    # heads (5 per KV head) at 128: split-KV decodes beside the prefill kernel; every row's
    # prefill kernel (batch-invariant) in fp16; the unified kernel over an FP8 cache
    "chunked-gqa5-split-decode": dict(head_dim=128, heads=40, kv_heads=8, dtype=BF16,
                                      kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                      max_seq_len=32768, num_decodes=3, num_kv_splits=4,
                                      attention_chunk=8192),
    "chunked-gqa5-invariant-fp16": dict(head_dim=128, heads=40, kv_heads=8, dtype=FP16,
                                        kv_dtype=FP16, seqs=[(1, 5), (70, 90)], max_seq_len=90,
                                        num_decodes=1, batch_invariant=True,
                                        attention_chunk=8192),
    "chunked-gqa5-fp8-unified": dict(head_dim=128, heads=40, kv_heads=8, dtype=BF16,
                                     kv_dtype=FP8, seqs=[(1, 5), (70, 90)], max_seq_len=90,
                                     num_decodes=1, flash_prefill=False, attention_chunk=8192),
    # DeepSeek's latent cache: one tensor as both caches, one KV head of 576 (512 + 64 rotary),
    # 1024 lanes in the kernels; 16 query heads (V3's 128 over TP 8): split-KV decodes beside
    # the prefill kernel, every row's prefill kernel, the unified kernel; bf16 and an FP8 cache
    "latent-d576-split-decode": dict(head_dim=576, heads=16, kv_heads=1, dtype=BF16,
                                     kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                     max_seq_len=32768, num_decodes=3, num_kv_splits=4,
                                     latent=True),
    "latent-d576-invariant": dict(head_dim=576, heads=16, kv_heads=1, dtype=BF16,
                                  kv_dtype=BF16, seqs=[(1, 5), (70, 90)], max_seq_len=90,
                                  num_decodes=1, batch_invariant=True, latent=True),
    "latent-d576-unified": dict(head_dim=576, heads=16, kv_heads=1, dtype=BF16, kv_dtype=BF16,
                                seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                                flash_prefill=False, latent=True),
    "latent-d576-fp8-split-decode": dict(head_dim=576, heads=16, kv_heads=1, dtype=BF16,
                                         kv_dtype=FP8, seqs=[(1, 5)] * 3 + [(70, 90)],
                                         max_seq_len=32768, num_decodes=3, num_kv_splits=4,
                                         latent=True),
    "latent-d576-fp8-unified": dict(head_dim=576, heads=16, kv_heads=1, dtype=BF16,
                                    kv_dtype=FP8, seqs=[(1, 5), (70, 90)], max_seq_len=90,
                                    num_decodes=1, flash_prefill=False, latent=True),
    # The new dense families' head sizes (128 lanes for 80, 96, 112): phi-2's 80 (32 heads, MHA),
    # 96 (GQA 4), 112 (GQA 2) beside the prefill kernel, each in the batch-invariant launch too
    "d80-mha-split-decode": dict(head_dim=80, heads=32, kv_heads=32, dtype=BF16, kv_dtype=BF16,
                                 seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768,
                                 num_decodes=3, num_kv_splits=4),
    "d96-gqa4-invariant": dict(head_dim=96, heads=32, kv_heads=8, dtype=BF16, kv_dtype=BF16,
                               seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                               batch_invariant=True),
    "d112-gqa2-unified-fp8": dict(head_dim=112, heads=16, kv_heads=8, dtype=BF16, kv_dtype=FP8,
                                  seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                                  flash_prefill=False),
    "d256-bf16-split-decode": dict(head_dim=256, heads=16, kv_heads=4, dtype=BF16,
                                   kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                   max_seq_len=32768, num_decodes=3, num_kv_splits=4),
    # The learned-position and ALiBi families: BLOOM-560m's ALiBi at head size 64 (16 heads,
    # MHA; its 80/96/112/128 heads and MPT's 128/112 take the 128 lanes of the alibi-* cases),
    # StarCoder's multi-query attention (GPTBigCode: 48 query heads on one KV head at 128, 64
    # rows of one tile) in the split-KV decodes and every row's prefill kernel
    "alibi-d64-split-decode": dict(head_dim=64, heads=16, kv_heads=16, dtype=BF16, kv_dtype=BF16,
                                   seqs=[(1, 5)] * 3 + [(70, 90)], max_seq_len=32768,
                                   num_decodes=3, num_kv_splits=4, alibi=True),
    "mqa48-d128-split-decode": dict(head_dim=128, heads=48, kv_heads=1, dtype=BF16,
                                    kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                    max_seq_len=32768, num_decodes=3, num_kv_splits=4),
    "mqa48-d128-invariant": dict(head_dim=128, heads=48, kv_heads=1, dtype=BF16, kv_dtype=BF16,
                                 seqs=[(1, 5), (70, 90)], max_seq_len=90, num_decodes=1,
                                 batch_invariant=True),
    # ... at DeepSeek-V3's 128 query heads on one GPU: 393 kB of shared memory in one tile
    # (past sm_90's 227 kB) before `attention.max_query_heads`; now 8 launches of 16 heads
    "latent-d576-h128-split-decode": dict(head_dim=576, heads=128, kv_heads=1, dtype=BF16,
                                          kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                          max_seq_len=32768, num_decodes=3, num_kv_splits=4,
                                          latent=True),
    # Gemma 3's bidirectional image spans (4B/12B: 8 or 16 query heads over 4 or 8 KV heads at
    # 256, a 1024-key window): the prefill kernel's HAS_SPANS variant beside split-KV decodes;
    # every row's prefill kernel (batch-invariant) at 128 in fp16
    "spans-gemma3-d256-split-decode": dict(head_dim=256, heads=8, kv_heads=4, dtype=BF16,
                                           kv_dtype=BF16, seqs=[(1, 5)] * 3 + [(70, 90)],
                                           max_seq_len=32768, num_decodes=3, num_kv_splits=4,
                                           sliding_window=1024, spans=True),
    "spans-invariant-d128-fp16": dict(head_dim=128, heads=16, kv_heads=8, dtype=FP16,
                                      kv_dtype=FP16, seqs=[(1, 5), (70, 90)], max_seq_len=90,
                                      num_decodes=1, batch_invariant=True, spans=True),
}  # fmt: skip

# Cases of the slow test (test_kernel_compile.py): more dtypes and shapes of variants the fast
# cases already compile once.
SLOW = {
    "alibi-unified-fp16",
    "sinks-split-decode-fp16",
    "sinks-fp8-split-decode",
    "mla-d192-split-decode-fp16",
    "mla-d192-invariant-fp16",
    "mla-d192-fp8-decode",
    "gqa16-d128",
    "gqa16-d128-unified",
    "moe-oai-gpt-oss-fp16",
    "moe-oai-deep-fp16",
    "moe-deepseek-v3-bf16",
    "moe-v2-lite-fp16",
    "chunked-gqa5-invariant-fp16",
    "chunked-gqa5-fp8-unified",
    "latent-d576-split-decode",
    "latent-d576-invariant",
    "latent-d576-unified",
    "latent-d576-fp8-split-decode",
    "latent-d576-fp8-unified",
    "latent-d576-h128-split-decode",
    "d80-mha-split-decode",
    "d96-gqa4-invariant",
    "d112-gqa2-unified-fp8",
    "d256-bf16-split-decode",
    "alibi-d64-split-decode",
    "mqa48-d128-split-decode",
    "mqa48-d128-invariant",
    "spans-invariant-d128-fp16",
}
# (The figures below were read with plain `ptxas -v` before 2026-12-07; PTXAS_FLAGS' differ
# by a few registers and bytes, the same cases spilling.)
# Cases with a kernel that spills registers (ptxas 13.4 for sm_90a, Triton 3.9; bytes stored
# and loaded): a config file's extremes (float32 at head 256: 19.6 kB; the deep MoE config in
# float32: 77 kB; the deep GEMM configs: 3.7 kB), the batch-invariant decode launch at head 64
# (8 B), and every 256-wide head (DeepSeek's 192, Gemma's 256) in the prefill kernel under the
# packaged 64-row configs: halved to 32 rows at 4 warps, 255 registers and 216 B (100 B in the
# one-token launch); 64 rows at 4 warps fit in 254 (not measured on a GPU). Llama 4's 5 query
# heads per KV head at 128 in the batch-invariant one-token launch: 32 B in fp16, with or
# without its attention chunk (the same at 3ea64c3, before chunks). Head size 96 at GQA 4 in the
# batch-invariant one-token launch: 16 B; 256 in bf16 in the prefill kernel: 124 B.
# DeepSeek's latent cache (576 in 1024 lanes, 16 query heads on its one KV head), 2026-12-06:
# every kernel spills, the prefill kernel by tens of kB a thread (49 kB bf16, 104 kB over an FP8
# cache, 27-58 kB in the batch-invariant launches; ptxas reports 32 registers there), the
# split-KV decode and unified kernels 0.3-0.5 kB at 255 registers; shared memory fits (99 kB).
# They compile and are correct (test_kernel_latent.py) but will be slow on a GPU: a 1024-lane
# row needs tiles or warps sized for it (not done; the `families` step's latent test runs them).
# At 128 query heads the decode and prefill kernels needed 393 kB of shared memory (one tile of
# all of a KV head's query heads) until paged_attention launched them in groups of 16.
# ALiBi's batch-invariant case (bf16, head 128, one query head per KV head): the one-token
# launch spills 16 B at 255 registers with or without HAS_ALIBI (the same case without it
# measured alike, 2026-12-06); the prefill launch goes from 198 to 221 registers, no spill.
# Gemma 3's image spans (HAS_SPANS), 2026-12-07 (PTXAS_FLAGS): at 256 with a window the prefill
# kernel spills 488 B at 255 registers (528 B for the same launch without spans); at 128, GQA 2,
# fp16, batch-invariant: the prefill launch 197 -> 212 registers, no spill, and the one-token
# launch (no spans: decodes take none) 348 B with or without them. Without spans the prefill
# kernel's PTX is the same instructions as before HAS_SPANS (one more, unused, parameter).
KNOWN_SPILLS = {"spans-gemma3-d256-split-decode", "spans-invariant-d128-fp16",
                "fp32-d256-decode", "deep-moe", "deep-matmul", "deep-fp8-w8a16", "alibi-invariant",
                "sinks-invariant", "mla-d192-split-decode", "mla-d192-split-decode-fp16",
                "mla-d192-invariant-fp16", "chunked-gqa5-invariant-fp16",
                "d96-gqa4-invariant", "d256-bf16-split-decode",
                "latent-d576-split-decode", "latent-d576-invariant", "latent-d576-unified",
                "latent-d576-fp8-split-decode", "latent-d576-fp8-unified",
                "latent-d576-h128-split-decode"}  # fmt: skip


def main(args: list[str]) -> int:
    """``args``: case names, or ``--fast`` (the cases outside :data:`SLOW`) or ``--slow`` (those
    in it), and ``--registers``."""
    flags = {a for a in args if a.startswith("--")}
    names = [a for a in args if not a.startswith("--")]
    if "--fast" in flags or "--slow" in flags:
        names += [n for n in CASES if (n in SLOW) == ("--slow" in flags)]
    results: list[dict] = []
    case = [""]
    install(results, case, "--registers" in flags)
    for name in names or list(CASES):
        case[0] = name
        case_kwargs = CASES[name]
        (_gemm if "gemm" in case_kwargs else _attention)(**case_kwargs)
    for r in results:
        print(json.dumps(r))
    print(json.dumps({"cases": names or list(CASES), "shared_limit": SHARED_LIMIT,
                      "known_spills": sorted(KNOWN_SPILLS)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
