"""The tuned profile: one flat folder, the same on disk and in the operator's ConfigMap.

Layout (every file name is also a valid ConfigMap key, so the operator's tuning Job copies the
folder into a ConfigMap as it is, and the pod mounts that ConfigMap back as the same folder)::

    DIR/profile.json        who it was measured for (device, model, dtype), the measured
                            curves, and the scheduler knobs chosen from them
    DIR/<Device>.json       kernel launch configs in the format `pagoda.kernels.config` reads
                            (`save_kernel_config`); serving puts DIR first on its search path
    DIR/triton-cache.tar.xz (CUDA) the Triton kernels serving's warm-up compiles, compiled
                            (`pagoda.runtime.kernel_cache`); serving installs them before its
                            warm-up. Binary: the ConfigMap carries it in ``binaryData``, or not
                            at all when the whole would not fit (serving then compiles)

Torch-free (the operator image has no torch): `pagoda tune` writes profiles with this module,
`pagoda publish-profile` (operator) reads them, and `pagoda serve --tuned-profile` loads them.
Fields are documented in docs/runtime.md ("Tuning"); ``SCHEMA_VERSION`` changes only when a
field changes meaning.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagoda.runtime.option_rules import SIZE_LIMITS, check_int

if TYPE_CHECKING:
    import torch

SCHEMA_VERSION = 1
PROFILE_FILE = "profile.json"
IDENTITY_KEYS = ("device", "model", "dtype")
SCHEDULER_KEYS = ("max_num_batched_tokens", "max_num_seqs")  # what serving applies
MAX_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB, metadata included
MAX_DEPTH = 32  # profile.json nests 4 deep
MAX_NAME_CHARS = 4096  # device, model (a path), dtype, created
_FILE_NAME = re.compile(r"^[-._a-zA-Z0-9]+\.json$")  # a ConfigMap key, and a kernel-config name
KERNEL_CACHE_FILE = "triton-cache.tar.xz"  # profile.json's `kernel_cache` describes it
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # model_commit: an hf:// model's git commit
_OLD_CONFIGS_DIR = "configs"  # where kernel configs were before the layout was flat
FINGERPRINT_FIELD = "shape_fingerprint"  # the measured model's dimensions (optional: older tuners)
MAX_FINGERPRINT_KEYS = 64
MAX_DIMENSION = 1 << 40


class ProfileError(ValueError):
    """A profile that cannot be used: missing, unreadable, or measured for something else."""


@functools.lru_cache(maxsize=1)
def cpu_model_name() -> str:
    """``model name`` from /proc/cpuinfo (the CPU a profile was measured on)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_identity(device: torch.device) -> str:
    """What a profile is bound to: the GPU product name, or ``cpu: <CPU model>``."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_model_name()}"


def normalize_model(model: str) -> str:
    """``/models/llama/`` and ``/models/llama`` name the same model."""
    return model.rstrip("/") or model


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def versions() -> dict[str, str | None]:
    """Software a profile was measured with (a new Triton or torch may want a re-tune)."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "pagoda": version("pagoda"),
        "torch": version("torch"),
        "triton": version("triton"),
        "python": sys.version.split()[0],
    }


