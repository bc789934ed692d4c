"""`pagoda serve --tuned-profile DIR`: check the profile fits this server, then apply it.

Applying means three things: ``DIR`` goes first on the kernel-config search path
(`pagoda.kernels.config.set_config_dirs`); the profile's ``max_num_batched_tokens``/
``max_num_seqs`` become engine arguments unless a flag set them (those flags default to None, so
an explicit `--max-num-seqs 64` wins over the profile even though 64 is also the engine's
default); and its compiled Triton kernels (`kernel_cache_archive`), if it ships them, are
installed into Triton's cache by the engine factory before the warm-up
(`pagoda.runtime.kernel_cache`). The profile's format is `pagoda.runtime.tuned_profile`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pagoda.runtime import option_rules, options
from pagoda.runtime.config import resolve_device, resolve_dtype
from pagoda.runtime.tuned_profile import (
    KERNEL_CACHE_FILE,
    ProfileError,
    TunedProfile,
    device_identity,
    kernel_cache_file,
    load_profile,
)

log = logging.getLogger("pagoda.serve")


def check_profile(
    directory: str,
    *,
    model: str,
    engine_kwargs: Mapping[str, Any],
    mismatch: str = "error",
    shapes: Callable[[], Mapping[str, Any]] | None = None,
) -> TunedProfile | None:
    """The profile when it was measured for this device/model/dtype and, when it records one,
    the shape fingerprint `shapes()` gives (this server's model; None: not compared).

    Otherwise ProfileError naming every difference (``mismatch="error"``), or None after a
    warning (``"warn"``: the server runs on its defaults). A missing or malformed profile is
    always an error: the operator mounted something, and serving silently without it would hide
    that.
    """
    if mismatch not in options.TUNED_PROFILE_MISMATCH:
        raise ValueError(f"tuned-profile-mismatch must be error or warn, got {mismatch!r}")
    profile = load_profile(directory)
    device = resolve_device(engine_kwargs.get("device", options.DEFAULT_DEVICE))
    dtype = resolve_dtype(engine_kwargs.get("dtype", options.DEFAULT_DTYPE), device)
    fingerprint = shapes() if shapes is not None and profile.shape_fingerprint else None
    problems = profile.mismatches(
        device=device_identity(device), model=model, dtype=str(dtype).removeprefix("torch."),
        shapes=fingerprint,
    )  # fmt: skip
    if not problems:
        return profile
    msg = f"tuned profile {directory} was measured for another setup: {'; '.join(problems)}"
    if mismatch == "error":
        raise ProfileError(
            f"{msg} (run `pagoda tune` on this node, or pass --tuned-profile-mismatch=warn "
            "to serve on defaults)"
        )
    log.warning("%s; ignoring it and serving on defaults", msg)
    return None


def profile_engine_kwargs(
    profile: TunedProfile, engine_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Engine arguments with the profile's scheduler knobs under the flags the user set (the
    scheduler flags default to None, so a value present here was given on the command line)."""
    merged = dict(engine_kwargs)
    tuned = profile.scheduler_args()
    explicit = {k for k, v in engine_kwargs.items() if v is not None}
    if merged.get("enable_chunked_prefill") is False:
        tuned.pop("max_num_batched_tokens", None)  # must cover max_model_len then; engine default
    for key, value in tuned.items():
        if key not in explicit:
            merged[key] = value
    if "max_num_batched_tokens" not in explicit:  # the tuned budget is a default: it must fit
        merged = option_rules.BATCH_COVERS_SEQS.lift(merged)
    return merged


def use_kernel_configs(profile: TunedProfile) -> None:
    """Search ``DIR`` before every other kernel-config directory."""
    from pagoda.kernels.config import set_config_dirs

    set_config_dirs([profile.directory])


def kernel_cache_archive(profile: TunedProfile) -> tuple[Path, str | None] | None:
    """(the profile's kernel-cache archive, the digest profile.json recorded for it), or None
    when it ships none: one line says why when profile.json lists one that is not there (the
    tuning Job leaves it out of a ConfigMap it would not fit)."""
    section = profile.kernel_cache()
    path = kernel_cache_file(profile.directory)
    if path is None:
        if section.get("status") == "packed":
            log.info(
                "kernel cache: the profile lists %s but %s has no such file (too large for the "
                "ConfigMap?); its kernels compile at start", KERNEL_CACHE_FILE, profile.directory,
            )  # fmt: skip
        return None
    return path, section.get("sha256")


def describe(profile: TunedProfile, engine_kwargs: Mapping[str, Any]) -> str:
    """The start-up log line."""
    cap = profile.data.get("capacity") or {}
    return (
        f"tuned profile {profile.directory}: device {profile.device!r}, model {profile.model!r}, "
        f"dtype {profile.dtype}, created {profile.created}; max_num_seqs="
        f"{engine_kwargs.get('max_num_seqs')} max_num_batched_tokens="
        f"{engine_kwargs.get('max_num_batched_tokens')}; V_P "
        f"{cap.get('prefill_tokens_per_s')} tok/s, decode {cap.get('decode_tokens_per_s')} tok/s"
    )


def apply_tuned_profile(
    directory: str | None,
    *,
    model: str,
    engine_kwargs: Mapping[str, Any],
    mismatch: str = "error",
    shapes: Callable[[], Mapping[str, Any]] | None = None,
) -> tuple[TunedProfile | None, dict[str, Any]]:
    """(profile or None, engine arguments to use). ProfileError when it must not be served.
    `shapes`: this server's model fingerprint, computed only when a profile records one to
    compare it with. The caller logs `describe` once every other start-up check has passed."""
    kwargs = dict(engine_kwargs)
    directory = directory or os.environ.get(options.TUNED_PROFILE_ENV) or None
    if directory is None:
        return None, kwargs
    profile = check_profile(
        directory, model=model, engine_kwargs=kwargs, mismatch=mismatch, shapes=shapes
    )
    if profile is None:
        return None, kwargs
    kwargs = profile_engine_kwargs(profile, kwargs)
    use_kernel_configs(profile)
    return profile, kwargs


__all__ = [
    "ProfileError", "apply_tuned_profile", "check_profile", "describe", "kernel_cache_archive",
]  # fmt: skip
