"""The serving side: which tuned profile a service's pods mount, and how.

The autotune loop records in `status.autotune` the profile ConfigMap chosen for a service (only
when its pods can land on exactly one GPU product: one Deployment cannot mount a different
ConfigMap per node). The reconciler trusts it only if it is the name the current spec and that
product give, and only once the Job has published into it, so pods start on defaults and roll
to the profile when it lands. The runtime is told `--tuned-profile-mismatch warn`: a profile
that does not fit (say, a node relabelled by hand) serves on defaults instead of crash-looping.
"""

from __future__ import annotations

import logging
import pathlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.autotune import profiles
from pagoda.operator.autotune.keys import key_for
from pagoda.operator.kube.names import TUNED_PROFILE_ANNOTATION
from pagoda.runtime import options, tuned_profile

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

MOUNT_PATH = "/etc/pagoda/tuned"
VOLUME = "tuned-profile"
PROFILE_ANNOTATION = TUNED_PROFILE_ANNOTATION  # removed with the mount (kube/drift.py)


@dataclass(frozen=True)
class TunedMount:
    config_map: str
    data_hash: str


INVALID, MISMATCH = "InvalidProfile", "ProfileMismatch"
log = logging.getLogger(__name__)
_checked: dict[tuple[str, str], tuple[str, str] | None] = {}  # (data hash, model) → problem


def profile_problem(cm: Mapping[str, Any], model: str) -> tuple[str, str] | None:
    """Why the profile in `cm` must not be mounted for `model`, as (reason, message); None: it
    may. Serving exits 2 on a profile it cannot load (`--tuned-profile-mismatch warn` forgives
    only another setup), so the ConfigMap is checked here with serving's own loader first:
    `InvalidProfile` (unreadable, a field out of range, a bad kernel config: a hand edit, or a
    tuner of another version) or `ProfileMismatch` (measured for another model). Cached by the
    data's hash."""
    cache_key = (profiles.data_hash(cm), model)
    if cache_key not in _checked:
        if len(_checked) >= 256:
            _checked.clear()
        label = f"ConfigMap {(cm.get('metadata') or {}).get('name')}"
        try:
            _checked[cache_key] = _check(cm.get("data") or {}, model, label)
        except OSError as e:  # no writable temporary directory: the operator's problem, not
            # the profile's; mount it unchecked, as serving will check it anyway (not cached)
            log.warning("Could not check the tuned profile in %s: %s", label, e)
            return None
    return _checked[cache_key]


def _check(data: Mapping[str, Any], model: str, label: str) -> tuple[str, str] | None:
    with tempfile.TemporaryDirectory(prefix="pagoda-profile-") as tmp:
        folder = pathlib.Path(tmp)
        for name, text in data.items():
            if "/" in name or name.startswith(".") or not isinstance(text, str):
                return INVALID, f"ConfigMap key {name!r} is not a profile file"
            (folder / name).write_text(text, encoding="utf-8")
        try:
            profile = tuned_profile.load_profile(folder)
        except tuned_profile.ProfileError as e:
            return INVALID, str(e).replace(str(folder), label)
    want, have = tuned_profile.normalize_model(model), tuned_profile.normalize_model(profile.model)
    if have != want:
        return (
            MISMATCH,
            f"the profile was measured for model {have!r}, this service serves {want!r}",
        )
    return None


def chosen_profile(body: Mapping[str, Any], spec: InferenceServiceSpec) -> str | None:
    """The profile ConfigMap status.autotune names, if it is the one this spec's key gives."""
    if not spec.autotune.enabled:
        return None
    st = (body.get("status") or {}).get("autotune") or {}
    product, name = st.get("product"), st.get("profile")
    if not isinstance(product, str) or not isinstance(name, str):
        return None
    return name if key_for(spec, product).profile_name == name else None


async def lookup(
    api: Any, body: Mapping[str, Any], spec: InferenceServiceSpec
) -> TunedMount | None:
    """The profile to mount now (None: serve on defaults)."""
    cm = await _usable_profile(api, body, spec)
    return None if cm is None else TunedMount(cm["metadata"]["name"], profiles.data_hash(cm))


async def _usable_profile(
    api: Any, body: Mapping[str, Any], spec: InferenceServiceSpec
) -> Mapping[str, Any] | None:
    """The profile ConfigMap this service mounts, None when it mounts none: not chosen, not
    published, or one serving could not use (status.autotune says why)."""
    name = chosen_profile(body, spec)
    if name is None:
        return None
    cm = await api.get("ConfigMap", body["metadata"]["namespace"], name)
    if cm is None or not profiles.is_tuned(cm) or not profiles.is_profile(cm):
        return None
    return None if profile_problem(cm, spec.model.server_arg) else cm


async def tuned_rates(
    api: Any, body: Mapping[str, Any], spec: InferenceServiceSpec
) -> tuple[float | None, float | None]:
    """V_P and V_D (`capacity.prefill_tokens_per_s`, `capacity.decode_tokens_per_s`) of the
    profile this service mounts: the autoscaler's predictive floors. None for each one it lacks
    (no profile: both)."""
    cm = await _usable_profile(api, body, spec)  # only a mounted profile's numbers
    if cm is None:
        return None, None
    cap = profiles.capacity(cm)

    def rate(key: str) -> float | None:
        v = cap.get(key)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
        return float(v) if ok else None

    return rate("prefill_tokens_per_s"), rate("decode_tokens_per_s")


def mount_profile(deployment: dict[str, Any], tuned: TunedMount) -> dict[str, Any]:
    """Add the profile volume, mount, flags and a pod-template annotation (a new profile rolls)."""
    template = deployment["spec"]["template"]
    pod = template["spec"]
    pod["volumes"] = [*pod["volumes"], {"name": VOLUME, "configMap": {"name": tuned.config_map}}]
    container = pod["containers"][0]
    container["volumeMounts"] = [
        *container["volumeMounts"],
        {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True},
    ]
    container["args"] = [
        *container["args"],
        *options.render_args({"tuned_profile": MOUNT_PATH, "tuned_profile_mismatch": "warn"}),
    ]
    annotations = template["metadata"]["annotations"]
    annotations[PROFILE_ANNOTATION] = f"{tuned.config_map}@{tuned.data_hash}"
    return deployment
