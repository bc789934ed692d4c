"""One `pagoda tune` run: identity → (CUDA) kernel sweep → engine profile → knobs → profile.json
→ (CUDA) the Triton kernels serving's warm-up compiles, packed beside it."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagoda.runtime.config import EngineConfig
from pagoda.runtime.tune.choose import Targets, choose_scheduler
from pagoda.runtime.tune.kernel_stage import kernel_buckets, kernel_target, run_kernel_stage
from pagoda.runtime.tuned_profile import (
    FINGERPRINT_FIELD,
    PROFILE_FILE,
    SCHEMA_VERSION,
    ProfileError,
    check_layout,
    device_identity,
    fingerprint_mismatches,
    kernel_config_files,
    normalize_model,
    now_iso,
    read_json,
    remove_profile,
    validate_fingerprint,
    versions,
    write_profile,
)

SHAPE_KEYS = ("max_model_len", "block_size")  # a profile for other shapes is not resumed


@dataclass(frozen=True)
class TuneRequest:
    model: str
    output: str
    revision: str | None = None  # an hf:// model's commit (or branch, tag): `--revision`
    download_dir: str | None = None  # where hf:// and s3:// models are: `--download-dir`
    engine_args: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None
    time_budget_s: float = 900.0
    targets: Targets = field(default_factory=Targets)
    prompt_len: int | None = None
    quick: bool = False
    force: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.output:
            raise ValueError("--output DIR is required")
        if not self.time_budget_s > 0:
            raise ValueError(f"time budget must be positive, got {self.time_budget_s}")
        for name in ("max_model_len", "prompt_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 2):
                raise ValueError(f"{name} must be an integer >= 2, got {value!r}")


@dataclass
class TuneResult:
    profile: dict[str, Any]
    usable: bool  # scheduler knobs chosen (at least one prefill and one decode point)
    summary: str


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _previous(out: Path, identity: dict[str, str], force: bool) -> dict[str, Any] | None:
    """The profile to resume, None for a fresh start; refuses to mix two setups in one DIR."""
    if force:
        remove_profile(out)
        return None
    check_layout(out)
    data = read_json(out / PROFILE_FILE)
    if data is None:
        return None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(f"{out} holds a profile of another schema version; use --force")
    differs = [
        f"{k} {data.get(k)!r} != {v!r}"
        for k, v in identity.items()
        if (normalize_model(str(data.get(k))) if k == "model" else data.get(k)) != v
    ]
    if differs:
        raise ProfileError(
            f"{out} holds a profile for another setup ({'; '.join(differs)}); use another "
            "--output or --force to replace it"
        )
    return data


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="pagoda tune", unit="point", file=sys.stderr, leave=True)


def _engine_config(
    req: TuneRequest, plan: Any, max_model_len: int, model_path: str | None = None
) -> EngineConfig:
    """Room for the largest point: every decode batch, every prefill chunk in one step
    (`model_path`: the local copy of an hf:// or s3:// `--model`)."""
    prompts = math.ceil(max(plan.chunk_sizes) / (max_model_len - 1))
    seqs = max(*plan.decode_batches, prompts)
    return EngineConfig.create(
        model_path or req.model,
        **{
            **req.engine_args,
            "max_model_len": max_model_len,
            "max_num_seqs": seqs,
            "max_num_batched_tokens": max(*plan.chunk_sizes, seqs),
            "enable_prefix_caching": True,
            "enable_chunked_prefill": True,
            # A point times one step and reads that step's own outputs: no step launched ahead.
            # Serving with async scheduling hides the host's share, so these times are an upper
            # bound (on the H200 a full-batch decode step: 5.3 ms synchronous, 3.96 ms async).
            "async_scheduling": False,
            # A prefill point of C tokens split over several prompts is one step of C tokens,
            # not prompts capped as if streams waited beside them.
            "long_prefill_token_threshold": 0,
        },
    )


def tune(req: TuneRequest) -> TuneResult:
    """Measure, choose, write ``profile.json`` (after every point) and return the summary."""
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.tune.report import summary_table

    start = time.monotonic()
    out = Path(req.output)
    setup = _setup(req, out)
    profile = _skeleton(setup.previous, setup.identity, setup.base, setup.max_model_len, req)
    profile[FINGERPRINT_FIELD] = setup.fingerprint
    if setup.commit is not None:
        profile["model_commit"] = setup.commit
    profile["attention_backend"] = setup.backend
    save = lambda: write_profile(out, profile)  # noqa: E731
    save()
    label, note = kernel_target(setup.base, setup.backend)
    buckets = (
        []
        if label is None
        else kernel_buckets(
            setup.model_config, setup.base, setup.plan, setup.max_model_len, req.quick
        )
    )
    print(f"kernels: {note}", file=sys.stderr)
    bar = _progress_bar(setup.plan.num_points + len(buckets), req.progress)

    def progress(label: str) -> None:
        if bar is not None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

    try:
        kernels = _KernelStage(label, note, buckets, start + 0.6 * req.time_budget_s)
        _run_kernels(setup, kernels, req, out, profile, progress, save)
        loaded = lambda: load_model(setup.model_path)  # noqa: E731 - only if a point is left
        deadline = start + req.time_budget_s
        engine = _profile_engine(req, setup.model_path, loaded, setup.plan, setup.max_model_len,
                                 out, profile, deadline, progress, save)  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    usable = _finish(profile, engine, req, time.monotonic() - start)
    save()
    profile["kernel_cache"] = _kernel_cache(setup, req, out, usable)
    save()
    return TuneResult(profile, usable, summary_table(profile, out))


@dataclass(frozen=True)
class _Setup:
    """What a run measures, resolved (and checked against a previous run) before measuring."""

    base: EngineConfig
    model_path: str  # the local copy of an hf:// or s3:// model (resolved once), else --model
    commit: str | None  # the hf:// commit measured (profile.json's model_commit)
    model_config: Any
    fingerprint: dict[str, Any]  # the model's shape fingerprint (profile.json's)
    identity: dict[str, str]
    previous: dict[str, Any] | None
    max_model_len: int
    plan: Any
    backend: str


def _setup(req: TuneRequest, out: Path) -> _Setup:
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.model.shape_fingerprint import model_fingerprint
    from pagoda.runtime.model.sources.fetch import resolve_model, snapshot_commit
    from pagoda.runtime.tune.engine import make_plan

    EngineConfig.create(req.model, **req.engine_args)  # flag errors before downloading
    # hf:// and s3:// → the local copy, once, as `pagoda serve` does: every stage (the kernel
    # shapes, the engine, the kernel-cache warm-up) reads the same files, whatever the branch
    # does meanwhile
    model_path = resolve_model(req.model, req.download_dir, revision=req.revision)
    commit = snapshot_commit(model_path) if req.model.startswith("hf://") else None
    base = EngineConfig.create(model_path, **req.engine_args)
    model_config = read_model_config(model_path)  # metadata only: a resumed run may load nothing
    fingerprint = model_fingerprint(model_path, base.quantization, model_config)
    cuda = base.torch_device().type == "cuda"
    identity = {
        "device": device_identity(base.torch_device()),
        "model": normalize_model(req.model),
        "dtype": dtype_name(base.torch_dtype()),
    }
    previous = _previous(out, identity, req.force)
    _check_fingerprint(previous, out, fingerprint)
    _note_commit(previous, out, commit)
    max_model_len = req.max_model_len or model_config.context_length
    _check_shapes(previous, out, max_model_len, base.cache.block_size)
    plan = make_plan(max_model_len=max_model_len, cuda=cuda, quick=req.quick)
    backend = base.attention_backend
    if backend == "auto":
        backend = "triton" if cuda else "torch"
    return _Setup(base, model_path, commit, model_config, fingerprint, identity, previous,
                  max_model_len, plan, backend)  # fmt: skip


def _check_fingerprint(previous: dict | None, out: Path, fingerprint: dict[str, Any]) -> None:
    """A profile measured for other model shapes (another architecture behind the same --model,
    or other FP8 weights) is not resumed; one without a fingerprint (an older tuner) is."""
    if previous is None:
        return
    validate_fingerprint(previous.get(FINGERPRINT_FIELD), out / PROFILE_FILE)
    differs = fingerprint_mismatches(previous.get(FINGERPRINT_FIELD), fingerprint)
    if differs:
        raise ProfileError(f"{out} was tuned for other model shapes ({'; '.join(differs)}); "
                           "use --force")  # fmt: skip


def _note_commit(previous: dict | None, out: Path, commit: str | None) -> None:
    """Resuming a profile measured on another commit of the model is allowed once its shape
    fingerprint is the same (`_check_fingerprint`: the points depend on the shapes, not on the
    weights' values); say so, once."""
    before = (previous or {}).get("model_commit")
    if before and commit and before != commit:
        same = "the same shape fingerprint" if previous.get(FINGERPRINT_FIELD) else "no fingerprint"
        print(f"note: {out} was measured on commit {before[:12]}, this run measures "
              f"{commit[:12]}: resuming ({same}; the points depend on the model's shapes, not "
              "its weights; --force measures everything again)", file=sys.stderr)  # fmt: skip


@dataclass(frozen=True)
class _KernelStage:
    label: str | None  # None: no kernel to tune here (`note` says why)
    note: str
    buckets: list[Any]
    deadline: float  # monotonic time the sweep stops at


def _run_kernels(
    setup: _Setup, k: _KernelStage, req: TuneRequest, out: Path, profile: dict, progress, save
) -> None:
    """The kernel sweep (or a 'skipped' section saying why), saved after every bucket."""

    def save_kernels(section: dict) -> None:
        profile["kernels"] = section
        save()

    if k.label is None:
        save_kernels({"status": "skipped", "note": k.note, "buckets": [], "complete": True})
        return
    save_kernels(
        run_kernel_stage(
            setup.model_config, setup.base, k.buckets, label=k.label, out=out,
            previous=profile.get("kernels"), deadline=k.deadline, quick=req.quick,
            progress=progress, save=save_kernels,
        )
    )  # fmt: skip


def _kernel_cache(setup: _Setup, req: TuneRequest, out: Path, usable: bool) -> dict[str, Any]:
    """The Triton kernels serving's warm-up compiles with this profile, compiled in a fresh
    process and packed beside it (CUDA with the Triton backend); the ``kernel_cache`` section."""
    from pagoda.runtime.tune.kernel_cache_stage import cache_target, describe, run_cache_stage

    identity, note = cache_target(setup.base.torch_device(), setup.backend)
    if identity is None:
        section = {"status": "skipped", "note": note}
    elif not usable:
        section = {"status": "skipped", "note": "no scheduler knobs chosen yet (rerun to resume)"}
    else:
        print(f"kernel cache: warming up as `pagoda serve` will, in a fresh process ({note})",
              file=sys.stderr)  # fmt: skip
        args = {**req.engine_args, "max_model_len": setup.max_model_len}
        section = run_cache_stage(out, req.model, args, identity, model_path=setup.model_path)
    print(f"kernel cache: {describe(section)}", file=sys.stderr)
    return section


def _check_shapes(previous: dict | None, out: Path, max_model_len: int, block_size: int) -> None:
    """A profile measured for other shapes is not resumed (its points would not fit)."""
    have = dict(zip(SHAPE_KEYS, (max_model_len, block_size), strict=True))
    if previous is not None and any(previous.get(k) not in (None, v) for k, v in have.items()):
        raise ProfileError(f"{out} was tuned for another max_model_len/block_size; use --force")


def _finish(profile: dict, engine: dict, req: TuneRequest, spent: float) -> bool:
    """Choose the knobs from the measured curves; True when there was enough to choose from."""
    profile["engine"] = engine
    usable = bool(engine["prefill"] and engine["decode"])
    if usable:
        prompt = req.prompt_len or min(profile["max_model_len"], 2048)
        choice = choose_scheduler(
            engine["prefill"],
            engine["decode"],
            kv_capacity_tokens=engine["kv_cache"]["capacity_tokens"],
            targets=req.targets,
            prompt_tokens=prompt,
        )
        profile["scheduler"] = _scheduler_section(choice)
        profile["capacity"] = _capacity_section(choice, engine, prompt)
    profile["complete"] = bool(engine["complete"] and profile["kernels"].get("complete", True))
    profile["updated"] = now_iso()
    profile["time_spent_s"] = round(profile.get("time_spent_s", 0.0) + spent, 1)
    return usable


def _skeleton(
    previous: dict | None, identity: dict, base: EngineConfig, max_model_len: int, req: TuneRequest
) -> dict[str, Any]:
    """profile.json before measuring: identity, provenance, targets, and what a resume keeps."""
    prev = previous or {}
    return {
        "schema_version": SCHEMA_VERSION,
        **identity,
        "max_model_len": max_model_len,
        "block_size": base.cache.block_size,
        "attention_backend": base.attention_backend,
        "versions": versions(),
        "created": prev.get("created", now_iso()),
        "updated": now_iso(),
        "time_spent_s": float(prev.get("time_spent_s", 0.0)),
        "targets": {"ttft_s": req.targets.ttft_s, "itl_s": req.targets.itl_s},
        "complete": False,
        "engine": prev.get("engine", {}),
        "kernels": prev.get("kernels", {}),
    }


def _profile_engine(
    req: TuneRequest,
    model_path: str,
    loaded: Any,
    plan: Any,
    max_model_len: int,
    out: Path,
    profile: dict,
    deadline: float,
    progress: Any,
    save: Any,
) -> dict[str, Any]:
    """Build the engine with the freshly tuned kernels first in the search path, then measure."""
    from pagoda.kernels.config import config_dirs, set_config_dirs
    from pagoda.runtime.engine.core import EngineCore
    from pagoda.runtime.tune.engine import EngineProfiler, measure_engine

    before = config_dirs()
    if kernel_config_files(out):
        set_config_dirs([out, *before])

    def make_profiler() -> EngineProfiler:
        core = EngineCore(_engine_config(req, plan, max_model_len, model_path), loaded())
        if core.max_model_len < max_model_len:
            raise ValueError(
                f"the KV cache holds {core.max_model_len} tokens, less than max_model_len "
                f"{max_model_len}: give a larger --kv-cache-memory or a smaller --max-model-len"
            )
        return EngineProfiler(core)

    def checkpoint(section: dict) -> None:
        profile["engine"] = section
        save()

    try:
        return measure_engine(
            make_profiler,
            plan,
            profile.get("engine"),
            deadline=deadline,
            progress=progress,
            checkpoint=checkpoint,
        )
    finally:
        if config_dirs() != before:
            set_config_dirs(before)


def _scheduler_section(choice: Any) -> dict[str, Any]:
    return {
        "max_num_batched_tokens": choice.max_num_batched_tokens,
        "max_num_seqs": choice.max_num_seqs,
        "chunk_tokens": choice.chunk_tokens,
        "itl_met": choice.itl_met,
        "ttft_met": choice.ttft_met,
        "reason": choice.reason,
    }


def _capacity_section(choice: Any, engine: dict, prompt: int) -> dict[str, Any]:
    return {
        "prefill_tokens_per_s": choice.prefill_tokens_per_s,
        "decode_tokens_per_s": choice.decode_tokens_per_s,
        "decode_step_s": choice.decode_step_s,
        "decode_context": choice.decode_context,
        "max_decode_batch": choice.max_num_seqs,
        "kv_capacity_tokens": engine["kv_cache"]["capacity_tokens"],
        "max_prompt_tokens_within_ttft": choice.max_prompt_tokens_within_ttft,
        "reference_prompt_tokens": prompt,
    }