@dataclass(frozen=True)
class TunedProfile:
    """A loaded, validated profile; ``data`` is the whole ``profile.json``."""

    directory: Path
    data: dict[str, Any]

    def __post_init__(self) -> None:
        validate(self.data, self.directory / PROFILE_FILE)

    @property
    def device(self) -> str:
        return self.data["device"]

    @property
    def model(self) -> str:
        return self.data["model"]

    @property
    def dtype(self) -> str:
        return self.data["dtype"]

    @property
    def created(self) -> str:
        return self.data["created"]

    @property
    def model_commit(self) -> str | None:
        """The commit of an hf:// model the profile was measured on (None: not recorded, or not
        an hf:// model). Provenance, not identity: another commit of the same model with the
        same `shape_fingerprint` fits (the kernel configs and knobs depend on shapes)."""
        return self.data.get("model_commit")

    @property
    def shape_fingerprint(self) -> dict[str, Any] | None:
        """The measured model's dimensions (`pagoda.runtime.model.shape_fingerprint`); None in a
        profile of an older `pagoda tune`, which serving accepts on the identity alone."""
        return self.data.get(FINGERPRINT_FIELD)

    def shape_mismatches(self, shapes: Mapping[str, Any] | None) -> list[str]:
        """Readable differences between the measured model's fingerprint and `shapes` (this
        server's model; `fingerprint_mismatches`)."""
        return fingerprint_mismatches(self.shape_fingerprint, shapes)

    def commit_note(self, serving: str | None, shapes_checked: bool = False) -> str | None:
        """One line when the server reads another commit of the model than the one measured
        (`shapes_checked`: its fingerprint was compared with this profile's and is the same)."""
        measured = self.model_commit
        if not measured or not serving or measured == serving:
            return None
        head = (
            f"tuned profile {self.directory} was measured on commit {measured[:12]} of "
            f"{self.model}, this server reads commit {serving[:12]}: using it"
        )
        if shapes_checked and self.shape_fingerprint:
            return f"{head} (same shape fingerprint: the kernel configs and knobs fit)"
        return (
            f"{head} (the profile has no shape fingerprint, from an older `pagoda tune`: kernel "
            "configs and scheduler knobs depend on the model's shapes, not its weights; re-run "
            "`pagoda tune` if the new commit changed the architecture)"
        )

    def kernel_cache(self) -> dict[str, Any]:
        """``profile.json``'s ``kernel_cache`` section ({} when the tuner wrote none)."""
        return self.data.get("kernel_cache") or {}

    def scheduler_args(self) -> dict[str, int]:
        """The engine keyword arguments the profile chose (empty if it chose none)."""
        sched = self.data.get("scheduler") or {}
        return {k: sched[k] for k in SCHEDULER_KEYS if k in sched}  # checked by `validate`

    def mismatches(
        self, *, device: str, model: str, dtype: str, shapes: Mapping[str, Any] | None = None
    ) -> list[str]:
        """Readable differences between this profile and the engine about to use it (`shapes`:
        its model's fingerprint, compared when both have one)."""
        want = {"device": device, "model": normalize_model(model), "dtype": dtype}
        have = {**{k: self.data[k] for k in IDENTITY_KEYS}, "model": normalize_model(self.model)}
        return [
            f"{key} {have[key]!r} (profile) != {want[key]!r} (this server)"
            for key in IDENTITY_KEYS
            if have[key] != want[key]
        ] + self.shape_mismatches(shapes)


def fingerprint_mismatches(
    have: Mapping[str, Any] | None, want: Mapping[str, Any] | None
) -> list[str]:
    """``key A (profile) != B (this model)`` for each dimension of the profile's fingerprint
    (`have`) that the model's (`want`) gives another value: only the keys both have (an older or
    newer tuner may record fewer or more); none when either is unknown."""
    if not have or not want:
        return []
    return [
        f"{key} {have[key]!r} (profile) != {want[key]!r} (this model)"
        for key in have
        if key in want and have[key] != want[key]
    ]


