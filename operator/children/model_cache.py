"""hf:// and s3:// models in a pod: the model-cache volume, the `model-download` init container
that fills it, and what the containers that read it need. Pure; shared by every pod template
that serves or tunes a remote model (the Deployment today, a LeaderWorkerSet's templates or the
tuning Job alike) through `add_model_download`.

* the volume `model-cache`: `spec.modelCache.claimName`'s PersistentVolumeClaim (shared by the
  replicas: a scale-up finds the model there), else an emptyDir (`sizeLimit` when set);
* the init container `model-download`: the runtime image's `pagoda download --model URI
  --download-dir /var/cache/pagoda/models` (the only container that reaches the network and gets
  `spec.modelSecretRef`'s keys: HF_TOKEN, AWS_* ...). Its failure leaves
  `ModelDownloadFailed/<Detail>: ...` in its termination message, which the operator turns into
  a condition (reconcile/pods.py);
* the readers: the volume mounted read-only at the same path, `HF_HUB_OFFLINE=1` and
  `PAGODA_DOWNLOAD_DIR`, so `pagoda serve --model URI --download-dir ...` (and `pagoda tune
  --model URI --download-dir ...`) only look into the cache;
* hf:// and s3:// LoRA adapters (spec.adapters, `add_adapter_download`): one `adapter-download`
  init container fetches them all the same way and links each one's directory to a stable path,
  `ADAPTERS_MOUNT/NAME`, in the pod's own `adapters` emptyDir. An hf:// download lands in
  `models--ORG--NAME/snapshots/COMMIT`, whose commit is known only once fetched, so the server's
  `--lora-modules NAME=ADAPTERS_MOUNT/NAME` (children/serve_args.py) cannot name it up front; the
  links are per pod, so services sharing a cache claim never see each other's. Adapters on
  spec.model's claim or in the image need nothing here;
* an hf:// or s3:// draft model (spec.engine.speculative.model, `add_draft_download`): the
  `draft-download` init container, the adapters' script, one link `DRAFT_MOUNT/model` in the
  pod's `draft-model` emptyDir, which the server's `--speculative-config` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.names import (
    ADAPTERS_MOUNT,
    DRAFT_LINK,
    DRAFT_MOUNT,
    MODEL_CACHE_MOUNT,
    cache_env,
    container_security,
)

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

VOLUME = "model-cache"
INIT_CONTAINER = "model-download"
OFFLINE_ENV = {"name": "HF_HUB_OFFLINE", "value": "1"}
DOWNLOAD_DIR_ENV = "PAGODA_DOWNLOAD_DIR"  # the default of --download-dir, for any other reader
TERMINATION_LOG = "/dev/termination-log"  # the kubelet's default terminationMessagePath


def cache_volume(spec: InferenceServiceSpec) -> dict[str, Any]:
    cache = spec.model_cache
    if cache.claim_name:
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}}
    return {"name": VOLUME, "emptyDir": {"sizeLimit": cache.size_limit} if cache.size_limit else {}}


def download_args(spec: InferenceServiceSpec) -> list[str]:
    args = ["--model", spec.model.uri, "--download-dir", MODEL_CACHE_MOUNT]
    if spec.model.commit:  # every replica fetches the commit the operator pinned
        args += ["--revision", spec.model.commit]
    if spec.model_cache.prune:  # the repo's other snapshots that no running pod holds
        args.append("--prune")
    if spec.model_cache.size_limit_bytes:
        args += ["--download-size-limit", str(spec.model_cache.size_limit_bytes)]
    return args


def download_container(
    spec: InferenceServiceSpec,
    name: str = INIT_CONTAINER,
    command: tuple[str, ...] = ("pagoda", "download"),
    args: list[str] | None = None,
) -> dict[str, Any]:
    """The init container that downloads the model (or finds it in a shared cache); with
    `name`, `command` and `args`, another one alike (`links_container`)."""
    user = [dict(e) for e in spec.env]  # e.g. HF_ENDPOINT, proxies
    names = {e["name"] for e in user}
    env = [e for e in cache_env() if e["name"] not in names] + user
    env.append({"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"})
    r = spec.resources
    container: dict[str, Any] = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(command),
        "args": download_args(spec) if args is None else args,
        "env": env,
        "resources": {
            "requests": {"cpu": r.cpu, "memory": r.memory},
            "limits": {"memory": r.memory_limit or r.memory},
        },
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": VOLUME, "mountPath": MODEL_CACHE_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.model_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.model_secret}}]
    return container


def add_model_download(
    pod_spec: dict[str, Any], spec: InferenceServiceSpec, readers: tuple[str, ...]
) -> None:
    """For a remote model: add the cache volume, the download init container (first, before
    any other init container) and, to the containers named in `readers` (init or not), the
    read-only mount and the offline switch. Nothing for other models. Needs a `tmp` volume."""
    if not spec.model.remote:
        return
    pod_spec.setdefault("volumes", []).append(cache_volume(spec))
    pod_spec["initContainers"] = [download_container(spec), *pod_spec.get("initContainers", [])]
    add_cache_readers(pod_spec, readers)


def add_cache_readers(pod_spec: dict[str, Any], readers: tuple[str, ...]) -> None:
    """The containers named in `readers` (init or not) get the cache read-only and offline."""
    for container in (*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])):
        if container["name"] in readers:
            container.setdefault("volumeMounts", []).append(
                {"name": VOLUME, "mountPath": MODEL_CACHE_MOUNT, "readOnly": True}
            )
            added = [dict(OFFLINE_ENV), {"name": DOWNLOAD_DIR_ENV, "value": MODEL_CACHE_MOUNT}]
            names = {e["name"] for e in added}
            env = [e for e in container.get("env", []) if e["name"] not in names]
            container["env"] = [*env, *added]


@dataclass(frozen=True)
class Links:
    """An init container running SCRIPT: each download into the cache, linked by name in the
    pod's own emptyDir `volume`, mounted at `mount` (the container's too)."""

    container: str
    volume: str
    mount: str


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
ADAPTER_LINKS = Links("adapter-download", "adapters", ADAPTERS_MOUNT)
# An hf:// or s3:// draft model (spec.engine.speculative.model, method draftModel): fetched by
# the `draft-download` init container as the adapters are (SCRIPT), its download linked at
# DRAFT_MOUNT/DRAFT_LINK in the pod's own `draft-model` emptyDir: the path the server's
# `--speculative-config` names (children/serve_args.py), whatever commit the download landed in.
DRAFT_LINKS = Links("draft-download", "draft-model", DRAFT_MOUNT)


def links_container(spec: InferenceServiceSpec, links: Links, pairs: list[str]) -> dict[str, Any]:
    """`links`' init container: SCRIPT's arguments ($0, the cache, the links' folder, then
    `pairs`, NAME URI each) and the links' volume mounted."""
    limit = spec.model_cache.size_limit_bytes
    script = SCRIPT.format(limit=f" --download-size-limit {limit}" if limit else "")
    args = [links.container, MODEL_CACHE_MOUNT, links.mount, *pairs]
    container = download_container(spec, links.container, ("sh", "-c", script), args)
    container["volumeMounts"].append({"name": links.volume, "mountPath": links.mount})
    return container


