"""The ConfigMap `NAME-config`: the effective engine configuration and the exact command line.

Its hash is the pod template's `serving.pagoda.dev/config-hash` annotation, so an engine change
rolls the pods. Pure.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.operator.children.owner import adopt, child
from pagoda.operator.children.serve_args import engine_config
from pagoda.operator.kube.names import config_map_name

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec


def build_config_map(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    obj = child(owner, "ConfigMap", "v1", config_map_name(owner.name))
    cfg = engine_config(spec)
    obj["data"] = {
        "engine.json": json.dumps(cfg, indent=2, sort_keys=True) + "\n",
        "serve-args": shlex.join(["pagoda", "serve", *cfg["args"]]) + "\n",
    }
    if "workerArgs" in cfg:  # a multi-node group's workers (the leader's line is serve-args)
        obj["data"]["worker-serve-args"] = (
            shlex.join(["pagoda", "serve", *cfg["workerArgs"]]) + "\n"
        )
    return adopt(obj, owner)


def config_hash(config_map: Mapping[str, Any]) -> str:
    """A short stable hash of a ConfigMap's data; put in the pod template to roll on change."""
    raw = json.dumps(config_map.get("data") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