def validate(data: Any, where: Path | str) -> None:
    """Raise ProfileError naming the file and the first field that is missing, of the wrong
    type or out of range (what serving reads; other fields are the tuner's report)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # not `true`, not 1.0
        raise ProfileError(
            f"{where}: schema_version {_show(version)} is not {SCHEMA_VERSION}; "
            "re-run `pagoda tune --force`"
        )
    for key in (*IDENTITY_KEYS, "created"):
        value = data.get(key)
        if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
            raise ProfileError(f"{where}: field {key!r} must be a non-empty string of at most "
                               f"{MAX_NAME_CHARS} characters, got {_show(value)}")  # fmt: skip
    for key in ("engine", "scheduler", "capacity", "kernels", "kernel_cache"):
        if key in data and not isinstance(data[key], dict):
            raise ProfileError(f"{where}: field {key!r} must be an object, got "
                               f"{_show(data[key])}")  # fmt: skip
    commit = data.get("model_commit")
    if commit is not None and not (isinstance(commit, str) and _COMMIT.match(commit)):
        raise ProfileError(f"{where}: field 'model_commit' must be a 40-hex-digit commit, got "
                           f"{_show(commit)}")  # fmt: skip
    validate_fingerprint(data.get(FINGERPRINT_FIELD), where)
    digest = (data.get("kernel_cache") or {}).get("sha256")
    if digest is not None and not (isinstance(digest, str) and _SHA256.match(digest)):
        raise ProfileError(f"{where}: kernel_cache.sha256 must be 64 hex digits, got "
                           f"{_show(digest)}")  # fmt: skip
    scheduler = data.get("scheduler") or {}
    for key in SCHEDULER_KEYS:
        if key in scheduler:
            try:
                check_int(f"scheduler.{key}", scheduler[key], 1, SIZE_LIMITS[key])
            except ValueError as e:
                raise ProfileError(f"{where}: {e}") from e
    for key, value in (data.get("capacity") or {}).items():
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        # `1e999` parses as infinity: the autoscaler would read an infinite rate as no floor
        if value is not None and not (number and 0 <= value < float("inf")):
            raise ProfileError(f"{where}: capacity.{key} must be a finite number >= 0, got "
                               f"{_show(value)}")  # fmt: skip


def validate_fingerprint(shapes: Any, where: Path | str) -> None:
    """``shape_fingerprint``: absent, or an object of dimensions (integers >= 0) and short names
    (``quantization``)."""
    if shapes is None:
        return
    if not isinstance(shapes, dict) or not 0 < len(shapes) <= MAX_FINGERPRINT_KEYS:
        raise ProfileError(f"{where}: field {FINGERPRINT_FIELD!r} must be an object of at most "
                           f"{MAX_FINGERPRINT_KEYS} dimensions, got {_show(shapes)}")  # fmt: skip
    for key, value in shapes.items():
        dimension = type(value) is int and 0 <= value <= MAX_DIMENSION
        name = isinstance(value, str) and 0 < len(value) <= 64
        if len(key) > 64 or not (dimension or name):
            raise ProfileError(f"{where}: {FINGERPRINT_FIELD}.{key[:64]} must be an integer "
                               f">= 0 or a short name, got {_show(value)}")  # fmt: skip


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON at ``path`` or None when there is no file; ProfileError (naming the file) for
    anything a broken or hostile file can do: too large, not UTF-8, nested thousands deep,
    truncated, unreadable."""
    from pagoda.kernels.config_schema import read_json_file

    if not path.exists():
        return None
    if not path.is_file():
        raise ProfileError(f"{path}: not a regular file")
    data = read_json_file(path, MAX_BYTES, MAX_DEPTH, ProfileError)
    if not isinstance(data, dict):  # `null` too: not taken for a missing file
        raise ProfileError(f"{path}: expected a JSON object, got {_show(data)}")
    return data


def check_layout(folder: Path) -> None:
    """Refuse a folder in the old layout (kernel configs in ``configs/``): serving would
    silently run without its tuned kernels."""
    old = folder / _OLD_CONFIGS_DIR
    if old.is_dir() and any(old.glob("*.json")):
        raise ProfileError(
            f"tuned profile {folder}: kernel configs in {old}/ are the layout of an older "
            f"`pagoda tune`; move them up into {folder} or re-run `pagoda tune --force`"
        )


