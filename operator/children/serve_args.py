"""The contract with the runtime as the operator renders it: a spec → the `pagoda serve` command line.

Pure. Flag names, how each is written (`--x`/`--no-x`, lists) and the probe paths come from
`pagoda.runtime.options`, the torch-free module `pagoda serve` builds its parser from, so the
two cannot drift; tests/operator/test_serve_args_contract.py parses every rendered command line
with the real parser. `engine_config` is the effective configuration recorded in the ConfigMap
(and hashed into the pod template, so a change rolls the pods).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.names import (
    ADAPTERS_MOUNT,
    DRAFT_LINK,
    DRAFT_MOUNT,
    LORA_FLAGS,
    LWS_LEADER_ADDRESS_ENV,
    LWS_WORKER_INDEX_ENV,
    MODEL_CACHE_MOUNT,
    SERVER_PORT,
    WORKER,
)
from pagoda.runtime import options
from pagoda.runtime.option_rules import camel

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec
    from pagoda.operator.spec.model_ref import Adapter, ModelRef

BIND_HOST = "0.0.0.0"  # the pod's address, not loopback (the runtime's default)


def serve_values(spec: InferenceServiceSpec, role: str | None = None) -> dict[str, Any]:
    """`pagoda serve` flag values by destination name; None leaves the runtime's default.

    `role`: a multi-node group's `worker` pods also get their node rank (the leader's is 0).
    """
    e = spec.engine
    return {
        "model": spec.model.server_arg,
        "served_model_name": [spec.served_model_name],
        "host": BIND_HOST,
        "port": SERVER_PORT,
        "drain_timeout": spec.drain_timeout_seconds,
        "dtype": e.dtype,
        "block_size": e.block_size,
        "kv_cache_dtype": _kv_cache_dtype_if_set(spec),
        "quantization": e.quantization,  # None (unset) renders nothing
        "enable_prefix_caching": e.enable_prefix_caching,
        "enable_chunked_prefill": e.enable_chunked_prefill,
        "attention_backend": e.attention_backend,
        "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens,
        "max_model_len": e.max_model_len,
        "max_queue_len": e.max_queue_len,
        "long_prefill_token_threshold": e.long_prefill_token_threshold,  # None: nothing
        # vLLM's JSON, bounds filled in, a draft model's path in the pod (None: off, nothing)
        "speculative_config": speculative_json(spec),
        "runner": e.runner,  # None (unset) renders nothing
        # vLLM's JSON of the keys set (`PoolerConfig.parse` reads it back); None: nothing
        "pooler_config": None if (pc := e.pooler_config) is None else json.dumps(pc.user_keys()),
        # vLLM's JSON of the images a prompt may hold (None: the runtime's default, nothing)
        "limit_mm_per_prompt": _limit_mm_json(e.limit_mm_per_prompt),
        # vLLM's JSON of the image processor's settings (None: the checkpoint's, nothing)
        "mm_processor_kwargs": _processor_kwargs_json(e.mm_processor_kwargs),
        # hf:// and s3:// only (None otherwise, so other services' config hashes do not change)
        "download_dir": MODEL_CACHE_MOUNT if spec.model.remote else None,
        "revision": spec.model.commit,  # an hf:// branch's pin (None: not pinned, no flag)
        **parallel_values(spec, role),
    }


def _limit_mm_json(images: int | None) -> str | None:
    return None if images is None else json.dumps({"image": images})


def _processor_kwargs_json(pairs: tuple[tuple[str, int | bool], ...] | None) -> str | None:
    return None if pairs is None else json.dumps(dict(pairs))


def parallel_values(spec: InferenceServiceSpec, role: str | None = None) -> dict[str, Any]:
    """The tensor-parallel flags, rendered only when used (one rank changes no command line).

    In a LeaderWorkerSet group every pod meets at the leader, whose address LWS's pod webhook puts
    in each container's env (`$(VAR)` in args is expanded by the kubelet from it), as is each
    worker's index in the group, its node rank.
    """
    tp = spec.tensor_parallel_size
    out: dict[str, Any] = {"tensor_parallel_size": tp if tp > 1 else None}
    if spec.multi_node:
        out["nnodes"] = spec.parallelism.nodes
        out["master_addr"] = f"$({LWS_LEADER_ADDRESS_ENV})"
        out["node_rank"] = f"$({LWS_WORKER_INDEX_ENV})" if role == WORKER else None
    return out


def speculative_json(spec: InferenceServiceSpec) -> str | None:
    """`--speculative-config`: vLLM's JSON, with a draft model's `model` where the pod reads it
    (`draft_path`) rather than its URI; None without spec.engine.speculative."""
    e = spec.engine
    if e.speculative is None:
        return None
    if e.draft is None:
        return e.speculative.to_json()
    return dataclasses.replace(e.speculative, model=draft_path(e.draft)).to_json()


def draft_path(draft: ModelRef) -> str:
    """Where the server reads the draft model: a downloaded one's link in the `draft-model`
    volume (children/model_cache.py), else its built-in name, its path on spec.model's claim
    or in the image."""
    if draft.remote:
        return f"{DRAFT_MOUNT}/{DRAFT_LINK}"
    return draft.server_arg


def adapter_path(adapter: Adapter) -> str:
    """Where the server reads an adapter's PEFT directory: a downloaded one's link in the
    `adapters` volume (children/model_cache.py), else its path on spec.model's claim or in the image."""
    if adapter.remote:
        return f"{ADAPTERS_MOUNT}/{adapter.name}"
    return adapter.source.server_arg


