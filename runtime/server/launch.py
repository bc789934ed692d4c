"""Start-up of `pagoda serve`: check everything checkable before the model loads, then serve on
the sockets `server/cli.py` bound first.

Split from `cli.py` because this side imports torch and uvicorn; the parser must not.

What `preflight` checks, each a ValueError with one line (the CLI prints it and exits 2): the
tuned profile (its fields and kernel configs), the model's metadata (not its weights), every
size against its range and the model's context, the kernel-config files the device will read,
whether the weights and one full-length sequence fit a device at all (`fit.py`, reason
ModelDoesNotFit), the memory the configuration will allocate against what this machine has
free, and that a checkpoint directory holds its weight and tokenizer files.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.engine.pooling import check_pooling
from pagoda.runtime.engine.start_checks import (
    check_block_size,
    check_dtype,
    check_max_model_len,
    check_speculative,
)
from pagoda.runtime.model.hf_overrides import overlay
from pagoda.runtime.model.loader import read_model_config, read_tokenizer, resolve_model_path
from pagoda.runtime.model.safetensors_weights import checkpoint_files
from pagoda.runtime.model.shape_fingerprint import model_fingerprint
from pagoda.runtime.model.sources.fetch import resolve_model, snapshot_commit
from pagoda.runtime.multimodal import processor_kwargs
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.pooler_config import with_runner
from pagoda.runtime.quantization.fp8 import check_checkpoint_form
from pagoda.runtime.server import api_process, fit, memory
from pagoda.runtime.server.api_process import ServePlan
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.server.held_logs import held_logs
from pagoda.runtime.server.tuned import apply_tuned_profile, describe, kernel_cache_archive
from pagoda.runtime.tuned_profile import TunedProfile

log = logging.getLogger("pagoda.serve")


def preflight(
    cfg: ServerConfig,
    engine_kwargs: Mapping[str, Any],
    tuned_profile: str | None = None,
    tuned_profile_mismatch: str = "error",
    download_dir: str | None = None,
    parallel: Parallelism | None = None,
    revision: str | None = None,
) -> tuple[EngineConfig, TunedProfile | None]:
    """The one `EngineConfig` of this server, and the tuned profile applied to it (if any).

    ValueError (a ProfileError, a KernelConfigError too) naming what does not fit: the flags
    together, the profile, the model, the kernel configs or this machine's memory; a model
    whose weights and one full-length sequence do not fit one rank is a `ReasonedError` with
    reason ModelDoesNotFit (`fit.check`).
    """
    # hf:// and s3:// → a local copy, downloaded now or found in --download-dir (offline too)
    model_path = resolve_model(cfg.model, download_dir, revision=revision)
    if "hf_overrides" in engine_kwargs:  # config.json's keys replaced: an overlay directory
        model_path = str(overlay(resolve_model_path(model_path), engine_kwargs["hf_overrides"]))
        engine_kwargs = {k: v for k, v in engine_kwargs.items() if k != "hf_overrides"}
    model_config = read_model_config(model_path)  # an unknown --model fails here
    quantization = engine_kwargs.get("quantization")
    profile, kwargs = apply_tuned_profile(
        tuned_profile,
        model=cfg.model,
        engine_kwargs=engine_kwargs,
        mismatch=tuned_profile_mismatch,
        shapes=lambda: model_fingerprint(model_path, quantization, model_config),
    )
    if profile is not None:
        note = profile.commit_note(snapshot_commit(model_path), shapes_checked=True)
        if note:
            log.log(logging.INFO if profile.shape_fingerprint else logging.WARNING, "%s", note)
    check_context(kwargs, model_config)
    engine_cfg = EngineConfig.create(model_path, **kwargs)
    # --runner auto: the checkpoint's files decide (`pooler_config.py`); pooling's refusals
    engine_cfg = with_runner(engine_cfg, resolve_model_path(model_path), model_config.hidden_size)
    check_pooling(engine_cfg, model_config)
    check_dtype(engine_cfg, model_config)
    check_block_size(engine_cfg, model_config)
    processor_kwargs.apply(model_config.vision, engine_cfg.mm_processor_kwargs)
    draft = check_speculative(engine_cfg, model_config)  # (the draft's config, read once)
    if engine_cfg.lora is not None:  # the family, and every --lora-modules adapter read
        from pagoda.runtime.lora.adapter import check_adapters

        check_adapters(engine_cfg.lora, model_config)
    check_checkpoint_form(engine_cfg.quantization, str(resolve_model_path(model_path)))
    if parallel is not None:
        engine_cfg = dataclasses.replace(engine_cfg, parallel=parallel)
    check_parallel(model_config, engine_cfg)  # a group's GPUs first: it says how many it needs
    check_device_present(engine_cfg)
    check_step_budget(engine_kwargs, engine_cfg)
    check_kernel_configs(engine_cfg)
    fit.check(model_config, engine_cfg, resolve_model_path(model_path),
              engine_cfg.parallel.tensor_parallel_size, draft)  # fmt: skip
    try:
        memory.check(model_config, engine_cfg, resolve_model_path(model_path),
                     engine_kwargs.get("max_model_len"), draft)  # fmt: skip
    except ValueError as e:
        if profile is None:
            raise
        tuned = ", ".join(f"{k} {v}" for k, v in profile.scheduler_args().items())
        raise ValueError(f"{e} (tuned profile {profile.directory} sets {tuned})") from e
    check_checkpoint_files(cfg.model, resolve_model_path(model_path))
    if profile is not None:
        log.info("%s", describe(profile, kwargs))
    return engine_cfg, profile


def check_checkpoint_files(model: str, path: Path) -> None:
    """A Hugging Face directory holds its safetensors files and a tokenizer.json that is a JSON
    object (or GPT-2's vocab.json and merges.txt, a SentencePiece tokenizer.model, or a
    tiktoken file with known tokenizer code: `_check_tokenizer_files`). The metadata checks
    above read config.json alone (a config without weights is enough to size a model), so a
    directory without them would otherwise fail in the engine's load, after the server listens. The tokenizer is looked at, not parsed (that would add its
    time, ~0.3 s for a 128k vocabulary, to every start): its first and last bytes, which a
    truncated download, a Git LFS pointer or an error page saved in its place do not have."""
    if not path.is_dir():
        return
    try:
        checkpoint_files(path)
        tokenizer = path / "tokenizer.json"
        if not tokenizer.is_file():
            _check_tokenizer_files(path)
            return
        if not _looks_like_a_json_object(tokenizer):
            raise ValueError(f"{tokenizer} is not a JSON object (truncated, or a Git LFS pointer?)")
    except ValueError as e:
        raise ValueError(f"model {model!r}: {e}") from e


def _check_tokenizer_files(path: Path) -> None:
    """Without tokenizer.json, GPT-2's vocab.json and merges.txt (`bpe_files`: OPT's, read at
    load), a SentencePiece `tokenizer.model` with known tokenizer code (`spm_files`), or a
    tiktoken file whose tokenizer code is known (Kimi K2, Moonlight: `tiktoken_files`); the
    files are read at load."""
    from pagoda.runtime.model import bpe_files, spm_files, tiktoken_files
    from pagoda.runtime.model.template_files import read_json_object

    vocab = path / bpe_files.VOCAB
    if vocab.is_file() and (path / bpe_files.MERGES).is_file():
        if not _looks_like_a_json_object(vocab):
            raise ValueError(f"{vocab} is not a JSON object (truncated, or a Git LFS pointer?)")
        return
    ranks = path / tiktoken_files.TIKTOKEN_FILE
    if not ranks.is_file() and (path / spm_files.SPM_FILE).is_file():
        spm_files.check_spm_dir(path, read_json_object(path / "tokenizer_config.json"))
        return
    if not ranks.is_file():
        raise ValueError(f"{path} has no tokenizer.json (nor {tiktoken_files.TIKTOKEN_FILE}, "
                         f"{bpe_files.VOCAB} with {bpe_files.MERGES}, or {spm_files.SPM_FILE})")  # fmt: skip
    if not tiktoken_files.looks_like_ranks(ranks):
        raise ValueError(f"{ranks} is not a tiktoken file (base64 token, rank per line; "
                         "truncated, or a Git LFS pointer?)")  # fmt: skip
    tiktoken_files.tiktoken_code(path, read_json_object(path / "tokenizer_config.json"))


def _looks_like_a_json_object(path: Path, edge: int = 64) -> bool:
    with path.open("rb") as f:
        head = f.read(edge).lstrip()
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - edge))
        tail = f.read().rstrip()
    return head.startswith(b"{") and tail.endswith(b"}")


def check_context(kwargs: dict[str, Any], model_config: ModelConfig) -> None:
    """`max_model_len` defaults to the model's context length and may not exceed it (the RoPE
    of a longer context is untrained; vLLM refuses it too)."""
    asked = kwargs.get("max_model_len")
    if asked is None or (isinstance(asked, int) and not isinstance(asked, bool)):
        kwargs["max_model_len"] = check_max_model_len(asked, model_config)


def check_parallel(model_config: ModelConfig, engine_cfg: EngineConfig) -> None:
    """--tensor-parallel-size against the model (heads, widths that must divide) and, on CUDA,
    the GPUs this node has for its ranks (one each)."""
    par = engine_cfg.parallel
    if par.tensor_parallel_size == 1:
        return
    from pagoda.runtime.distributed.layout import check

    check(model_config, par.tensor_parallel_size)
    device = engine_cfg.torch_device()
    if device.type == "cuda" and par.ranks_per_node > torch.cuda.device_count():
        raise ValueError(
            f"--tensor-parallel-size {par.tensor_parallel_size} runs {par.ranks_per_node} ranks "
            f"on this node, one per GPU, and it has {torch.cuda.device_count()}"
        )


def check_device_present(engine_cfg: EngineConfig) -> None:
    """`--device cuda[:N]` names a GPU this machine has (else torch's own error came later, as
    an AssertionError about how torch was compiled)."""
    device = engine_cfg.torch_device()
    if device.type != "cuda":
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"--device {engine_cfg.device}: this machine has no CUDA GPU that "
                         "torch can use; use --device cpu (or auto)")  # fmt: skip
    if device.index is not None and device.index >= count:
        raise ValueError(f"--device {engine_cfg.device}: this machine has {count} CUDA "
                         f"GPU(s), cuda:0 to cuda:{count - 1}")  # fmt: skip


def check_step_budget(flags: Mapping[str, Any], engine_cfg: EngineConfig) -> None:
    """An explicit --max-num-batched-tokens above what one step can ever schedule (every
    sequence slot with a full context) is a typo, not a setting."""
    sched = engine_cfg.scheduler
    reachable = sched.max_num_seqs * sched.max_model_len
    if flags.get("max_num_batched_tokens") is not None and sched.max_num_batched_tokens > reachable:
        raise ValueError(
            f"max_num_batched_tokens {sched.max_num_batched_tokens} is more than one step can "
            f"ever schedule (max_num_seqs {sched.max_num_seqs} × max_model_len "
            f"{sched.max_model_len} = {reachable})"
        )


def check_kernel_configs(engine_cfg: EngineConfig) -> None:
    """The kernel-config files this device will read (its own and the defaults), validated
    now rather than at the first kernel launch."""
    from pagoda.kernels.config import check_config_files

    check_config_files(engine_cfg.torch_device())


def build_core(engine_cfg: EngineConfig, on_failure: Any = None, kernel_cache: Any = None) -> Any:
    """The engine's core, loaded and warmed up (in the engine process, or on its thread).
    `on_failure`: told from another thread that a tensor-parallel rank died; by default the
    process exits 1 at once (the engine process: the API process then sees it dead).
    `kernel_cache`: the tuned profile's compiled kernels (`tuned.kernel_cache_archive`),
    installed into this process's Triton cache before anything compiles."""
    import time

    from pagoda.runtime.engine.core import EngineCore
    from pagoda.runtime.engine.warmup import warm_up
    from pagoda.runtime.kernel_cache import installed_for_warm_up

    with installed_for_warm_up(kernel_cache, engine_cfg.torch_device()):
        start = time.monotonic()
        core = EngineCore(engine_cfg, on_failure=on_failure or _end_engine_process)
        log.info("engine core built (model, KV cache, tokenizer) in %.1f s",
                 time.monotonic() - start)  # fmt: skip
        return warm_up(core)


