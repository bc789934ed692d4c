"""hf:// and s3:// LoRA adapters (spec.adapters) in a pod: one `adapter-download` init container
fetches them all with `pagoda download` into the model cache (children/model_cache.py: the same
volume, Secret, env and termination message as the model's), and links each one's directory to
a stable path, `ADAPTERS_MOUNT/NAME`, in the pod's own `adapters` emptyDir: an hf:// download
lands in `models--ORG--NAME/snapshots/COMMIT`, whose commit is known only once fetched, so the
server's `--lora-modules NAME=ADAPTERS_MOUNT/NAME` (children/serve_args.py) cannot name it up
front. The links are per pod, so services sharing a cache claim never see each other's.

Adapters on spec.model's claim or in the image need nothing here. Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagoda.operator.children.model_cache import (
    INIT_CONTAINER,
    VOLUME,
    add_cache_readers,
    cache_volume,
    download_container,
)
from pagoda.operator.kube.names import ADAPTERS_MOUNT, MODEL_CACHE_MOUNT

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

LINKS_VOLUME = "adapters"
ADAPTER_CONTAINER = "adapter-download"
# $1: the cache, $2: the links' folder, then NAME URI pairs. `pagoda download` prints the local
# path on stdout; a failure exits 2 and leaves its termination message (set -e passes it on).
# Backquotes, not $(...): the kubelet expands $(VAR) in a container's command.
SCRIPT = """set -eu
cache=$1; links=$2; shift 2
while [ $# -gt 1 ]; do
  path=`pagoda download --model "$2" --download-dir "$cache"{limit}`
  ln -sfn "$path" "$links/$1"
  shift 2
done
"""


def adapter_download_args(spec: InferenceServiceSpec) -> list[str]:
    """The script's arguments: $0, the cache, the links' folder, NAME URI per remote adapter."""
    pairs = [w for a in spec.adapters if a.remote for w in (a.name, a.source.uri)]
    return [ADAPTER_CONTAINER, MODEL_CACHE_MOUNT, ADAPTERS_MOUNT, *pairs]


def adapter_container(spec: InferenceServiceSpec) -> dict[str, Any]:
    limit = spec.model_cache.size_limit_bytes
    script = SCRIPT.format(limit=f" --download-size-limit {limit}" if limit else "")
    container = download_container(
        spec, ADAPTER_CONTAINER, ("sh", "-c", script), adapter_download_args(spec)
    )
    container["volumeMounts"].append({"name": LINKS_VOLUME, "mountPath": ADAPTERS_MOUNT})
    return container


def add_adapter_download(
    pod_spec: dict[str, Any], spec: InferenceServiceSpec, readers: tuple[str, ...]
) -> None:
    """For hf:// or s3:// adapters: the cache volume (unless the model's download added it), the
    links' emptyDir, the `adapter-download` init container (after `model-download`, before any
    other), and to the containers in `readers` the cache read-only and the links. Nothing
    otherwise."""
    if not any(a.remote for a in spec.adapters):
        return
    volumes = pod_spec.setdefault("volumes", [])
    if not any(v["name"] == VOLUME for v in volumes):
        volumes.append(cache_volume(spec))
        new_readers = readers  # the model's download has not mounted the cache for them
    else:
        new_readers = ()
    volumes.append({"name": LINKS_VOLUME, "emptyDir": {}})
    init = pod_spec.get("initContainers", [])
    first = 1 if init and init[0]["name"] == INIT_CONTAINER else 0
    pod_spec["initContainers"] = [*init[:first], adapter_container(spec), *init[first:]]
    add_cache_readers(pod_spec, new_readers)
    for container in (*pod_spec["initContainers"], *pod_spec.get("containers", [])):
        if container["name"] in readers:
            container.setdefault("volumeMounts", []).append(
                {"name": LINKS_VOLUME, "mountPath": ADAPTERS_MOUNT, "readOnly": True}
            )