def adapter_pairs(spec: InferenceServiceSpec) -> list[str]:
    """NAME URI per remote adapter; an hf:// branch as pinned (reconcile/model_pin.py): every
    replica fetches the same commit."""
    return [w for a in spec.adapters if a.remote for w in (a.name, a.source.pinned_uri)]


def add_adapter_download(
    pod_spec: dict[str, Any], spec: InferenceServiceSpec, readers: tuple[str, ...]
) -> None:
    """For hf:// or s3:// adapters: the cache volume (unless the model's download added it), the
    links' emptyDir, the `adapter-download` init container (after `model-download`, before any
    other), and to the containers in `readers` the cache read-only and the links. Nothing
    otherwise."""
    if any(a.remote for a in spec.adapters):
        _add_links(pod_spec, spec, readers, ADAPTER_LINKS, adapter_pairs(spec))


def add_draft_download(
    pod_spec: dict[str, Any], spec: InferenceServiceSpec, readers: tuple[str, ...]
) -> None:
    """For an hf:// or s3:// draft model: the `draft-download` init container (after
    `model-download`), its links' emptyDir, the cache; to `readers` the cache read-only and the
    link. Nothing otherwise. An hf:// branch is fetched as pinned (reconcile/model_pin.py)."""
    draft = spec.engine.draft
    if draft is not None and draft.remote:
        _add_links(pod_spec, spec, readers, DRAFT_LINKS, [DRAFT_LINK, draft.pinned_uri])


def _add_links(
    pod_spec: dict[str, Any],
    spec: InferenceServiceSpec,
    readers: tuple[str, ...],
    links: Links,
    pairs: list[str],
) -> None:
    """`links`' init container after `model-download`, before any other init container; its
    emptyDir, and the cache (unless the model's download added it); to `readers` the cache
    read-only and the links."""
    volumes = pod_spec.setdefault("volumes", [])
    if not any(v["name"] == VOLUME for v in volumes):
        volumes.append(cache_volume(spec))
        new_readers = readers  # the model's download has not mounted the cache for them
    else:
        new_readers = ()
    volumes.append({"name": links.volume, "emptyDir": {}})
    init = pod_spec.get("initContainers", [])
    first = 1 if init and init[0]["name"] == INIT_CONTAINER else 0
    container = links_container(spec, links, pairs)
    pod_spec["initContainers"] = [*init[:first], container, *init[first:]]
    add_cache_readers(pod_spec, new_readers)
    mount = {"name": links.volume, "mountPath": links.mount, "readOnly": True}
    for reader in (*pod_spec["initContainers"], *pod_spec.get("containers", [])):
        if reader["name"] in readers:
            reader.setdefault("volumeMounts", []).append(dict(mount))
