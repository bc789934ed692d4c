"""What a tuned profile is measured for, and which GPU products a service can land on. Pure.

A key is everything that changes what `pagoda tune` measures: the GPU product, the model (as
`pagoda serve --model` sees it, which is what the profile records), the engine settings that
change shapes (dtype, attention backend, block size, max model length, FP8 weights and KV cache),
the runtime image (other
kernels, other engine) and the targets the scheduler knobs are chosen for. Services with equal
keys in one namespace share one profile and one Job.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.names import GPU_RESOURCE

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA's GPU feature discovery
PROFILE_PREFIX = "pagoda-tuned-"  # the ConfigMap
JOB_PREFIX = "pagoda-tune-"  # the Job, its ServiceAccount, Role and RoleBinding
HASH_LEN = 12


@dataclass(frozen=True)
class TuneKey:
    product: str
    model: str  # `pagoda tune/serve --model`
    model_uri: str  # spec.model (decides the volume)
    dtype: str
    attention_backend: str
    block_size: int
    max_model_len: int | None
    image: str
    ttft_target_s: float
    itl_target_s: float
    # FP8 weights / KV change the shapes and kernels swept (the FP8 GEMM, the FP8-cache
    # attention); at their defaults they stay out of the digest, so existing profiles keep
    # their names
    quantization: str | None = None
    kv_cache_dtype: str = "auto"

    @property
    def digest(self) -> str:
        fields = asdict(self)
        for name, unset in (("quantization", None), ("kv_cache_dtype", "auto")):
            if fields[name] == unset:
                del fields[name]
        raw = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()[:HASH_LEN]

    @property
    def profile_name(self) -> str:
        return PROFILE_PREFIX + self.digest

    @property
    def job_name(self) -> str:
        return JOB_PREFIX + self.digest

    def describe(self) -> str:
        fp8 = [f"{n} fp8" for n, v in (("quantization", self.quantization),
                                       ("kv", self.kv_cache_dtype)) if v == "fp8"]  # fmt: skip
        return (
            f"{self.product} / {self.model_uri} / {self.dtype}"
            f"{f' / max_model_len {self.max_model_len}' if self.max_model_len else ''}"
            f"{''.join(f' / {x}' for x in fp8)}"
        )


def key_for(spec: InferenceServiceSpec, product: str) -> TuneKey:
    e, t = spec.engine, spec.autotune
    return TuneKey(
        product=product,
        model=spec.model.server_arg,
        model_uri=spec.model.uri,
        dtype=e.dtype,
        attention_backend=e.attention_backend,
        block_size=e.block_size,
        max_model_len=e.max_model_len,
        image=spec.image,
        ttft_target_s=t.ttft_target_s,
        itl_target_s=t.itl_target_s,
        quantization=e.quantization,
        kv_cache_dtype=e.kv_cache_dtype,
    )


def _gpus(node: Mapping[str, Any]) -> int:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
    try:
        return int(str(raw))
    except ValueError:
        return 0


def products_for(spec: InferenceServiceSpec, nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """GPU products the service's pods can land on, sorted.

    A product pinned by `spec.nodeSelector` is the answer even before such a node exists (the Job
    waits for one like the serving pods do). Otherwise: every product label among the nodes that
    match the whole nodeSelector and have enough allocatable GPUs.
    """
    selector = dict(spec.node_selector)
    if PRODUCT_LABEL in selector:
        return [selector[PRODUCT_LABEL]]
    need = max(1, spec.resources.gpus)
    found = set()
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        product = labels.get(PRODUCT_LABEL)
        if product and _gpus(node) >= need and all(labels.get(k) == v for k, v in selector.items()):
            found.add(product)
    return sorted(found)


@dataclass(frozen=True)
class SeenProducts:
    """What the autotuner remembers of one service's node-derived GPU products between passes."""

    last_seen: Mapping[str, float] = field(default_factory=dict)  # in use → last pass seen
    first_seen: Mapping[str, float] = field(default_factory=dict)  # new, not in use → since
    checked: float | None = None  # the pass that last saved it (`checked_at`)