def _end_engine_process(exc: BaseException) -> None:
    log.error("%s: the engine process exits", exc)
    os._exit(1)


def plan_of(engine_cfg: EngineConfig, profile: TunedProfile | None) -> ServePlan:
    """What the API process needs of the checked configuration, as plain data."""
    tuned = None if profile is None else (profile.device, profile.model, profile.created)
    return ServePlan(max_num_seqs=engine_cfg.scheduler.max_num_seqs, tuned_profile=tuned)


def core_factory(engine_cfg: EngineConfig, profile: TunedProfile | None) -> Any:
    """The engine core's factory (it pickles: it crosses to the engine process), with the
    tuned profile's compiled kernels."""
    shipped = kernel_cache_archive(profile) if profile is not None else None
    return functools.partial(build_core, engine_cfg, kernel_cache=shipped)


def checked_factory(**checks: Any) -> tuple[Any, ServePlan]:
    """`preflight(**checks)` in the engine process (`EngineProcClient.preflight`): the core
    factory of the configuration checked, and the plan the API process serves with. Their log
    lines are held until they pass and dropped when they fail, as the API process does with
    its own: a refused start stays one line."""
    with held_logs():
        engine_cfg, profile = preflight(**checks)
    return core_factory(engine_cfg, profile), plan_of(engine_cfg, profile)