def load_profile(directory: str | os.PathLike[str]) -> TunedProfile:
    """Load and validate ``DIR/profile.json`` and the kernel configs beside it; ProfileError
    names the file and the field that is wrong."""
    folder = Path(directory)
    try:
        if folder.exists() and not folder.is_dir():
            hint = (
                f"; give the folder `pagoda tune --output` wrote ({folder.parent})"
                if folder.name == PROFILE_FILE
                else ""
            )
            raise ProfileError(f"tuned profile {folder}: not a directory{hint}")
        if not folder.is_dir():
            raise ProfileError(f"tuned profile {folder}: no such directory")
        check_layout(folder)
        data = read_json(folder / PROFILE_FILE)
        if data is None:
            raise ProfileError(
                f"tuned profile {folder}: no {PROFILE_FILE} (run `pagoda tune` first)"
            )
        profile = TunedProfile(folder, data)
        check_kernel_configs(folder)
    except OSError as e:  # a folder we may not list, a file that vanished meanwhile
        raise ProfileError(f"tuned profile {folder}: {e.strerror or e}") from e
    return profile


def check_kernel_configs(folder: Path) -> None:
    """Every kernel-config file of a profile, read as serving would (known kernels, parameters
    in range, the file named for its device); ProfileError naming the file and the field."""
    from pagoda.kernels.config_schema import KernelConfigError, read_config_file

    for path in kernel_config_files(folder):
        try:
            read_config_file(path, max_bytes=MAX_BYTES)
        except KernelConfigError as e:
            raise ProfileError(f"tuned profile: {e}") from e


def kernel_config_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The kernel-config files of a profile folder (every ``*.json`` but ``profile.json``; not
    hidden files such as a write in progress)."""
    found = Path(directory).glob("*.json")
    return sorted(p for p in found if p.name != PROFILE_FILE and p.name[0] != "." and p.is_file())


def profile_files(directory: str | os.PathLike[str]) -> dict[str, str]:
    """``{file name: text}`` of a valid profile folder: the ConfigMap's ``data`` as it is.

    ProfileError when the profile is invalid, a file name cannot be a ConfigMap key, a kernel
    config is not JSON, or the whole does not fit in a ConfigMap.
    """
    folder = Path(directory)
    load_profile(folder)  # profile.json and every kernel config validated
    files = {PROFILE_FILE: (folder / PROFILE_FILE).read_text()}
    for path in kernel_config_files(folder):
        if not _FILE_NAME.match(path.name):
            raise ProfileError(f"{path.name!r} cannot be a ConfigMap key")
        files[path.name] = path.read_text()
    size = profile_size(files)
    if size > MAX_BYTES:
        raise ProfileError(f"the profile is {size} bytes; a ConfigMap holds at most {MAX_BYTES}")
    return files


def kernel_cache_file(directory: str | os.PathLike[str]) -> Path | None:
    """The profile folder's kernel-cache archive (None when it has none)."""
    path = Path(directory) / KERNEL_CACHE_FILE
    return path if path.is_file() else None


def profile_size(files: dict[str, str], binary: dict[str, bytes] | None = None) -> int:
    """Bytes the ConfigMap's ``data`` and ``binaryData`` (base64) take, keys included."""
    text = sum(len(k) + len(v.encode()) for k, v in files.items())
    return text + sum(len(k) + 4 * -(-len(v) // 3) for k, v in (binary or {}).items())


def remove_profile(directory: Path) -> None:
    """Delete ``profile.json``, the kernel configs and the kernel cache (``pagoda tune --force``)."""
    (directory / PROFILE_FILE).unlink(missing_ok=True)
    (directory / KERNEL_CACHE_FILE).unlink(missing_ok=True)
    for path in kernel_config_files(directory):
        path.unlink()
    shutil.rmtree(directory / _OLD_CONFIGS_DIR, ignore_errors=True)


def write_profile(directory: Path, data: dict[str, Any]) -> Path:
    """Write ``profile.json`` atomically (a server starting meanwhile never reads half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / PROFILE_FILE
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)
    return path