def checked_at(before: float | None, now: float, refresh_s: float) -> float:
    """When the saved memory was last confirmed by a pass: `before`, renewed by the pass at
    `now` once `refresh_s` old. Every pass after the saved time came before it plus `refresh_s`,
    so an operator that starts after all were down knows the last pass within `refresh_s`
    (`load_seen`) at one status write per `refresh_s`."""
    return now if before is None or now - before >= refresh_s else before


def steady_products(
    memory: SeenProducts, seen: Iterable[str], now: float, grace_s: float
) -> tuple[list[str], SeenProducts]:
    """The products to tune and mount for, given the ones the nodes show this pass (`seen`).

    A node's product label can blink: GPU feature discovery restarting, a node relabelled, a
    node pool scaled to zero and back. A product in use stays for `grace_s` after the nodes last
    showed it, and a product new beside those in use counts once the nodes have shown it for
    `grace_s` without a gap, so a blink neither unmounts a profile nor starts a Job for a GPU type
    that is not there. With nothing in use (a new service, an operator restart, or every product
    gone for the grace) the nodes' products count at once.
    """
    seen = set(seen)
    used = {p: t for p, t in memory.last_seen.items() if now - t <= grace_s}
    used.update((p, now) for p in seen if p in used)
    new = {p: memory.first_seen.get(p, now) for p in seen if p not in used}
    if not used:
        used, new = dict.fromkeys(new, now), {}
    for p, since in list(new.items()):
        if now - since >= grace_s:
            used[p] = now
            del new[p]
    return sorted(used), SeenProducts(used, new)


# --- saved in status.autotune.nodeProducts, read back by an operator that takes over ----------

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def selection(spec: InferenceServiceSpec) -> str:
    """What selects the service's nodes, as a digest: a saved memory of another is not read."""
    raw = json.dumps([sorted(spec.node_selector), spec.resources.gpus], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:HASH_LEN]


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(TIME_FORMAT)


def _epoch(raw: Any) -> float:
    parsed = datetime.datetime.strptime(str(raw), TIME_FORMAT)
    return parsed.replace(tzinfo=datetime.timezone.utc).timestamp()


def dump_seen(memory: SeenProducts, now: float, where: str) -> dict[str, Any] | None:
    """`memory` after the pass at `now` (wall-clock s) as status.autotune.nodeProducts; None
    when it holds nothing. A product in use that this pass saw has no time (it changes only
    when the products do, not with each pass); one the nodes stopped showing keeps the last
    pass that saw it, a new one the pass since which the nodes show it."""
    if not memory.last_seen and not memory.first_seen:
        return None
    out: dict[str, Any] = {"selection": where}
    if memory.checked is not None:
        out["checked"] = _iso(memory.checked)
    if memory.last_seen:
        out["inUse"] = [{"product": p, **({} if t >= now else {"lastSeen": _iso(t)})}
                        for p, t in sorted(memory.last_seen.items())]  # fmt: skip
    if memory.first_seen:
        out["new"] = [
            {"product": p, "since": _iso(t)} for p, t in sorted(memory.first_seen.items())
        ]
    return out


def load_seen(
    raw: Any, where: str, last_pass: float, refresh_s: float = float("inf")
) -> SeenProducts | None:
    """The memory `dump_seen` saved for the node selection `where`; a product in use seen by the
    saving process's last pass counts as seen then: `last_pass` (the pass before this one: a
    take-over), but no later than `refresh_s` after the saved `checked` (a pass after that would
    have renewed it: the operator was away, all replicas down, and the nodes were not looked at
    since; a product that went meanwhile ends its grace as it would have without the restart).
    None: absent, saved for another selection, or unreadable (the nodes' products then count at
    once)."""
    if not isinstance(raw, Mapping) or raw.get("selection") != where:
        return None
    try:
        checked = _epoch(raw["checked"]) if raw.get("checked") else None
        if checked is not None:  # saved to the second: + 1 s, never earlier than it was
            last_pass = max(checked, min(last_pass, checked + 1.0 + refresh_s))
        used = {
            str(e["product"]): _epoch(e["lastSeen"]) if e.get("lastSeen") else last_pass
            for e in raw.get("inUse") or ()
        }
        new = {str(e["product"]): _epoch(e["since"]) for e in raw.get("new") or ()}
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return SeenProducts(used, new, checked)
