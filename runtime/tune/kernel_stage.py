"""The kernel part of `pagoda tune`: where it runs, which buckets, and its profile section.

It runs on CUDA with the Triton backend. On a CPU it is skipped with one line, except when the
user asks for it explicitly (``--attention-backend triton`` with ``TRITON_INTERPRET=1``): then the
same sweep runs through the interpreter, which exercises the tuner end to end (tests) but whose
timings are not performance data; its configs go to ``cpu-interpreter.json`` in the profile
folder, a file no serving device reads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pagoda.runtime.config import EngineConfig

INTERPRETER_LABEL = "cpu-interpreter"
CPU_SKIP = "skipped: CPU run (the Triton interpreter is not a performance target)"


def kernel_target(base: EngineConfig, backend: str) -> tuple[str | None, str]:
    """(device label of the config file, or None when skipped; a note for the one-line report)."""
    from pagoda.kernels._common import interpreter_enabled
    from pagoda.kernels.config import device_name

    device = base.torch_device()
    if device.type == "cuda":
        if backend != "triton":
            return None, "skipped: the torch attention backend uses no Pagoda kernels"
        return device_name(device), "tuned on " + device_name(device)
    if backend == "triton" and interpreter_enabled():
        return INTERPRETER_LABEL, "CPU under TRITON_INTERPRET=1: tuner logic only, not timings"
    return None, CPU_SKIP


def attention_shape(model_config: Any, base: EngineConfig) -> Any:
    from pagoda.runtime.tune.kernels import AttentionShape

    return AttentionShape(
        num_heads=model_config.num_heads,
        num_kv_heads=model_config.num_kv_heads,
        head_dim=model_config.head_dim,
        block_size=base.cache.block_size,
        dtype=base.torch_dtype(),
    )


def kernel_buckets(
    model_config: Any, base: EngineConfig, plan: Any, max_model_len: int, quick: bool
) -> list:
    """The buckets the engine profile's largest points (and so serving) can reach: the FP8
    weight shapes of a model served in FP8 (its layers' GEMMs always run in Pagoda's kernel);
    with batch-invariant matmuls (the default) each 16-bit weight shape (only the LM head in
    FP8), as the matmuls are most of a GPU step; then the fused-MoE expert shape of an MoE
    model; then attention."""
    from pagoda.runtime.tune.fp8_matmul import model_serves_fp8, plan_fp8_buckets
    from pagoda.runtime.tune.kernels import plan_buckets
    from pagoda.runtime.tune.matmul import plan_matmul_buckets
    from pagoda.runtime.tune.moe import model_moe_shape, plan_moe_buckets

    limits = dict(max_num_seqs=max(plan.decode_batches), quick=quick)
    chunk = max(plan.chunk_sizes)
    fp8 = model_serves_fp8(base.model, base.quantization)
    matmuls = []
    if fp8:
        matmuls = plan_fp8_buckets(
            model_config, base.torch_dtype(), max_num_batched_tokens=chunk, **limits
        )
    if base.batch_invariant:
        sixteen_bit = ("lm_head",) if fp8 else None
        matmuls += plan_matmul_buckets(
            model_config, base.torch_dtype(), max_num_batched_tokens=chunk, names=sixteen_bit,
            **limits,
        )  # fmt: skip
    matmuls += plan_moe_buckets(  # MoE models only: the expert GEMMs, most of their step
        model_moe_shape(base.model, model_config), base.torch_dtype(),
        batch_invariant=base.batch_invariant, max_num_batched_tokens=max(plan.chunk_sizes), **limits,
    )  # fmt: skip
    return matmuls + plan_buckets(
        attention_shape(model_config, base),
        max_model_len=max_model_len,
        max_num_batched_tokens=max(plan.chunk_sizes),
        **limits,
    )


def run_kernel_stage(
    model_config: Any,
    base: EngineConfig,
    buckets: list,
    *,
    label: str,
    out: Path,
    previous: dict | None,
    deadline: float,
    quick: bool,
    progress: Callable[[str], None],
    save: Callable[[dict], None],
) -> dict[str, Any]:
    """Sweep the buckets (resuming ``previous``); ``save`` gets the section after each bucket."""
    from pagoda.kernels.config import config_file_name
    from pagoda.runtime.tune.kernels import candidate_space
    from pagoda.runtime.tune.sweep import cuda_graph_timer, cuda_timer, tune_kernels, wall_timer

    device = base.torch_device()
    file = config_file_name(label)  # in the profile folder, beside profile.json

    def section(reports: list[dict], complete: bool) -> dict[str, Any]:
        status = "tuned" if complete else "partial"
        return {
            "status": status,
            "config_file": file,
            "buckets": list(reports),
            "complete": complete,
        }

    reports, complete = tune_kernels(
        attention_shape(model_config, base),
        buckets,
        device=device,
        device_label=label,
        out_dir=out,
        previous=(previous or {}).get("buckets"),
        deadline=deadline,
        timer=cuda_timer if device.type == "cuda" else wall_timer,
        matmul_timer=cuda_graph_timer if device.type == "cuda" else wall_timer,
        space=lambda kernel: candidate_space(kernel, quick),
        progress=progress,
        checkpoint=lambda done: save(section(done, False)),
    )
    return section(reports, complete)
