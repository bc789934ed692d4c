"""The contract with the runtime as the operator renders it: a spec → the `pagoda serve` command line.

Pure. `server_args` is what the Deployment's container runs; `engine_config` is the effective
configuration recorded in the ConfigMap (and hashed into the pod template, so a change rolls the
pods). tests/operator/test_serve_args_contract.py parses every rendered command line with the real
`pagoda serve` parser.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.config import SERVER_PORT
from pagoda.operator.spec import InferenceServiceSpec


def server_args(spec: InferenceServiceSpec) -> list[str]:
    """The full `pagoda serve` argument list for this spec."""
    return [
        "--model", spec.model.server_arg,
        "--served-model-name", spec.served_model_name,
        "--host", "0.0.0.0",
        "--port", str(SERVER_PORT),
        "--drain-timeout", str(spec.drain_timeout_seconds),
        *spec.engine.server_args(),
    ]  # fmt: skip


def engine_config(spec: InferenceServiceSpec) -> dict[str, Any]:
    """The effective engine configuration recorded in the ConfigMap (and hashed into the pods)."""
    e = spec.engine
    return {
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
