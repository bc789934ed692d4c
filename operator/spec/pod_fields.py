"""What the spec puts into the pods, checked before anything downstream refuses it or is misled.

* node selector labels, tolerations and env vars, as the API server checks the pods: the CRD's
  schema and CEL rules say the same (crds/inferenceservice.yaml); without these checks the API
  server would refuse the Deployment (`ChildRejected`) and the service would never start;
* engine.extraArgs against the `pagoda serve` flags the operator renders from other fields: they
  come last on the command line and argparse lets the last value win, so such a flag would
  silently override its field (the ConfigMap records one value, the pod runs another) or move the
  port the probes and the Service use;
* the Secrets the pods read: `apiKeySecretRef` (a Secret's name and key) and `modelSecretRef`
  (a Secret's name), named as the API server takes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagoda.operator.kube.names import LORA_FLAGS, is_label_key, is_label_value
from pagoda.operator.spec.fields import SpecError, mapping, opt_str, show
from pagoda.runtime import option_rules, options

MAX_EXTRA_ARGS, MAX_EXTRA_ARG = 64, 1024
MAX_SECRET_FIELD = 253
DEFAULT_API_KEY_KEY = "api-key"
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def node_selector(spec: Mapping[str, Any]) -> Mapping[str, str]:
    """spec.nodeSelector: label keys to label values."""
    node_selector = mapping(spec, "nodeSelector", "spec")
    if not all(isinstance(v, str) for v in node_selector.values()):
        raise SpecError("InvalidSpec", "spec.nodeSelector values must be strings")
    for k, v in node_selector.items():  # the API server's label rules, or it refuses the pods
        if not is_label_key(k):
            raise SpecError("InvalidSpec", f"spec.nodeSelector: {show(k)} is not a label key")
        if not is_label_value(v):
            raise SpecError(
                "InvalidSpec",
                f"spec.nodeSelector.{k}: {show(v)} is not a label value (at most 63 letters, "
                "digits, '-', '_', '.', starting and ending alphanumeric)",
            )
    return node_selector


def omit_empty(obj: Any) -> Any:
    """`obj` without the keys whose value is an empty string, at every depth. The API server
    stores an empty optional string field (an env var's `value: ""`, a toleration's `effect: ""`)
    as absent (`omitempty`), so a child built with one would never read back in sync and be
    patched on every reconcile; absent means the same (an empty variable, every effect)."""
    if isinstance(obj, Mapping):
        return {k: omit_empty(v) for k, v in obj.items() if v != ""}
    if isinstance(obj, list):
        return [omit_empty(v) for v in obj]
    return obj


def _list_of_objects(spec: Mapping[str, Any], key: str, max_items: int) -> list[Mapping[str, Any]]:
    value = [] if spec.get(key) is None else spec[key]
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise SpecError("InvalidSpec", f"spec.{key} must be a list of objects")
    if len(value) > max_items:
        raise SpecError("InvalidSpec", f"spec.{key} has {len(value)} items (at most {max_items})")
    return value


def tolerations(spec: Mapping[str, Any], max_items: int) -> list[Mapping[str, Any]]:
    """The CRD's rules on tolerations, which are the API server's on the pods it would reject."""
    tolerations = _list_of_objects(spec, "tolerations", max_items)
    for i, t in enumerate(tolerations):
        p = f"spec.tolerations[{i}]"
        _toleration_types(t, p)
        exists = t.get("operator") == "Exists"
        if not t.get("key") and not exists:
            raise SpecError(
                "InvalidSpec",
                f"{p}: a toleration without a key must have operator Exists (it tolerates every taint)",
            )
        if exists and t.get("value"):
            raise SpecError(
                "InvalidSpec", f"{p}: a toleration with operator Exists must not set a value"
            )
        key, value = t.get("key") or "", t.get("value") or ""
        if key and not is_label_key(key):
            raise SpecError("InvalidSpec", f"{p}.key: {show(key)} is not a label key")
        if value and not is_label_value(value):
            raise SpecError("InvalidSpec", f"{p}.value: {show(value)} is not a label value")
        if "tolerationSeconds" in t and t.get("effect") != "NoExecute":
            raise SpecError("InvalidSpec", f"{p}: tolerationSeconds needs effect NoExecute")
    return [omit_empty(t) for t in tolerations]


_TOLERATION_CHOICES = {"operator": ("Exists", "Equal"),
                       "effect": ("", "NoSchedule", "PreferNoSchedule", "NoExecute")}  # fmt: skip


def _toleration_types(t: Mapping[str, Any], p: str) -> None:
    """The fields' types and enums (the CRD's; without them the API server refuses the pods)."""
    for field in ("key", "operator", "value", "effect"):
        if t.get(field) is not None and not isinstance(t[field], str):
            raise SpecError("InvalidSpec", f"{p}.{field} must be a string, got {show(t[field])}")
    for field, allowed in _TOLERATION_CHOICES.items():
        if t.get(field) is not None and t[field] not in allowed:
            raise SpecError(
                "InvalidSpec",
                f"{p}.{field} must be one of {', '.join(a for a in allowed if a)}, "
                f"got {show(t[field])}",
            )
    seconds = t.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise SpecError(
            "InvalidSpec", f"{p}.tolerationSeconds must be an integer, got {show(seconds)}"
        )


_ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")


def env(spec: Mapping[str, Any], max_items: int, max_name: int) -> list[Mapping[str, Any]]:
    env = _list_of_objects(spec, "env", max_items)
    for item in env:
        name = item.get("name")
        if not isinstance(name, str) or len(name) > max_name or not _ENV_NAME.match(name):
            raise SpecError("InvalidSpec", f"spec.env: invalid variable name {show(name)}")
        if item.get("value") is not None and not isinstance(item["value"], str):
            raise SpecError(  # `value: 1` in YAML: the API server refuses a number
                "InvalidSpec",
                f"spec.env: {name}: value must be a string, got {show(item['value'])} (quote it)",
            )
        source = item.get("valueFrom")
        if source is None:
            continue
        if item.get("value"):
            raise SpecError("InvalidSpec", f"spec.env: {name} sets value or valueFrom, not both")
        if not isinstance(source, Mapping) or sum(k in source for k in _ENV_SOURCES) != 1:
            raise SpecError(
                "InvalidSpec",
                f"spec.env: {name}: valueFrom must set exactly one of {', '.join(_ENV_SOURCES)}",
            )
        for ref in _ENV_SOURCES:
            if ref in source and not isinstance(source[ref], Mapping):
                raise SpecError(
                    "InvalidSpec",
                    f"spec.env: {name}: valueFrom.{ref} must be an object, got {show(source[ref])}",
                )
        for ref in ("secretKeyRef", "configMapKeyRef"):
            for key in ("name", "key"):  # both required (the CRD's and the API server's rule)
                if ref in source and not source[ref].get(key):
                    raise SpecError(
                        "InvalidSpec", f"spec.env: {name}: valueFrom.{ref}.{key} is required"
                    )
    return [omit_empty(item) for item in env]


# `pagoda serve` flags the operator renders itself (children/serve_args.py; a test checks this
# covers every one), with the field that sets each: in engine.extraArgs they would silently win
# over that field (argparse: last one wins), or move the port the probes and Service use.
OPERATOR_FLAGS: Mapping[str, str] = {
    "model": "spec.model",
    "served_model_name": "spec.servedModelName",
    "host": "the operator (the pod's address)",
    "port": f"the operator (the Service and probes use {options.DEFAULT_PORT})",
    "drain_timeout": "spec.drainTimeoutSeconds",
    **{
        dest: f"spec.engine.{option_rules.camel(dest)}"
        for dest in (
            "dtype",
            "block_size",
            "kv_cache_dtype",
            "quantization",
            "enable_prefix_caching",
            "enable_chunked_prefill",
            "attention_backend",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "max_queue_len",
            "long_prefill_token_threshold",
            "runner",
            "pooler_config",
        )
    },
    "speculative_config": "spec.engine.speculative",
    "limit_mm_per_prompt": "spec.engine.limitMMPerPrompt",
    "mm_processor_kwargs": "spec.engine.mmProcessorKwargs",
    "enable_lora": "spec.adapters",
    "lora_modules": "spec.adapters",
    "max_loras": "spec.engine.lora.maxLoras",
    "max_lora_rank": "spec.engine.lora.maxLoraRank",
    "max_cpu_loras": "spec.engine.lora.maxCpuLoras",
    "download_dir": "spec.modelCache",
    "revision": "spec.model (hf://ORG/NAME@REVISION; the operator pins a branch or tag to its "
    "commit itself)",
    "tensor_parallel_size": "spec.parallelism.tensorParallelSize",
    "nnodes": "spec.parallelism.nodes",
    # not rendered, but a key on the command line shows in the pod spec and the ConfigMap's record
    "api_key": "spec.apiKeySecretRef (a Secret, kept off the command line)",
    "master_addr": "the operator (the group's leader)",
    "node_rank": "the operator (the pod's index in its group)",
}


def flag_dest(word: str) -> str | None:
    """The `pagoda serve` flag an argv word sets, as argparse resolves it (exact name, `--no-`
    form, `--name=value`, or an unambiguous prefix); None for values and unknown words."""
    if not word.startswith("--"):
        return None
    word = word.split("=", 1)[0]
    flags = {**LORA_FLAGS, **options.SERVE_FLAGS}  # vLLM's LoRA flags, in the runtime or not
    names = {f.name: d for d, f in flags.items()}
    names |= {"--no-" + f.name[2:]: d for d, f in flags.items() if f.kind == "bool"}
    if word in names:
        return names[word]
    found = {d for name, d in names.items() if name.startswith(word)}
    return found.pop() if len(found) == 1 else None


def extra_args(engine: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """`engine.extraArgs`: a list of at most MAX_EXTRA_ARGS strings of at most MAX_EXTRA_ARG
    characters; SpecError naming the field to set when a word sets an operator-owned flag."""
    extra = [] if engine.get("extraArgs") is None else engine["extraArgs"]
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise SpecError("InvalidSpec", f"{path}.extraArgs must be a list of strings")
    if len(extra) > MAX_EXTRA_ARGS or any(len(a) > MAX_EXTRA_ARG for a in extra):
        raise SpecError(
            "InvalidSpec",
            f"{path}.extraArgs: at most {MAX_EXTRA_ARGS} items of at most {MAX_EXTRA_ARG} characters",
        )
    for word in extra:
        dest = flag_dest(word)
        if dest in OPERATOR_FLAGS:
            owner = OPERATOR_FLAGS[dest]
            hint = "; set that field instead" if owner.startswith("spec.") else ""
            raise SpecError(
                "InvalidSpec", f"{path}.extraArgs: {word.split('=', 1)[0]} is set by {owner}{hint}"
            )
    return tuple(extra)


def sets_flag(extra: Sequence[str], dest: str) -> bool:
    """Whether an extraArgs word turns the switch `dest` on (its `--no-` form does not)."""
    return any(flag_dest(a) == dest and not a.startswith("--no-") for a in extra)


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = DEFAULT_API_KEY_KEY


def _named_secret(spec: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], str | None] | None:
    """`spec[key]`, an object naming a Secret, and its `name` (None: not given); None when the
    field is absent or null."""
    ref = spec.get(key)
    if ref is None:
        return None
    if not isinstance(ref, Mapping):
        raise SpecError("InvalidSpec", f"spec.{key} must be an object, got {show(ref)}")
    return ref, opt_str(ref, "name", f"spec.{key}", max_len=MAX_SECRET_FIELD)


def secret_ref(spec: Mapping[str, Any]) -> SecretKeyRef | None:
    """`spec.apiKeySecretRef`: a Secret's name and key (default DEFAULT_API_KEY_KEY)."""
    found = _named_secret(spec, "apiKeySecretRef")
    if found is None:
        return None
    (secret, name), p = found, "spec.apiKeySecretRef"
    if not name:
        raise SpecError("InvalidSpec", f"{p}.name is required")
    if not DNS1123_SUBDOMAIN.match(name):
        raise SpecError("InvalidSpec", f"{p}.name must be a Secret's name, got {show(name)}")
    key = opt_str(secret, "key", p, max_len=MAX_SECRET_FIELD) or DEFAULT_API_KEY_KEY
    if not _SECRET_KEY.match(key):
        raise SpecError(
            "InvalidSpec",
            f"{p}.key must be a Secret key (letters, digits, '-', '_', '.'), got {show(key)}",
        )
    return SecretKeyRef(name, key)


def model_secret(spec: Mapping[str, Any]) -> str | None:
    """`spec.modelSecretRef`: the name of the Secret the download containers get as env."""
    found = _named_secret(spec, "modelSecretRef")
    if found is None:
        return None
    name = found[1]
    if not name or not DNS1123_SUBDOMAIN.match(name):
        raise SpecError(
            "InvalidSpec", f"spec.modelSecretRef.name must be a Secret's name, got {show(name)}"
        )
    return name
