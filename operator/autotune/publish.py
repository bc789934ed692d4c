"""`pagoda publish-profile --dir DIR --configmap NS/NAME`: the tuning Job's hand-back.

Reads the profile `pagoda tune` wrote (validated with the runtime's own torch-free loader,
`pagoda.runtime.tuned_profile`: the folder's files are the ConfigMap's keys as they are) and
writes them into the one ConfigMap the operator pre-created, with a merge patch: the Job's Role allows only `get`
and `patch` on that name. Logs in like the operator (service account, else kubeconfig).

The profile's compiled Triton kernels (``triton-cache.tar.xz``, binary) go in ``binaryData``
when the whole still fits a ConfigMap; otherwise the profile is published without them, with one
line saying so (serving then compiles its kernels at start, as without a kernel cache).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import pathlib
import sys
from typing import Any

from pagoda.operator.autotune.profiles import KEY_ANNOTATION, PUBLISHED_ANNOTATION
from pagoda.operator.kube.names import now_iso
from pagoda.runtime import tuned_profile

DESCRIPTION = "Write a tuned profile into its ConfigMap (run by the operator's tuning Job)."


class PublishError(Exception):
    """The profile cannot be published (missing, invalid, too large, wrong target)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, help="directory written by `pagoda tune --output`")
    p.add_argument("--configmap", required=True, metavar="NS/NAME", help="the profile ConfigMap")


def profile_data(directory: str | pathlib.Path) -> dict[str, str]:
    """`{"profile.json": ..., "<Device>.json": ...}` from a `pagoda tune` output directory."""
    try:
        return tuned_profile.profile_files(directory)
    except tuned_profile.ProfileError as e:
        raise PublishError(str(e)) from e


def binary_data(
    directory: str | pathlib.Path, data: dict[str, str]
) -> tuple[dict[str, str], str | None]:
    """``binaryData`` (base64) for the profile's kernel-cache archive beside ``data``: empty
    and a one-line note when there is none, or when it would not fit the ConfigMap."""
    path = tuned_profile.kernel_cache_file(directory)
    if path is None:
        return {}, None
    raw = path.read_bytes()
    name = tuned_profile.KERNEL_CACHE_FILE
    size = tuned_profile.profile_size(data, {name: raw})
    if size > tuned_profile.MAX_BYTES:
        return {}, (
            f"kernel cache {name} left out: the profile with it is {size} bytes (base64), a "
            f"ConfigMap holds at most {tuned_profile.MAX_BYTES}; serving compiles its kernels"
        )
    return {name: base64.b64encode(raw).decode()}, None


def split_target(target: str) -> tuple[str, str]:
    namespace, _, name = target.partition("/")
    if not namespace or not name or "/" in name:
        raise PublishError(f"--configmap must be NAMESPACE/NAME, got {target!r}")
    return namespace, name


async def publish(
    api: Any, namespace: str, name: str, data: dict[str, str], binary: dict[str, str] | None = None
) -> dict[str, Any]:
    """Patch the pre-created ConfigMap (never create one: the Job may only patch this name).
    A kernel cache left out removes one a previous profile may have published."""
    current = await api.get("ConfigMap", namespace, name)
    if current is None:
        raise PublishError(f"ConfigMap {namespace}/{name} does not exist (the operator makes it)")
    if KEY_ANNOTATION not in ((current.get("metadata") or {}).get("annotations") or {}):
        raise PublishError(f"ConfigMap {namespace}/{name} is not a tuned-profile ConfigMap")
    patch = {
        "data": data,
        "binaryData": binary or {tuned_profile.KERNEL_CACHE_FILE: None},
        "metadata": {"annotations": {PUBLISHED_ANNOTATION: now_iso()}},
    }
    return await api.patch("ConfigMap", namespace, name, patch)


async def _main(directory: str, target: str) -> None:
    from pagoda.operator.kube.client import KubeApi

    namespace, name = split_target(target)
    data = profile_data(directory)
    binary, note = binary_data(directory, data)
    if note:
        print(f"pagoda publish-profile: {note}", file=sys.stderr)
    api = KubeApi(user_agent="pagoda-publish-profile/0.1")
    try:
        await publish(api, namespace, name, data, binary)
    finally:
        await api.close()
    print(f"published {len(data) + len(binary)} files to ConfigMap {namespace}/{name}")


def run(args: argparse.Namespace) -> int:
    from pagoda.operator.kube.client import ApiError

    try:
        asyncio.run(_main(args.dir, args.configmap))
    except (PublishError, ApiError) as e:
        print(f"pagoda publish-profile: error: {e}", file=sys.stderr)
        return 2
    return 0
