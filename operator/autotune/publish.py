"""`pagoda publish-profile --dir DIR --configmap NS/NAME`: the tuning Job's hand-back.

Reads the profile `pagoda tune` wrote (validated with the runtime's own loader), flattens it into
ConfigMap keys (`profile.json` and `<Device>.json`: `pagoda serve --tuned-profile` searches the
directory itself for kernel configs, and ConfigMap keys cannot hold `/`) and writes them into the
one ConfigMap the operator pre-created, with a merge patch: the Job's Role allows only `get`
and `patch` on that name. Logs in like the operator (service account, else kubeconfig).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import re
import sys
from typing import Any

from pagoda.operator.autotune.profiles import KEY_ANNOTATION, PROFILE_KEY, PUBLISHED_ANNOTATION
from pagoda.operator.names import now_iso

DESCRIPTION = "Write a tuned profile into its ConfigMap (run by the operator's tuning Job)."
MAX_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB, metadata included
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


class PublishError(Exception):
    """The profile cannot be published (missing, invalid, too large, wrong target)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, help="directory written by `pagoda tune --output`")
    p.add_argument("--configmap", required=True, metavar="NS/NAME", help="the profile ConfigMap")


def profile_data(directory: str | pathlib.Path) -> dict[str, str]:
    """`{"profile.json": ..., "<Device>.json": ...}` from a `pagoda tune` output directory."""
    from pagoda.runtime.tune.profile import CONFIGS_DIR, ProfileError, load_profile

    folder = pathlib.Path(directory)
    try:
        load_profile(folder)
    except ProfileError as e:
        raise PublishError(str(e)) from e
    data = {PROFILE_KEY: (folder / PROFILE_KEY).read_text()}
    configs = folder / CONFIGS_DIR
    for path in sorted(configs.glob("*.json")) if configs.is_dir() else []:
        if not _KEY.match(path.name) or path.name == PROFILE_KEY:
            raise PublishError(f"{path.name!r} cannot be a ConfigMap key")
        json.loads(path.read_text())  # only valid JSON goes out
        data[path.name] = path.read_text()
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    if size > MAX_BYTES:
        raise PublishError(f"the profile is {size} bytes; a ConfigMap holds at most {MAX_BYTES}")
    return data


def split_target(target: str) -> tuple[str, str]:
    namespace, _, name = target.partition("/")
    if not namespace or not name or "/" in name:
        raise PublishError(f"--configmap must be NAMESPACE/NAME, got {target!r}")
    return namespace, name


async def publish(api: Any, namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    """Patch the pre-created ConfigMap (never create one: the Job may only patch this name)."""
    current = await api.get("ConfigMap", namespace, name)
    if current is None:
        raise PublishError(f"ConfigMap {namespace}/{name} does not exist (the operator makes it)")
    if KEY_ANNOTATION not in ((current.get("metadata") or {}).get("annotations") or {}):
        raise PublishError(f"ConfigMap {namespace}/{name} is not a tuned-profile ConfigMap")
    patch = {"data": data, "metadata": {"annotations": {PUBLISHED_ANNOTATION: now_iso()}}}
    return await api.patch("ConfigMap", namespace, name, patch)


async def _main(directory: str, target: str) -> None:
    from pagoda.operator.k8s import KubeApi

    namespace, name = split_target(target)
    data = profile_data(directory)
    api = KubeApi(user_agent="pagoda-publish-profile/0.1")
    try:
        await publish(api, namespace, name, data)
    finally:
        await api.close()
    print(f"published {len(data)} files to ConfigMap {namespace}/{name}")


def run(args: argparse.Namespace) -> int:
    from pagoda.operator.k8s import ApiError

    try:
        asyncio.run(_main(args.dir, args.configmap))
    except (PublishError, ApiError) as e:
        print(f"pagoda publish-profile: error: {e}", file=sys.stderr)
        return 2
    return 0