def lora_values(spec: InferenceServiceSpec) -> dict[str, Any]:
    """vLLM's LoRA flags by destination name, defaults filled in (spec/model_ref.py); empty
    without spec.adapters (no flag rendered, no config hash changed)."""
    if not spec.adapters:
        return {}
    loras, rank, cpu = spec.lora_values()
    return {
        "enable_lora": True,
        "max_loras": loras,
        "max_lora_rank": rank,
        "max_cpu_loras": cpu,
        "lora_modules": [f"{a.name}={adapter_path(a)}" for a in spec.adapters],
    }


def server_args(spec: InferenceServiceSpec, role: str | None = None) -> list[str]:
    """The full `pagoda serve` argument list for this spec (`engine.extraArgs` last, as is)."""
    lora = [w for d, v in lora_values(spec).items() for w in LORA_FLAGS[d].render(v)]
    return [*options.render_args(serve_values(spec, role)), *lora, *spec.engine.extra_args]


def engine_config(spec: InferenceServiceSpec) -> dict[str, Any]:
    """The effective engine configuration recorded in the ConfigMap (and hashed into the pods)."""
    e = spec.engine
    out: dict[str, Any] = {
        "model": spec.model.uri,
        "modelPath": spec.model.server_arg,
        "servedModelName": spec.served_model_name,
        "dtype": e.dtype,
        "blockSize": e.block_size,
        "enablePrefixCaching": e.enable_prefix_caching,
        "enableChunkedPrefill": e.enable_chunked_prefill,
        "attentionBackend": e.attention_backend,
        "maxNumSeqs": e.max_num_seqs,
        "maxNumBatchedTokens": e.max_num_batched_tokens,
        "maxModelLen": e.max_model_len,
        "maxQueueLen": e.max_queue_len,
        "drainTimeoutSeconds": spec.drain_timeout_seconds,
        "args": server_args(spec),
    }
    if spec.model.commit is not None:
        out["modelCommit"] = spec.model.commit
    if (kv_cache_dtype := _kv_cache_dtype_if_set(spec)) is not None:
        out["kvCacheDtype"] = kv_cache_dtype
    if e.quantization is not None:  # only when set, as kvCacheDtype (config hashes stay)
        out["quantization"] = e.quantization
    if e.long_prefill_token_threshold is not None:  # likewise
        out["longPrefillTokenThreshold"] = e.long_prefill_token_threshold
    if e.runner is not None:  # likewise
        out["runner"] = e.runner
    if e.pooler_config is not None:  # likewise; the keys set, camelCase
        out["poolerConfig"] = {camel(k): v for k, v in e.pooler_config.user_keys().items()}
    if e.limit_mm_per_prompt is not None:  # likewise
        out["limitMMPerPrompt"] = {"image": e.limit_mm_per_prompt}
    if e.mm_processor_kwargs is not None:  # likewise; the processor's own key names
        out["mmProcessorKwargs"] = dict(e.mm_processor_kwargs)
    if (sc := e.speculative) is not None and e.draft is None:  # likewise; camelCase, bounds
        out["speculative"] = {
            "method": sc.method,
            "numSpeculativeTokens": sc.num_speculative_tokens,
            "promptLookupMax": sc.prompt_lookup_max,
            "promptLookupMin": sc.prompt_lookup_min,
        }
    elif sc is not None:  # a draft model: a new source or re-pin rolls the pods
        out["speculative"] = {
            "method": "draftModel",
            "numSpeculativeTokens": sc.num_speculative_tokens,
            "model": e.draft.uri,
        } | ({"modelCommit": e.draft.commit} if e.draft.commit else {})
    if spec.adapters:  # likewise; a new source rolls the pods even where the path stays
        out["adapters"] = [
            {"name": a.name, "source": a.source.uri}
            | ({"commit": a.source.commit} if a.source.commit else {})  # a re-pin rolls the pods
            for a in spec.adapters
        ]
        loras, rank, cpu = spec.lora_values()
        out["lora"] = {"maxLoras": loras, "maxLoraRank": rank, "maxCpuLoras": cpu}
    if spec.tensor_parallel_size > 1:
        out["tensorParallelSize"] = spec.tensor_parallel_size
    if spec.multi_node:
        out["nodes"] = spec.parallelism.nodes
        out["workerArgs"] = server_args(spec, WORKER)
    return out


def _kv_cache_dtype_if_set(spec: InferenceServiceSpec) -> str | None:
    """Flags added after the first release render only when set: a new flag in every pod's
    command line would change every config hash, and an operator upgrade would roll all pods."""
    value = spec.engine.kv_cache_dtype
    return None if value == options.DEFAULT_KV_CACHE_DTYPE else value
