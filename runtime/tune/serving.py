"""`pagoda serve --tuned-profile DIR`: check the profile fits this server, then apply it.

Applying means two things: ``DIR/configs`` goes first in ``$PAGODA_KERNEL_CONFIG_DIR`` (kernel
launch configs), and the profile's ``max_num_batched_tokens``/``max_num_seqs`` become the engine
arguments unless a flag set them (those flags default to None, so an explicit `--max-num-seqs 64`
wins over the profile even though 64 is also the engine's default).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import EngineConfig
from pagoda.runtime.options import TUNED_PROFILE_ENV
from pagoda.runtime.server.config import ServerConfig
from pagoda.runtime.tune.profile import (
    ProfileError,
    TunedProfile,
    device_identity,
    load_profile,
)

log = logging.getLogger("pagoda.serve")


def check_profile(
    directory: str, *, model: str, engine_args: Mapping[str, Any], mismatch: str = "error"
) -> TunedProfile | None:
    """The profile when it was measured for this device/model/dtype.

    Otherwise ProfileError naming every difference (``mismatch="error"``), or None after a
    warning (``"warn"``: the server runs on its defaults). A missing or malformed profile is
    always an error: the operator mounted something, and serving silently without it would hide
    that.
    """
    if mismatch not in ("error", "warn"):
        raise ValueError(f"tuned-profile-mismatch must be error or warn, got {mismatch!r}")
    profile = load_profile(directory)
    cfg = EngineConfig.create(model, **engine_args)
    problems = profile.mismatches(
        device=device_identity(cfg.torch_device()),
        model=model,
        dtype=str(cfg.torch_dtype()).removeprefix("torch."),
    )
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


def profile_engine_args(profile: TunedProfile, engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments with the profile's scheduler knobs under the flags the user set (the
    scheduler flags default to None, so a value present here was given on the command line)."""
    merged = dict(engine_args)
    tuned = profile.scheduler_args()
    explicit = {k for k, v in engine_args.items() if v is not None}
    if merged.get("enable_chunked_prefill") is False:
        tuned.pop("max_num_batched_tokens", None)  # must cover max_model_len then; engine default
    for key, value in tuned.items():
        if key not in explicit:
            merged[key] = value
    seqs, tokens = merged.get("max_num_seqs"), merged.get("max_num_batched_tokens")
    if "max_num_batched_tokens" not in explicit and seqs and tokens and tokens < seqs:
        merged["max_num_batched_tokens"] = seqs  # a larger explicit batch needs the budget
    return merged


def use_kernel_configs(profile: TunedProfile) -> None:
    """Search ``DIR/configs``, then ``DIR`` itself, before every other kernel-config directory.

    ``DIR`` itself covers a flat copy of the profile, e.g. a ConfigMap mounted as a volume, whose
    keys cannot hold a ``/``: ``profile.json`` next to ``<Device>.json``.
    """
    from pagoda.kernels.config import CONFIG_DIR_ENV, clear_config_cache

    ours = [str(profile.configs_dir), str(profile.directory)]
    rest = [p for p in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if p and p not in ours]
    os.environ[CONFIG_DIR_ENV] = os.pathsep.join([*ours, *rest])
    clear_config_cache()


def describe(profile: TunedProfile, engine_args: Mapping[str, Any]) -> str:
    """The start-up log line."""
    cap = profile.data.get("capacity") or {}
    return (
        f"tuned profile {profile.directory}: device {profile.device!r}, model {profile.model!r}, "
        f"dtype {profile.dtype}, created {profile.created}; max_num_seqs="
        f"{engine_args.get('max_num_seqs')} max_num_batched_tokens="
        f"{engine_args.get('max_num_batched_tokens')}; V_P "
        f"{cap.get('prefill_tokens_per_s')} tok/s, decode {cap.get('decode_tokens_per_s')} tok/s"
    )


def apply_tuned_profile(
    directory: str | None,
    *,
    model: str,
    engine_args: Mapping[str, Any],
    mismatch: str = "error",
) -> tuple[TunedProfile | None, dict[str, Any]]:
    """(profile or None, engine arguments to use). ProfileError when it must not be served."""
    args = dict(engine_args)
    directory = directory or os.environ.get(TUNED_PROFILE_ENV) or None
    if directory is None:
        return None, args
    profile = check_profile(directory, model=model, engine_args=args, mismatch=mismatch)
    if profile is None:
        return None, args
    args = profile_engine_args(profile, args)
    use_kernel_configs(profile)
    log.info("%s", describe(profile, args))
    return profile, args


def apply_to_server_config(
    cfg: ServerConfig, directory: str | None, mismatch: str = "error"
) -> tuple[ServerConfig, TunedProfile | None]:
    """`pagoda serve`'s hook: the ServerConfig with the profile's engine arguments applied."""
    profile, args = apply_tuned_profile(
        directory,
        model=cfg.model,
        engine_args=cfg.engine_args,
        mismatch=mismatch,
    )
    if profile is None:
        return cfg, None
    return dataclasses.replace(cfg, engine_args=args), profile


__all__ = ["ProfileError", "apply_to_server_config", "apply_tuned_profile", "check_profile"]