def serve(
    cfg: ServerConfig,
    engine_cfg: EngineConfig,
    profile: TunedProfile | None = None,
    sockets: list[socket.socket] | None = None,
    engine_client: Any = None,
) -> int:
    """Load the model in the engine process (`engine_client`: spawned already by the caller)
    or on the engine thread and serve on `sockets` (bound by the caller; bound here from `cfg`
    when None) until drained; the exit code (`api_process.serve`). `pagoda serve` itself
    checks in the engine process instead and calls `api_process.serve` with no torch here.

    The engine factory warms up every kernel variant the configured shapes reach before the
    engine reports ready, so `/ready` turns 200 only when no JIT compile is left to pay.
    """
    factory = core_factory(engine_cfg, profile)
    if engine_client is not None:  # the model loads there while this process builds the app
        engine_client.load(factory, tokenizer=functools.partial(read_tokenizer, engine_cfg.model))
    engines: list[Any] = []
    if not cfg.engine_process:  # a dead tensor-parallel rank marks the engine dead here
        shipped = factory.keywords["kernel_cache"]
        factory = lambda: build_core(engine_cfg, engines[0].fail, shipped)  # noqa: E731
    return api_process.serve(
        cfg, plan_of(engine_cfg, profile), factory, sockets, engine_client, engines.append
    )
