"""The last part of `pagoda tune` on CUDA: ship the Triton kernels serving's warm-up compiles.

A fresh process (this module's ``main``), its ``TRITON_CACHE_DIR`` an empty temporary folder,
builds the engine as `pagoda serve --tuned-profile DIR` would (the profile's kernel configs
first, its scheduler knobs, serve's own engine factory and so the same warm-up and first step)
and exits; what Triton wrote there is packed into ``DIR/triton-cache.tar.xz``
(`pagoda.runtime.kernel_cache`) and described in ``profile.json``'s ``kernel_cache``. A fresh
process because this one compiled its kernels while tuning and holds them in memory: a warm-up
here would write nothing.

Skipped, with a note in the profile, off CUDA or with the torch attention backend (nothing to
compile); a failed or timed-out warm-up is a note too, never a failed tune.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pagoda.runtime.kernel_cache import Identity, KernelCacheError, identity_for, pack, target_of
from pagoda.runtime.tuned_profile import KERNEL_CACHE_FILE

TIMEOUT_S = 900.0  # model load + warm-up; the 1B model's took ~20 s on the H200
CPU_SKIP = "skipped: CPU run (no GPU kernels to compile)"


def cache_target(device: Any, backend: str) -> tuple[Identity | None, str]:
    """(what the archive will be built for, or None when this run ships none; a note)."""
    if getattr(device, "type", device) != "cuda":
        return None, CPU_SKIP
    if backend != "triton":
        return None, "skipped: the torch attention backend compiles no attention kernels"
    identity = identity_for(target_of(device))
    if identity is None:
        return None, "skipped: Triton is not importable"
    return identity, f"for {identity.describe()}"


def warm_in_fresh_process(
    profile_dir: Path,
    model: str,
    engine_args: dict[str, Any],
    cache_dir: Path,
    timeout: float = TIMEOUT_S,
    model_path: str | None = None,
) -> str:
    """Serve's engine build and warm-up with ``profile_dir`` in a new process writing Triton's
    cache to ``cache_dir``; its log, or KernelCacheError (with the end of it) when it fails.
    ``model_path``: the local copy of an hf:// or s3:// ``model`` the tune measured (the profile
    is checked against ``model``, the engine reads ``model_path``, as `pagoda serve` does)."""
    cmd = [sys.executable, "-P", "-m", __name__, "--profile", str(profile_dir),
           "--model", model, "--engine-args", json.dumps(engine_args)]  # fmt: skip
    if model_path is not None and model_path != model:
        cmd += ["--model-path", model_path]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir), "PYTHONSAFEPATH": "1"}
    try:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise KernelCacheError(f"the warm-up took more than {timeout:.0f} s") from e
    if run.returncode != 0:
        tail = " ".join(run.stderr.strip().splitlines()[-3:])[-400:]
        raise KernelCacheError(f"the warm-up process exited {run.returncode}: {tail}")
    return run.stderr


def ship(cache_dir: Path, out: Path, identity: Identity) -> dict[str, Any]:
    """Pack ``cache_dir`` into the profile folder; the profile's ``kernel_cache`` section (a
    'skipped' one, and no archive, when there was nothing to pack)."""
    archive = out / KERNEL_CACHE_FILE
    try:
        return pack(cache_dir, archive, identity).section()
    except KernelCacheError as e:
        archive.unlink(missing_ok=True)
        return {"status": "skipped", "note": str(e)}


def run_cache_stage(
    out: Path,
    model: str,
    engine_args: dict[str, Any],
    identity: Identity,
    timeout: float = TIMEOUT_S,
    model_path: str | None = None,
) -> dict[str, Any]:
    """Warm up as serving will in a fresh process, then `ship`; the ``kernel_cache`` section
    (status ``packed``, ``skipped`` or ``failed``, with a note)."""
    (out / KERNEL_CACHE_FILE).unlink(missing_ok=True)  # never ship one for an older profile
    _release_device_memory()  # the new process sizes its KV cache from the free memory
    with tempfile.TemporaryDirectory(prefix="pagoda-triton-") as tmp:
        try:
            warm_in_fresh_process(out, model, engine_args, Path(tmp), timeout, model_path)
        except KernelCacheError as e:
            return {"status": "failed", "note": str(e)}
        return ship(Path(tmp), out, identity)


def _release_device_memory() -> None:
    """Give back what this process's tuning engine left in torch's caching allocator."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def describe(section: dict[str, Any]) -> str:
    """The one-line report."""
    if section.get("status") != "packed":
        return f"{section.get('status')}: {section.get('note')}"
    return (
        f"{section['kernels']} kernels ({section['entries']} cache entries), "
        f"{section['bytes'] / 1024:.0f} KiB in {section['file']} "
        f"(triton {section['triton']}, {section['target'].replace(':', ' ')})"
    )


def main(argv: list[str] | None = None) -> int:
    """The fresh process: build and warm up the engine `pagoda serve` would build, then exit."""
    p = argparse.ArgumentParser(description="warm up as `pagoda serve --tuned-profile` would")
    p.add_argument("--profile", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--model-path", default=None, help="the local copy of an hf:// or s3:// model")
    p.add_argument("--engine-args", required=True, help="JSON: EngineConfig.create arguments")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.core_proc import first_step
    from pagoda.runtime.server.launch import build_core
    from pagoda.runtime.server.tuned import apply_tuned_profile
    from pagoda.runtime.server.tuned import describe as describe_profile

    log = logging.getLogger("pagoda.tune")
    log.info("kernel cache: warming up into %s", os.environ.get("TRITON_CACHE_DIR"))
    profile, kwargs = apply_tuned_profile(
        args.profile, model=args.model, engine_kwargs=json.loads(args.engine_args)
    )
    if profile is not None:
        log.info("%s", describe_profile(profile, kwargs))
    core = build_core(EngineConfig.create(args.model_path or args.model, **kwargs))
    first_step(core)
    core.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
